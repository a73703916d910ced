#include "server/placement/shard_plan.h"

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace placement {
namespace {

absl::Status TooManyShards(size_t shards, size_t max_shards) {
  return absl::InvalidArgumentError(
      absl::StrCat(shards, " shards need ", shards,
                   " distinct devices; the placement allows ", max_shards));
}

}  // namespace

absl::StatusOr<ShardPlan> PlanShards(const gpumem::v1::AllocateRequest& request,
                                     uint64_t default_alignment,
                                     size_t max_shards) {
  ShardPlan plan;
  plan.alignment =
      request.alignment() == 0 ? default_alignment : request.alignment();
  if (!absl::has_single_bit(plan.alignment)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", plan.alignment, " is not a power of two"));
  }

  if (request.shard_sizes_size() > 0) {
    const size_t n = request.shard_sizes_size();
    if (request.shard_count() != 0 && request.shard_count() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard_count ", request.shard_count(),
                       " disagrees with the ", n, " entries of shard_sizes"));
    }
    if (n > max_shards) return TooManyShards(n, max_shards);
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t size = request.shard_sizes(i);
      if (size == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard_sizes[", i, "] is 0"));
      }
      if (size > UINT64_MAX - total) {
        return absl::InvalidArgumentError("shard_sizes add up past 2^64 bytes");
      }
      total += size;
    }
    if (request.size_bytes() != 0 && request.size_bytes() != total) {
      return absl::InvalidArgumentError(
          absl::StrCat("size_bytes ", request.size_bytes(),
                       " disagrees with the sum of shard_sizes, ", total));
    }
    plan.sharded = true;
    plan.sizes.assign(request.shard_sizes().begin(),
                      request.shard_sizes().end());
    plan.total_bytes = total;
    return plan;
  }

  if (request.size_bytes() == 0) {
    return absl::InvalidArgumentError("size_bytes must be > 0");
  }
  plan.total_bytes = request.size_bytes();
  if (request.shard_count() == 0) {
    plan.sizes.push_back(request.size_bytes());
    return plan;
  }
  const uint64_t n = request.shard_count();
  if (n > max_shards) return TooManyShards(n, max_shards);
  if (request.size_bytes() < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size_bytes ", request.size_bytes(), " cannot be split into ", n,
        " shards of at least one byte"));
  }
  const uint64_t base = request.size_bytes() / n;
  plan.sharded = true;
  plan.sizes.assign(n, base);
  plan.sizes.back() += request.size_bytes() % n;
  return plan;
}

}  // namespace placement
}  // namespace gpumem
