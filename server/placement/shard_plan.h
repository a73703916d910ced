// Shard plan: the blocks an AllocateRequest asks for, checked.
//
// What it guarantees: an OK plan has at least one size, every size > 0, a
// total that fits in 64 bits, a power-of-two alignment, and — for a sharded
// request — no more shards than the placement allows devices (shards go to
// distinct devices). Everything else is INVALID_ARGUMENT saying which field
// is wrong and why. It never allocates memory in proportion to an unchecked
// client number.
//
// The forms of a request:
//  - single: size_bytes > 0, no shard fields. One block.
//  - equal split: shard_count = N > 0 and size_bytes >= N: N shards of
//    size_bytes / N bytes, the last one also taking size_bytes % N.
//  - explicit: shard_sizes non-empty; shard_count, when set, must equal its
//    length, and size_bytes, when set, must equal its sum.
#ifndef GPUMEMD_SERVER_PLACEMENT_SHARD_PLAN_H_
#define GPUMEMD_SERVER_PLACEMENT_SHARD_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace placement {

struct ShardPlan {
  bool sharded = false;
  std::vector<uint64_t> sizes;  // one, or one per shard in shard order
  uint64_t total_bytes = 0;
  uint64_t alignment = 0;  // a power of two
};

// Checks `request` and lays out its blocks. `default_alignment` replaces an
// alignment of 0; `max_shards` is the number of devices the placement allows.
absl::StatusOr<ShardPlan> PlanShards(const gpumem::v1::AllocateRequest& request,
                                     uint64_t default_alignment,
                                     size_t max_shards);

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_SHARD_PLAN_H_
