// Policy ordering: the order in which placement tries the devices of a
// resolved placement, given the load snapshot. Invariants: stages keep
// their order (stage 0, then each fallback), only the devices within a
// stage are reordered, and the result holds exactly the devices of the
// stages, each once; the order is total and deterministic: every tie is
// broken by the lower device index, so equal snapshots give equal orders.
#ifndef GPUMEMD_SERVER_PLACEMENT_POLICY_ORDER_H_
#define GPUMEMD_SERVER_PLACEMENT_POLICY_ORDER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/placement/device_view.h"
#include "server/placement/resolve.h"

namespace gpumem {
namespace placement {

// The devices of one stage in the order to try them. `near` is used only by
// POLICY_NEAR. Every index must be valid in `snapshot`.
//  - POLICY_LEAST_LOADED: most free bytes first.
//  - POLICY_PACK: most used bytes first, so one device fills up before the
//    next one is touched and the others stay free for big blocks.
//  - POLICY_NEAR: by peer distance to the `near` device (itself, then NVLink
//    neighbours, then devices reached through the host), and within one
//    distance least loaded first.
std::vector<uint32_t> OrderStage(absl::Span<const uint32_t> stage,
                                 gpumem::v1::PlacementRequest::Policy policy,
                                 std::optional<uint32_t> near,
                                 const DeviceSnapshot& snapshot);

// Every stage of `placement` ordered by its policy, concatenated: the
// candidates in the order placement tries them.
std::vector<uint32_t> CandidateOrder(const ResolvedPlacement& placement,
                                     const DeviceSnapshot& snapshot);

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_POLICY_ORDER_H_
