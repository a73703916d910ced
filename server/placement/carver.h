// DeviceCarver: the one thing placement asks of the memory below it — "carve
// this block on that device, or tell me why not" — and the undo.
//
// Placement decides where; a carver does the carving. For one request of
// one tenant the core (MemoryBroker::Place) stacks the quota adaptor
// (quota/quota_carver.h) over the fair-waiting adaptor, when a waiter
// reserves (pool/reserving_carver.h), over PoolCarver, which carves from
// the tenant's slabs in the device pools (pool/device_pools.h); placement's
// tests use a fake (tests/placement/fake_carver.h). Keeping the interface
// this small lets each layer be tested alone and stacked as the core needs.
// A carver is called from one thread per request; if requests run
// concurrently, it synchronises itself.
#ifndef GPUMEMD_SERVER_PLACEMENT_CARVER_H_
#define GPUMEMD_SERVER_PLACEMENT_CARVER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/refusal.h"

namespace gpumem {
namespace placement {

// A block a carver made. Placement reads only `device` and `size_bytes`;
// the other fields are the carver's, carried back to the service.
struct CarvedBlock {
  uint32_t device = 0;
  uint64_t size_bytes = 0;
  uint64_t id = 0;  // carver-assigned; e.g. the allocation id
  uint64_t slab_id = 0;
  uint64_t offset = 0;
};

class DeviceCarver {
 public:
  virtual ~DeviceCarver() = default;

  // The block, or RESOURCE_EXHAUSTED with *refusal set, or another error.
  // `refusal` is never null. It either carves exactly one block of `size`
  // bytes, aligned to `alignment` (a power of two), on `device`, or carves
  // nothing. A refusal ("this device cannot hold it") has refusal->refused
  // set: the reason, and the free and largest-free figures at that moment,
  // for the caller's error message; placement then moves on to the next
  // device. Any other error (the device or the pool failed) is returned as
  // is, with refusal->refused left false; placement stops, releases what it
  // carved for the request and returns that error. That includes a real
  // out-of-memory from the driver (RESOURCE_EXHAUSTED, but not a refusal:
  // it is never reported as capacity or fragmentation).
  virtual absl::StatusOr<CarvedBlock> TryCarve(uint32_t device, uint64_t size,
                                               uint64_t alignment,
                                               Refusal* refusal) = 0;

  // Undoes a TryCarve that succeeded, exactly once, restoring the device to
  // what it would be had the block never been carved.
  virtual void Release(const CarvedBlock& block) = 0;
};

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_CARVER_H_
