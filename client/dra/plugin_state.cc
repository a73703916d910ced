// The file: {"version": 1, "sliceGeneration": N, "claims": {uid: {...}}}.
#include "client/dra/plugin_state.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/dra/atomic_file.h"

namespace gpumem {
namespace dra {
namespace {

using nlohmann::json;

json ToJson(const PreparedClaim& c) {
  json devices = json::array();
  for (const PreparedDevice& d : c.devices) {
    devices.push_back({{"request", d.request},
                       {"pool", d.pool},
                       {"device", d.device},
                       {"uuid", d.uuid},
                       {"bytes", d.bytes}});
  }
  return {{"phase", c.phase == PreparedClaim::Phase::kPrepared ? "prepared" : "preparing"},
          {"namespace", c.ns},
          {"name", c.name},
          {"uid", c.uid},
          {"tenant", c.tenant},
          {"socketDir", c.socket_dir},
          {"socket", c.socket},
          {"cdiSpec", c.cdi_spec},
          {"cdiDevice", c.cdi_device},
          {"devices", devices}};
}

PreparedClaim FromJson(const json& j) {  // throws json::exception on a bad shape
  PreparedClaim c;
  const std::string phase = j.at("phase").get<std::string>();
  if (phase != "prepared" && phase != "preparing") throw std::invalid_argument("phase " + phase);
  c.phase = phase == "prepared" ? PreparedClaim::Phase::kPrepared : PreparedClaim::Phase::kPreparing;
  c.ns = j.at("namespace").get<std::string>();
  c.name = j.at("name").get<std::string>();
  c.uid = j.at("uid").get<std::string>();
  c.tenant = j.at("tenant").get<std::string>();
  c.socket_dir = j.at("socketDir").get<std::string>();
  c.socket = j.at("socket").get<std::string>();
  c.cdi_spec = j.at("cdiSpec").get<std::string>();
  c.cdi_device = j.at("cdiDevice").get<std::string>();
  for (const json& d : j.at("devices")) {
    c.devices.push_back({d.at("request").get<std::string>(), d.at("pool").get<std::string>(),
                         d.at("device").get<std::string>(), d.at("uuid").get<std::string>(),
                         d.at("bytes").get<uint64_t>()});
  }
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PluginState>> PluginState::Load(const std::string& path) {
  std::unique_ptr<PluginState> state(new PluginState(path));
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (absl::IsNotFound(text.status())) return state;
  if (!text.ok()) return text.status();
  try {
    const json j = json::parse(*text);
    if (j.at("version").get<int>() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": state file version ", j.at("version").dump(), " is not 1"));
    }
    absl::MutexLock l(&state->mu_);
    state->slice_generation_ = j.at("sliceGeneration").get<int64_t>();
    for (const auto& [uid, claim] : j.at("claims").items()) {
      PreparedClaim c = FromJson(claim);
      if (c.uid != uid) throw std::invalid_argument("claim key " + uid + " is not its uid");
      state->claims_[uid] = std::move(c);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a gpumemd-dra state file (", e.what(),
        "); it lists the claims this plugin prepared: repair or remove it by hand"));
  }
  return state;
}

std::optional<PreparedClaim> PluginState::Find(const std::string& uid) const {
  absl::MutexLock l(&mu_);
  auto it = claims_.find(uid);
  if (it == claims_.end()) return std::nullopt;
  return it->second;
}

std::vector<PreparedClaim> PluginState::All() const {
  absl::MutexLock l(&mu_);
  std::vector<PreparedClaim> out;
  for (const auto& [uid, c] : claims_) out.push_back(c);
  return out;
}

absl::Status PluginState::Put(const PreparedClaim& claim) {
  absl::MutexLock l(&mu_);
  auto old = claims_.find(claim.uid);
  std::optional<PreparedClaim> previous;
  if (old != claims_.end()) previous = old->second;
  claims_[claim.uid] = claim;
  absl::Status s = SaveLocked();
  if (!s.ok()) {  // memory stays what the file says
    if (previous) claims_[claim.uid] = *previous; else claims_.erase(claim.uid);
  }
  return s;
}

absl::Status PluginState::Remove(const std::string& uid) {
  absl::MutexLock l(&mu_);
  auto it = claims_.find(uid);
  if (it == claims_.end()) return absl::OkStatus();
  PreparedClaim previous = it->second;
  claims_.erase(it);
  absl::Status s = SaveLocked();
  if (!s.ok()) claims_[uid] = std::move(previous);
  return s;
}

int64_t PluginState::slice_generation() const {
  absl::MutexLock l(&mu_);
  return slice_generation_;
}

absl::Status PluginState::SetSliceGeneration(int64_t generation) {
  absl::MutexLock l(&mu_);
  const int64_t previous = slice_generation_;
  slice_generation_ = generation;
  absl::Status s = SaveLocked();
  if (!s.ok()) slice_generation_ = previous;
  return s;
}

absl::Status PluginState::SaveLocked() {
  json claims = json::object();
  for (const auto& [uid, c] : claims_) claims[uid] = ToJson(c);
  const json j = {{"version", 1}, {"sliceGeneration", slice_generation_}, {"claims", claims}};
  return WriteFileAtomically(path_, j.dump(2) + "\n", 0600);
}

}  // namespace dra
}  // namespace gpumem
