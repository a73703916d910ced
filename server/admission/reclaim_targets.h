// Memory pressure: which sessions are asked to give back idle leases when an
// Allocate is refused for room, and whether what they could give back would
// serve it.
//
// Only room can be given back: a device refused for its quota (or excluded)
// gains nothing from another session's leases, so only devices refused for
// capacity or fragmentation count. A session is asked when its last usage
// report shows idle leased bytes (leased > in use) and it holds memory on
// such a device; it counts as asked only if the request reached it (a live
// stream of it), since only those can answer.
#ifndef GPUMEMD_SERVER_ADMISSION_RECLAIM_TARGETS_H_
#define GPUMEMD_SERVER_ADMISSION_RECLAIM_TARGETS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/session/session_registry.h"

namespace gpumem {
namespace admission {

// Delivers a reclaim to session `session_id`; whether it reached it.
using ReclaimSender =
    std::function<bool(uint64_t session_id, const v1::ReclaimRequest& request)>;

// Whether a refusal names a device refused for room (capacity or
// fragmentation): what reclaims and fair waiting can help with.
bool RefusedForRoom(const absl::Status& refusal);

struct ReclaimAsked {
  std::vector<uint64_t> sessions;  // those the reclaim reached
  // Free bytes plus the leases of the sessions asked reach what the request
  // needs on some refused device.
  bool could_cover = false;
};
// Sends reclaims for a request of `requester` refused with `refusal`
// (`bytes_wanted` when the refusal does not say), through `sender` (called
// on this thread, for sessions of `sessions` other than the requester).
ReclaimAsked AskForReclaims(const ReclaimSender& sender, const SessionRegistry& sessions,
                            uint64_t requester, uint64_t bytes_wanted,
                            const absl::Status& refusal);

}  // namespace admission
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_ADMISSION_RECLAIM_TARGETS_H_
