// Resolution: turns the selectors of a PlacementRequest into the ordered
// stages of device indices placement may try, and nothing else.
//
// Invariants: every selector in every field (devices, exclude, each fallback
// set, near) names a device, or the answer is INVALID_ARGUMENT naming the
// field and the selector (`placement.fallback[1]: no device "7"; devices
// are 0..3`): nothing is silently ignored; the stages hold only devices the
// request named, minus `exclude`; no device is in two stages; the work is
// bounded for any request (kMaxFallbackSets and the limits beside it).
// Selectors: a decimal index ("0"), a device UUID matched without regard to
// case ("GPU-5f1c..."), or "all" (any case) for every device. `near` must
// name exactly one device, so "all" is refused there.
// The caller's view: when `visible_devices` names one of the devices, the
// stages hold only the devices it names (an empty set or "all" means those),
// and a selector of `devices` or a fallback set naming any other device is
// FAILED_PRECONDITION naming it. `exclude` and `near` may name any device.
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

// Bounded work for any request (checked before a selector is matched, so a
// hostile list costs one pass over its sizes): every list (devices,
// exclude, each fallback set) has at most MaxSelectorsPerList(devices)
// entries, at most kMaxFallbackSets fallback sets, every selector (and
// `near`) at most kMaxSelectorBytes bytes; one list naming a device twice
// ("0" and its UUID, or "all" and anything) is refused. Each refusal is
// INVALID_ARGUMENT naming the field, the limit and the count:
// `placement.devices: 400000 selectors, more than the limit of 16
// (max(4 x 2 devices, 16))`. A list of distinct devices never needs more
// than the device count; the slack is for clients that name a device both
// ways.
inline constexpr size_t kSelectorsPerDevice = 4;
inline constexpr size_t kMinSelectorsPerList = 16;
inline constexpr size_t kMaxFallbackSets = 8;
inline constexpr size_t kMaxSelectorBytes = 64;
// `visible_devices`: at most this many UUIDs (a process may see devices the
// daemon does not have, so the bound is not the daemon's device count).
inline constexpr size_t kMaxVisibleDevices = 256;

// max(kSelectorsPerDevice x device_count, kMinSelectorsPerList).
size_t MaxSelectorsPerList(size_t device_count);

struct ResolvedPlacement {
  // Stage 0 from `devices` (every device when empty), then one per fallback
  // set in order (every device when the set is empty); each minus `exclude`.
  // Disjoint: a device appears only in the first stage naming it, so no
  // device is tried twice. Within a stage, indices are ascending and unique
  // (the order to try them in is policy_order.h's business). A stage may be
  // empty.
  std::vector<std::vector<uint32_t>> stages;
  // Devices some stage named that `exclude` removed, ascending. Devices that
  // `exclude` names but no stage does are not listed: they were never
  // candidates.
  std::vector<uint32_t> excluded;
  // Never POLICY_UNSPECIFIED (it becomes POLICY_LEAST_LOADED); POLICY_NEAR
  // needs `near`, and `near` is refused with any other policy.
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
