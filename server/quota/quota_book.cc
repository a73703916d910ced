#include "server/quota/quota_book.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {
namespace quota {

void QuotaBook::SetQuota(uint32_t tenant, tenants::Quota quota) {
  absl::MutexLock lock(&mu_);
  quotas_[tenant] = std::move(quota);
}

tenants::Quota QuotaBook::GetQuota(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = quotas_.find(tenant);
  return it == quotas_.end() ? tenants::Quota{} : it->second;
}

TenantHoldings& QuotaBook::HoldingsLocked(uint32_t tenant) {
  TenantHoldings& h = holdings_[tenant];
  if (h.device_bytes.size() < device_count_) h.device_bytes.resize(device_count_);
  return h;
}

bool QuotaBook::TryCharge(uint32_t tenant, const std::string& tenant_name,
                          uint32_t device, uint64_t bytes, QuotaRefusal* refusal) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  auto q = quotas_.find(tenant);
  if (q != quotas_.end()) {
    const tenants::Quota& quota = q->second;
    const std::string who = absl::StrCat("tenant \"", tenant_name, "\" quota ");
    uint64_t headroom = UINT64_MAX;
    if (quota.total_bytes) {
      headroom = *quota.total_bytes > h.total_bytes ? *quota.total_bytes - h.total_bytes : 0;
    }
    if (std::optional<uint64_t> dev = quota.device_limit(device)) {
      const uint64_t held = h.device_bytes[device];
      headroom = std::min<uint64_t>(headroom, *dev > held ? *dev - held : 0);
    }
    if (quota.max_allocations && h.allocations + 1 > *quota.max_allocations) {
      refusal->headroom_bytes = 0;
      refusal->detail = absl::StrCat(who, "max_allocations ", *quota.max_allocations,
                                     ": ", h.allocations, " held");
      return false;
    }
    if (quota.total_bytes && bytes > *quota.total_bytes - std::min(h.total_bytes, *quota.total_bytes)) {
      refusal->headroom_bytes = headroom;
      refusal->detail = absl::StrCat(who, "total_bytes ", FormatBytes(*quota.total_bytes),
                                     ": ", FormatBytes(h.total_bytes), " held, ",
                                     FormatBytes(bytes), " asked");
      return false;
    }
    if (std::optional<uint64_t> dev = quota.device_limit(device)) {
      const uint64_t held = h.device_bytes[device];
      if (bytes > *dev - std::min(held, *dev)) {
        refusal->headroom_bytes = headroom;
        refusal->detail = absl::StrCat(who, "on device ", device, " ", FormatBytes(*dev),
                                       ": ", FormatBytes(held), " held, ",
                                       FormatBytes(bytes), " asked");
        return false;
      }
    }
  }
  h.total_bytes += bytes;
  h.device_bytes[device] += bytes;
  h.allocations += 1;
  return true;
}

void QuotaBook::Credit(uint32_t tenant, uint32_t device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  h.total_bytes -= std::min(h.total_bytes, bytes);
  h.device_bytes[device] -= std::min(h.device_bytes[device], bytes);
  if (h.allocations > 0) --h.allocations;
}

TenantHoldings QuotaBook::Holdings(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = holdings_.find(tenant);
  if (it != holdings_.end()) return it->second;
  TenantHoldings empty;
  empty.device_bytes.resize(device_count_);
  return empty;
}

}  // namespace quota
}  // namespace gpumem
