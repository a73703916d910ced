// What a request ring's slot asks (RingSlot::kind), shared by the daemon's
// ring transport (server/service/ring_transport.h) and any client of it.
// The payload of each kind is one serialized protobuf message of
// proto/gpumem/v1/gpumem.proto, and so is a successful answer's; an answer
// with another status code carries the status message instead. Sharded
// allocations are AllocateRequests (shard_count, shard_sizes); the proto
// has no batched form. Numbers are never reused; 0 is no kind.
#ifndef GPUMEMD_COMMON_RING_RING_KINDS_H_
#define GPUMEMD_COMMON_RING_RING_KINDS_H_

#include <cstdint>

namespace gpumem {

enum RingKind : uint32_t {
  kRingAllocate = 1,  // AllocateRequest -> AllocateResponse
  kRingFree = 2,      // FreeRequest -> FreeResponse
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_RING_RING_KINDS_H_
