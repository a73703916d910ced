// DeviceCarver: the one thing placement asks of the memory below it — "carve
// this block on that device, or tell me why not" — and the undo.
//
// Placement decides where; a carver does the carving (the pool, behind the
// ledger's quota check). Keeping the interface this small lets placement be
// tested against a fake pool and lets the service compose quota, pool and
// backend however it likes.
//
// What an implementation must guarantee:
//  - TryCarve either carves exactly one block of `size` bytes, aligned to
//    `alignment` (a power of two), on `device` and returns it, or carves
//    nothing.
//  - A refusal ("this device cannot hold it") is RESOURCE_EXHAUSTED with
//    *refusal filled in and refusal->refused set: the reason, and the
//    device's free and largest-free figures at that moment, for the caller's
//    error message. Placement then moves on to the next device.
//  - Any other error (the device or the pool failed) is returned as is,
//    with refusal->refused left false; placement stops, releases what it
//    carved for the request and returns that error. That includes a real
//    out-of-memory from the driver (RESOURCE_EXHAUSTED, but not a refusal:
//    it is never reported as capacity or fragmentation).
//  - Release(block) returns a block TryCarve gave, exactly once, restoring
//    the device to what it would be had the block never been carved.
//  - A carver is called from one thread per request; if requests run
//    concurrently, it synchronises itself.
#ifndef GPUMEMD_SERVER_PLACEMENT_CARVER_H_
#define GPUMEMD_SERVER_PLACEMENT_CARVER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

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

// Why a device refused a block.
struct CarveRefusal {
  enum class Reason {
    kCapacity,       // fewer free bytes than asked for
    kFragmentation,  // enough free bytes in total, no range holds the block
    kQuota,          // the tenant may not use more here
  };
  // Set by TryCarve when it refuses; a failure without it is an error.
  bool refused = false;
  Reason reason = Reason::kCapacity;
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  std::string detail;  // optional words, e.g. which quota refused
};

class DeviceCarver {
 public:
  virtual ~DeviceCarver() = default;

  // The block, or RESOURCE_EXHAUSTED with *refusal set, or another error.
  // `refusal` is never null.
  virtual absl::StatusOr<CarvedBlock> TryCarve(uint32_t device, uint64_t size,
                                               uint64_t alignment,
                                               CarveRefusal* refusal) = 0;

  // Undoes a TryCarve that succeeded.
  virtual void Release(const CarvedBlock& block) = 0;
};

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_CARVER_H_
