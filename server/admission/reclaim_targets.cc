#include "server/admission/reclaim_targets.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/refusal_payload.h"

namespace gpumem {
namespace admission {

namespace {

bool ForRoom(const v1::DeviceRefusal& d) {
  return d.reason() == v1::DeviceRefusal::REASON_CAPACITY ||
         d.reason() == v1::DeviceRefusal::REASON_FRAGMENTATION;
}

}  // namespace

bool RefusedForRoom(const absl::Status& refusal) {
  std::optional<v1::PlacementRefusal> why = RefusalFromStatus(refusal);
  if (!why.has_value()) return false;
  for (const v1::DeviceRefusal& d : why->devices()) {
    if (ForRoom(d)) return true;
  }
  return false;
}

ReclaimAsked AskForReclaims(const ReclaimSender& sender, const SessionRegistry& sessions,
                            uint64_t requester, uint64_t bytes_wanted,
                            const absl::Status& refusal) {
  ReclaimAsked asked;
  if (!sender) return asked;
  std::optional<v1::PlacementRefusal> why = RefusalFromStatus(refusal);
  if (!why.has_value()) return asked;
  const uint64_t wanted = why->size_bytes() != 0 ? why->size_bytes() : bytes_wanted;
  v1::ReclaimRequest reclaim;
  reclaim.set_bytes_wanted(wanted);
  // Refused device -> bytes the requester could reach there now, then plus
  // the idle leases of the sessions asked.
  absl::flat_hash_map<uint32_t, uint64_t> reachable;
  for (const v1::DeviceRefusal& d : why->devices()) {
    if (ForRoom(d)) {
      reachable[d.device_index()] = d.free_bytes();
      reclaim.add_devices(d.device_index());
    }
  }
  if (reachable.empty()) return asked;
  std::vector<std::pair<uint64_t, Session::Figures>> targets;
  for (const std::shared_ptr<Session>& s : sessions.List()) {
    if (s->id() == requester) continue;
    Session::Figures f = s->figures();
    if (!f.usage.has_value() || f.usage->leased_bytes <= f.usage->in_use_bytes) continue;
    for (const auto& [device, bytes] : f.device_bytes) {
      if (reachable.contains(device)) {
        targets.emplace_back(s->id(), std::move(f));
        break;
      }
    }
  }
  for (const auto& [session, f] : targets) {
    if (!sender(session, reclaim)) continue;  // no stream: cannot answer
    asked.sessions.push_back(session);
    // What it could give back on each device: its leases, at most what it
    // holds there. (Its leased bytes, not leased - in use: a caching pool
    // reports with each lease it takes or gives back, so the blocks its
    // program freed since are counted in use still.)
    for (const auto& [device, bytes] : f.device_bytes) {
      auto it = reachable.find(device);
      if (it != reachable.end()) it->second += std::min(f.usage->leased_bytes, bytes);
    }
  }
  for (const auto& [device, bytes] : reachable) {
    if (!asked.sessions.empty() && bytes >= wanted) asked.could_cover = true;
  }
  return asked;
}

}  // namespace admission
}  // namespace gpumem
