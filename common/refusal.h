// Refusal: why a device would not hold a block, in one type from the layer
// that refused (the quota book, a slab pool, a carver) through placement to
// the wire (common/refusal_payload.h builds the gpumem.v1.DeviceRefusal from
// it, in one place).
#ifndef GPUMEMD_COMMON_REFUSAL_H_
#define GPUMEMD_COMMON_REFUSAL_H_

#include <cstdint>
#include <string>

namespace gpumem {

// Why, in one word. The order is the counters' (daemon_counters.h).
enum class RefusalReason {
  kCapacity,       // fewer free bytes than asked for
  kFragmentation,  // enough free bytes in total, no range holds the block
  kQuota,          // the tenant may not use more here (its quota, or its
                   // footprint budget in slabs)
  kOther,          // any other error (counters and metrics only)
};

struct Refusal {
  // Set by the one that refuses; a failure without it is an error.
  bool refused = false;
  RefusalReason reason = RefusalReason::kCapacity;
  uint32_t device = 0;
  uint64_t asked_bytes = 0;
  // What the tenant could reach on the device: free bytes and the largest
  // block (for a quota, its headroom there; 0 when the count limit refused).
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  // The refusal in words, naming the device or the quota: the message of
  // the status that goes with it.
  std::string message;
  // Optional words for the wire's DeviceRefusal.detail, e.g. which quota
  // refused; empty where the reason and the figures say it all.
  std::string detail;
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_REFUSAL_H_
