// LeaseTable: which lease an address is in, found without a lock. The
// current leases are published as an immutable array sorted by base; a
// change publishes a new array and keeps the old ones until the table goes,
// since a reader that loaded one a moment ago may still be searching it.
//
// Invariants: Find() sees one whole published set, never a half-written
// one; Publish() calls are serialized by the caller.
#ifndef GPUMEMD_CLIENT_LIB_POOL_LEASE_TABLE_H_
#define GPUMEMD_CLIENT_LIB_POOL_LEASE_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "client/lib/pool/lease.h"

namespace gpumem {
namespace client {

class LeaseTable {
 public:
  LeaseTable() = default;
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // The published lease that holds `p`, or null. Any thread.
  Lease* Find(uintptr_t p) const {
    const Snapshot* s = current_.load(std::memory_order_acquire);
    if (s == nullptr || s->base.empty()) return nullptr;
    auto it = std::upper_bound(s->base.begin(), s->base.end(), p);
    if (it == s->base.begin()) return nullptr;
    Lease* lease = s->lease[(it - s->base.begin()) - 1];
    return lease->Contains(p) ? lease : nullptr;
  }

  // Makes `leases` (any order, not overlapping) the current set.
  void Publish(std::vector<Lease*> leases);

 private:
  struct Snapshot {
    std::vector<uintptr_t> base;  // sorted
    std::vector<Lease*> lease;
  };
  std::atomic<const Snapshot*> current_{nullptr};
  std::vector<std::unique_ptr<const Snapshot>> published_;  // every one, oldest first
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_LEASE_TABLE_H_
