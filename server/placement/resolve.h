// Resolution: turns the selectors of a PlacementRequest into the ordered
// stages of device indices placement may try, and nothing else.
//
// What it guarantees:
//  - Every selector in every field (devices, exclude, each fallback set,
//    near) names a device, or the answer is INVALID_ARGUMENT naming the field
//    and the selector: `placement.fallback[1]: no device "7"; devices are
//    0..3`. Nothing is silently ignored.
//  - Strict: the stages hold only devices the request named. Stage 0 is
//    `devices` (every device when empty), then one stage per fallback set in
//    order (every device when the set is empty). A device outside every
//    stage is never tried.
//  - `exclude` is removed from every stage, fallbacks included.
//  - Stages are disjoint: a device appears only in the first stage naming it,
//    so no device is tried twice. Within a stage, indices are ascending and
//    unique; the order to try them in is policy_order.h's business.
//  - The policy is checked and normalised: POLICY_UNSPECIFIED becomes
//    POLICY_LEAST_LOADED; POLICY_NEAR needs `near`, and `near` is refused
//    with any other policy.
//
// Selectors: a decimal index ("0"), a device UUID matched without regard to
// case ("GPU-5f1c..."), or "all" (any case) for every device. `near` must
// name exactly one device, so "all" is refused there.
#ifndef GPUMEMD_SERVER_PLACEMENT_RESOLVE_H_
#define GPUMEMD_SERVER_PLACEMENT_RESOLVE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/placement/device_view.h"

namespace gpumem {
namespace placement {

struct ResolvedPlacement {
  // Stage 0 from `devices`, then one per fallback set; disjoint, each minus
  // `exclude`, ascending indices. A stage may be empty.
  std::vector<std::vector<uint32_t>> stages;
  // Devices some stage named that `exclude` removed, ascending. Devices that
  // `exclude` names but no stage does are not listed: they were never
  // candidates.
  std::vector<uint32_t> excluded;
  // Never POLICY_UNSPECIFIED.
  gpumem::v1::PlacementRequest::Policy policy =
      gpumem::v1::PlacementRequest::POLICY_LEAST_LOADED;
  // Set exactly when policy is POLICY_NEAR.
  std::optional<uint32_t> near;

  // Number of devices over all stages (they are disjoint).
  size_t allowed_device_count() const;
};

// Resolves `request` against `devices` (devices[i].index == i).
absl::StatusOr<ResolvedPlacement> ResolvePlacement(
    const gpumem::v1::PlacementRequest& request,
    absl::Span<const DeviceView> devices);

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_RESOLVE_H_
