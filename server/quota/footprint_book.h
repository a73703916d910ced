// FootprintBook: the slab bytes held for each tenant on each device (its
// footprint), bounded by the tenant's quota: the SlabBudget the pools ask
// before they make or claim a slab for a tenant (server/pool/slab_budget.h).
// A slab belongs to one tenant for life, so what a tenant pins is its
// slabs' bytes, not only its live blocks: QuotaBook bounds the blocks, this
// book the slabs, so a tenant with a small quota cannot pin a device with
// small blocks in large slabs.
//
// Invariants: a tenant's footprint stays within its quota plus one slack
// (see TryTake), save what Take records; tenants without a byte quota are
// counted, never bounded. Thread-safe; its lock is a leaf (it never calls
// out), so pools may call it under their own locks.
#ifndef GPUMEMD_SERVER_QUOTA_FOOTPRINT_BOOK_H_
#define GPUMEMD_SERVER_QUOTA_FOOTPRINT_BOOK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/pool/slab_budget.h"
#include "server/tenants/tenant.h"

namespace gpumem {
namespace quota {

class FootprintBook final : public SlabBudget {
 public:
  explicit FootprintBook(uint32_t device_count) : device_count_(device_count) {}

  // The tenant's byte limits (its max_allocations plays no part here). For
  // the next TryTake; lowering takes nothing back.
  void SetLimits(uint32_t tenant, const tenants::Quota& quota);

  // SlabBudget.
  uint64_t Room(uint32_t tenant, uint32_t device, uint64_t slack) const override;
  // Checks and takes in one step under one lock, so concurrent carves on
  // different devices cannot both pass a limit only one fits under: the
  // footprint on a device stays within the per-device quota plus `slack`
  // (the device's granularity), and over all devices within total_bytes
  // plus one slack.
  bool TryTake(uint32_t tenant, uint32_t device, uint64_t bytes, uint64_t slack,
               std::string* why) override;
  // Whatever the limits say (slabs adopted after a restart; a quota lowered
  // since takes nothing back).
  void Take(uint32_t tenant, uint32_t device, uint64_t bytes) override;
  void Give(uint32_t tenant, uint32_t device, uint64_t bytes) override;

  // What the tenant's slabs hold on `device`, and over every device.
  uint64_t Footprint(uint32_t tenant, uint32_t device) const;
  uint64_t Footprint(uint32_t tenant) const;

 private:
  struct Entry {
    std::vector<uint64_t> device_bytes;
    uint64_t total_bytes = 0;
    tenants::Quota limits;
  };
  Entry& EntryLocked(uint32_t tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for `e` on `device`; *limit names the limit that sets it.
  uint64_t RoomLocked(const Entry& e, uint32_t device, uint64_t slack,
                      std::string* limit) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const uint32_t device_count_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, Entry> tenants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace quota
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_QUOTA_FOOTPRINT_BOOK_H_
