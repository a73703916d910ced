// Reads status.allocation.devices.results[] of a v1 ResourceClaim: request,
// driver, pool, device, adminAccess, consumedCapacity (KEP-5075).
#include "client/dra/claim.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/dra/quantity.h"

namespace gpumem {
namespace dra {
namespace {

using nlohmann::json;

std::string Name(const ClaimRef& r) { return absl::StrCat("claim ", r.ns, "/", r.name); }

// The string at j[key], or an INVALID_ARGUMENT naming where.
absl::StatusOr<std::string> StringField(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is missing"));
  }
  if (!j[key].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is not a string"));
  }
  return j[key].get<std::string>();
}

}  // namespace

absl::Status ValidateClaimRef(const ClaimRef& r) {
  if (r.ns.empty() || r.name.empty() || r.uid.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a claim needs namespace, name and uid (got \"", r.ns, "\", \"", r.name, "\", \"", r.uid,
        "\")"));
  }
  // Kubernetes UIDs are RFC 4122 strings; accept what a tenant name can hold.
  if (r.uid.size() > 63 - 6) {
    return absl::InvalidArgumentError(absl::StrCat("claim uid \"", r.uid, "\" is too long"));
  }
  for (char c : r.uid) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!(std::islower(u) || std::isdigit(u) || c == '-')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "claim uid \"", r.uid, "\" has characters other than a-z, 0-9 and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClaimAllocation> ParseClaim(const std::string& body, const ClaimRef& expected,
                                           const std::string& driver,
                                           const std::string& pool) {
  const std::string who = Name(expected);
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": the API server's answer is not a JSON object"));
  }
  auto bad = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(who, ": malformed ResourceClaim: ", s.message()));
  };
  if (j.contains("kind") && j["kind"] != "ResourceClaim") {
    return absl::InvalidArgumentError(absl::StrCat(who, ": the API server answered a ",
                                                   j["kind"].dump(), ", not a ResourceClaim"));
  }
  if (!j.contains("metadata")) return bad(absl::InvalidArgumentError("metadata is missing"));
  absl::StatusOr<std::string> uid = StringField(j["metadata"], "uid", "metadata");
  if (!uid.ok()) return bad(uid.status());
  if (*uid != expected.uid) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " now has uid ", *uid, ", the kubelet asked for ", expected.uid,
        " (the claim was deleted and created again)"));
  }
  const json* alloc = nullptr;
  if (j.contains("status") && j["status"].is_object() && j["status"].contains("allocation")) {
    alloc = &j["status"]["allocation"];
  }
  if (alloc == nullptr || alloc->is_null()) {
    return absl::FailedPreconditionError(absl::StrCat(who, " is not allocated"));
  }
  if (!alloc->is_object()) return bad(absl::InvalidArgumentError("status.allocation is not an object"));
  const json empty = json::array();
  const json* results = &empty;
  if (alloc->contains("devices")) {
    const json& devs = (*alloc)["devices"];
    if (!devs.is_object()) {
      return bad(absl::InvalidArgumentError("status.allocation.devices is not an object"));
    }
    if (devs.contains("results")) {
      if (!devs["results"].is_array()) {
        return bad(absl::InvalidArgumentError("status.allocation.devices.results is not a list"));
      }
      results = &devs["results"];
    }
  }
  ClaimAllocation out;
  out.ref = expected;
  for (size_t i = 0; i < results->size(); ++i) {
    const json& r = (*results)[i];
    const std::string where = absl::StrCat("status.allocation.devices.results[", i, "]");
    absl::StatusOr<std::string> d = StringField(r, "driver", where);
    if (!d.ok()) return bad(d.status());
    if (*d != driver) continue;
    AllocatedDevice a;
    for (auto [field, dst] : {std::pair<const char*, std::string*>{"request", &a.request},
                              {"pool", &a.pool},
                              {"device", &a.device}}) {
      absl::StatusOr<std::string> v = StringField(r, field, where);
      if (!v.ok()) return bad(v.status());
      if (v->empty()) return bad(absl::InvalidArgumentError(absl::StrCat(where, ".", field, " is empty")));
      *dst = *v;
    }
    if (a.pool != pool) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": ", where, " is in pool \"", a.pool, "\", this node's pool is \"", pool, "\""));
    }
    if (r.contains("adminAccess") && r["adminAccess"].is_boolean() && r["adminAccess"].get<bool>()) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": ", where, " asks for adminAccess, which gpumemd does not offer"));
    }
    if (r.contains("consumedCapacity") && !r["consumedCapacity"].is_null()) {
      const json& cc = r["consumedCapacity"];
      if (!cc.is_object()) {
        return bad(absl::InvalidArgumentError(absl::StrCat(where, ".consumedCapacity is not an object")));
      }
      for (const std::string& key : {std::string("memory"), driver + "/memory"}) {
        if (!cc.contains(key)) continue;
        if (!cc[key].is_string()) {
          return bad(absl::InvalidArgumentError(
              absl::StrCat(where, ".consumedCapacity[", key, "] is not a quantity string")));
        }
        absl::StatusOr<uint64_t> bytes = ParseQuantityBytes(cc[key].get<std::string>());
        if (!bytes.ok()) {
          return bad(absl::InvalidArgumentError(
              absl::StrCat(where, ".consumedCapacity[", key, "]: ", bytes.status().message())));
        }
        if (*bytes == 0) {
          return bad(absl::InvalidArgumentError(
              absl::StrCat(where, ".consumedCapacity[", key, "] is zero")));
        }
        a.bytes = *bytes;
      }
    }
    out.devices.push_back(std::move(a));
  }
  if (out.devices.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " has no devices allocated by driver ", driver));
  }
  return out;
}

}  // namespace dra
}  // namespace gpumem
