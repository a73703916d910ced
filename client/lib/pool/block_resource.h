// BlockResource: one layer of the caching pool, stacked the way RMM stacks
// memory resources. A layer serves what it can and passes the rest to the
// layer below it (its upstream, given at construction); nothing calls up.
// CachingPool composes the stack once, top to bottom:
//
//   ThreadCaches    which thread keeps a freed block for its next allocation
//   FreeQueue       when a freed block is safe to reuse (stream-ordered frees)
//   SizeClassCache  which block of which lease serves a request
//   LeaseSource     where memory comes from (the daemon)
//
// Invariant: a block Allocate returned comes back through Free at most once,
// to the same layer.
#ifndef GPUMEMD_CLIENT_LIB_POOL_BLOCK_RESOURCE_H_
#define GPUMEMD_CLIENT_LIB_POOL_BLOCK_RESOURCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/lib/pool/arena.h"
#include "client/lib/pool/block.h"

namespace gpumem {
namespace client {

class BlockResource {
 public:
  virtual ~BlockResource() = default;
  // A block of at least `size` (>= 1) bytes from `arena`'s devices.
  virtual absl::StatusOr<Block> Allocate(uint64_t size, const Arena& arena) = 0;
  // Takes back a block the program freed; `after` says when it may be reused.
  virtual absl::Status Free(Block block, const ReuseAfter& after) = 0;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_BLOCK_RESOURCE_H_
