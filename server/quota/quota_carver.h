// QuotaCarver: a DeviceCarver adaptor that enforces one tenant's quota around
// another carver (the pool's), RMM style: the allocator below stays
// policy-free. Invariants: at no moment does the book hold more than the
// quota, and every carved block is charged; a refused request never raises
// the tenant's peak. Like the carver below it, one adaptor serves one
// request on one thread.
#ifndef GPUMEMD_SERVER_QUOTA_QUOTA_CARVER_H_
#define GPUMEMD_SERVER_QUOTA_QUOTA_CARVER_H_

#include <string>

#include "server/placement/carver.h"
#include "server/quota/quota_book.h"

namespace gpumem {
namespace quota {

class QuotaCarver : public placement::DeviceCarver {
 public:
  // `inner` and `book` must outlive the adaptor.
  QuotaCarver(placement::DeviceCarver* inner, QuotaBook* book, uint32_t tenant,
              std::string tenant_name)
      : inner_(inner), book_(book), tenant_(tenant), tenant_name_(std::move(tenant_name)) {}

  // Charge, then carve: first charges the block to the tenant in the
  // QuotaBook (atomically with the limit check), then asks the inner
  // carver; if the inner carver refuses or fails, the charge is undone
  // (QuotaBook::Uncharge). A quota refusal is RESOURCE_EXHAUSTED with
  // refusal->refused set, RefusalReason::kQuota, the quota's headroom
  // as free bytes and the quota's figures in `detail`; placement then tries
  // the next device.
  absl::StatusOr<placement::CarvedBlock> TryCarve(uint32_t device, uint64_t size,
                                                  uint64_t alignment,
                                                  Refusal* refusal) override;
  // Hands the block back to the inner carver and undoes the charge
  // (QuotaBook::Uncharge).
  void Release(const placement::CarvedBlock& block) override;

  // The blocks carved and not released became allocations: their charges
  // are committed in the book (QuotaBook::Commit: the tenant's peak counts
  // from there). Nothing is left to commit after. Whoever frees such an
  // allocation later credits it (QuotaBook::Credit) with the block's device
  // and size_bytes.
  void Commit();

 private:
  placement::DeviceCarver* inner_;
  QuotaBook* book_;
  uint32_t tenant_;
  std::string tenant_name_;
  uint64_t uncommitted_bytes_ = 0;  // charged by this adaptor, not undone
};

}  // namespace quota
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_QUOTA_QUOTA_CARVER_H_
