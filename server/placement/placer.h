// Placer: decides where an AllocateRequest's memory comes from and carves it,
// all or nothing.
//
// Invariants, for one call: arguments are checked before anything is carved
// (PrepareRequest); a block is only ever carved on a device of the named
// stages (`devices`, then each fallback set), never on an excluded one;
// sharded requests put each shard on a distinct device; a call that fails
// leaves every pool exactly as before it. A Placer holds no state of its
// own; calls may run concurrently when the carver allows it.
#ifndef GPUMEMD_SERVER_PLACEMENT_PLACER_H_
#define GPUMEMD_SERVER_PLACEMENT_PLACER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/placement/carver.h"
#include "server/placement/device_view.h"
#include "server/placement/resolve.h"
#include "server/placement/shard_plan.h"

namespace gpumem {
namespace placement {

struct PlacerOptions {
  // Used when a request's alignment is 0.
  uint64_t default_alignment = 256;
};

struct PlacementResult {
  // OK; INVALID_ARGUMENT; RESOURCE_EXHAUSTED (then `refusal` is set and the
  // status carries it as a payload, see refusal.h); or a carver's error.
  absl::Status status;
  // OK only: one block, or one per shard in shard order.
  std::vector<CarvedBlock> blocks;
  // RESOURCE_EXHAUSTED from placement only.
  std::optional<gpumem::v1::PlacementRefusal> refusal;

  bool ok() const { return status.ok(); }
};

// A request whose arguments have been checked: its resolved placement and
// its shard plan.
struct PreparedRequest {
  ResolvedPlacement placement;
  ShardPlan plan;
};

// Checks `request` against `devices` (only their indices and UUIDs are
// read): INVALID_ARGUMENT naming the bad field, or the prepared request.
// Checked: size, alignment, shard fields (shard_plan.h) and every selector
// of the placement (resolve.h). It needs no pool state, so a caller that
// serialises carving under a lock runs it before taking the lock and Place
// under it.
absl::StatusOr<PreparedRequest> PrepareRequest(
    const gpumem::v1::AllocateRequest& request,
    const std::vector<DeviceView>& devices, const PlacerOptions& options);

class Placer {
 public:
  // `carver` must outlive the Placer.
  explicit Placer(DeviceCarver* carver, PlacerOptions options = {});

  // PrepareRequest, then Place: checks `request` and places it on the
  // devices of `snapshot` (see device_view.h).
  PlacementResult Allocate(const gpumem::v1::AllocateRequest& request,
                           const DeviceSnapshot& snapshot) const;

  // Places a request PrepareRequest accepted for the same devices.
  //  - Stages are tried in order, and within a stage devices in policy order
  //    (policy_order.h); the first device that accepts a block gets it.
  //  - Shards are taken largest first, and each goes to the first device, in
  //    candidate order, not already used by the request that accepts it.
  //    When a device that accepts a block also accepts every smaller one,
  //    this greedy finds an assignment whenever one exists (the sets of
  //    devices able to hold each shard are nested, and Hall's condition
  //    reduces to counting). With least-loaded ordering the largest shard
  //    lands on the device with the most free bytes. If any shard finds no
  //    device, every shard already carved is released.
  //  - When no device can hold a block the result is RESOURCE_EXHAUSTED with
  //    a PlacementRefusal (refusal.h) listing every device considered with
  //    the reason it refused (capacity, fragmentation, quota), every device
  //    `exclude` removed from a stage, and for shards the devices holding
  //    other shards of the request. Devices outside every named set are not
  //    listed.
  //  - Any other carver error stops the call; carved shards are released and
  //    that error is returned.
  PlacementResult Place(const PreparedRequest& request,
                        const DeviceSnapshot& snapshot) const;

 private:
  DeviceCarver* carver_;
  PlacerOptions options_;
};

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_PLACER_H_
