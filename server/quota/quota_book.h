// QuotaBook: what each tenant holds now, per device, against its quota.
//
// Invariants: a tenant's charged bytes (total, per device, retained bytes
// included) and allocation count never exceed its quota, not even for a
// moment (TryCharge checks and charges in one step under the book's lock);
// a refused charge changes nothing and says which limit refused, with the
// figures (limit, charged, asked); a refused request never raises a
// tenant's peak; lowering a quota below what a tenant holds takes nothing
// back, it only refuses further charges (SetQuota takes effect for the next
// charge). What a tenant's slabs pin is bounded by the same quota in
// footprint(). Tenants without a quota are still counted (GetUsage reports
// them). Thread-safe.
#ifndef GPUMEMD_SERVER_QUOTA_QUOTA_BOOK_H_
#define GPUMEMD_SERVER_QUOTA_QUOTA_BOOK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/refusal.h"
#include "server/quota/footprint_book.h"
#include "server/tenants/tenant.h"

namespace gpumem {
namespace quota {

struct TenantHoldings {
  uint64_t total_bytes = 0;
  std::vector<uint64_t> device_bytes;  // by device index
  uint64_t allocations = 0;
  // Of total_bytes, charges not yet committed (a carve in flight, see
  // Commit): total_bytes - pending_bytes is what the tenant holds.
  uint64_t pending_bytes = 0;
  // The most the tenant has held at once (committed charges; retained
  // bytes are the pool's) since the book was made. A charge counts from its
  // Commit (the allocation it paid for exists) until its Credit; a charge
  // undone with Uncharge (the carve failed, or the request placed none of
  // its blocks) never counts, so a refused request does not raise the peak.
  uint64_t peak_total_bytes = 0;
};

class QuotaBook {
 public:
  explicit QuotaBook(uint32_t device_count)
      : device_count_(device_count), footprint_(device_count) {}

  // The tenants' slab bytes against the same quotas (footprint_book.h):
  // the pools' budget. SetQuota sets its limits too.
  FootprintBook& footprint() { return footprint_; }
  const FootprintBook& footprint() const { return footprint_; }

  // Bytes `tenant` has retained on `device` now (slabs released while a
  // process may still hold their handle, server/pool/slab_pool.h): each byte
  // check adds it (and, for total_bytes, the sum over all devices) to the
  // tenant's charges. Called under the book's lock, so it must not call back
  // into the book.
  using RetainedSource = std::function<uint64_t(uint32_t tenant, uint32_t device)>;
  void SetRetainedSource(RetainedSource source);

  void SetQuota(uint32_t tenant, tenants::Quota quota);
  // nullopt-free copy; an unlimited Quota when none was set.
  tenants::Quota GetQuota(uint32_t tenant) const;

  // Charges `bytes` and one allocation on `device` to `tenant`, or refuses
  // (false, *refusal filled) when a limit would be passed: reason kQuota,
  // free and largest free bytes what the quota still allows on the device
  // (the smaller of the total and the per-device headroom; 0 when the count
  // limit refused), message and detail the same words, e.g.
  // "tenant \"ml\" quota total_bytes 8.00 GiB: 7.50 GiB held, 1.00 GiB asked".
  bool TryCharge(uint32_t tenant, const std::string& tenant_name, uint32_t device,
                 uint64_t bytes, Refusal* refusal);
  // Undoes a charge that was never committed (quota_carver.h's undo).
  void Uncharge(uint32_t tenant, uint32_t device, uint64_t bytes);
  // `bytes` of the tenant's charges now belong to committed allocations.
  void Commit(uint32_t tenant, uint64_t bytes);
  // Returns the charge of a committed allocation that was freed: undoes a
  // charge of the same figures exactly once; the caller keeps charges and
  // credits paired (quota_carver.h does for carves).
  void Credit(uint32_t tenant, uint32_t device, uint64_t bytes);
  // Charges an allocation that exists already, whatever the limits say (a
  // restart restoring what a tenant held: it was within its quota when it
  // was made, and a quota lowered since takes nothing back).
  void Charge(uint32_t tenant, uint32_t device, uint64_t bytes);

  TenantHoldings Holdings(uint32_t tenant) const;

 private:
  TenantHoldings& HoldingsLocked(uint32_t tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t device_count_;
  FootprintBook footprint_;  // its own lock, taken after mu_ or alone
  mutable absl::Mutex mu_;
  RetainedSource retained_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, tenants::Quota> quotas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, TenantHoldings> holdings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace quota
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_QUOTA_QUOTA_BOOK_H_
