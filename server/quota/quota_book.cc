#include "server/quota/quota_book.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {
namespace quota {

void QuotaBook::SetQuota(uint32_t tenant, tenants::Quota quota) {
  footprint_.SetLimits(tenant, quota);
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

void QuotaBook::SetRetainedSource(RetainedSource source) {
  absl::MutexLock lock(&mu_);
  retained_ = std::move(source);
}

bool QuotaBook::TryCharge(uint32_t tenant, const std::string& tenant_name,
                          uint32_t device, uint64_t bytes, Refusal* refusal) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  auto q = quotas_.find(tenant);
  if (q != quotas_.end()) {
    const tenants::Quota& quota = q->second;
    const std::string who = absl::StrCat("tenant \"", tenant_name, "\" quota ");
    const std::optional<uint64_t> dev_limit = quota.device_limit(device);
    // Retained bytes, asked only when a byte limit needs them.
    uint64_t retained_here = 0, retained_all = 0;
    if (retained_ && (quota.total_bytes || dev_limit)) {
      for (uint32_t d = 0; d < device_count_; ++d) {
        if (!quota.total_bytes && d != device) continue;
        const uint64_t r = retained_(tenant, d);
        retained_all += r;
        if (d == device) retained_here = r;
      }
    }
    const uint64_t held_all = h.total_bytes + retained_all;
    const uint64_t held_here = h.device_bytes[device] + retained_here;
    auto held_words = [&](uint64_t held, uint64_t retained) {
      std::string w = absl::StrCat(FormatBytes(held), " held");
      if (retained > 0) absl::StrAppend(&w, " (", FormatBytes(retained), " of it retained)");
      return w;
    };
    uint64_t headroom = UINT64_MAX;
    if (quota.total_bytes) {
      headroom = *quota.total_bytes > held_all ? *quota.total_bytes - held_all : 0;
    }
    if (dev_limit) headroom = std::min<uint64_t>(headroom, *dev_limit > held_here ? *dev_limit - held_here : 0);
    // The quota's headroom is what the tenant could reach here; the words
    // are the status message and the wire's detail both.
    auto refuse = [&](uint64_t headroom_bytes, std::string words) {
      refusal->refused = true;
      refusal->reason = RefusalReason::kQuota;
      refusal->device = device;
      refusal->asked_bytes = bytes;
      refusal->free_bytes = headroom_bytes;
      refusal->largest_free_bytes = headroom_bytes;
      refusal->message = words;
      refusal->detail = std::move(words);
      return false;
    };
    if (quota.max_allocations && h.allocations + 1 > *quota.max_allocations) {
      return refuse(0, absl::StrCat(who, "max_allocations ", *quota.max_allocations, ": ",
                                    h.allocations, " held"));
    }
    if (quota.total_bytes && bytes > *quota.total_bytes - std::min(held_all, *quota.total_bytes)) {
      return refuse(headroom, absl::StrCat(who, "total_bytes ", FormatBytes(*quota.total_bytes),
                                           ": ", held_words(held_all, retained_all), ", ",
                                           FormatBytes(bytes), " asked"));
    }
    if (dev_limit && bytes > *dev_limit - std::min(held_here, *dev_limit)) {
      return refuse(headroom, absl::StrCat(who, "on device ", device, " ",
                                           FormatBytes(*dev_limit), ": ",
                                           held_words(held_here, retained_here), ", ",
                                           FormatBytes(bytes), " asked"));
    }
  }
  h.total_bytes += bytes;
  h.device_bytes[device] += bytes;
  h.allocations += 1;
  h.pending_bytes += bytes;
  return true;
}

void QuotaBook::Charge(uint32_t tenant, uint32_t device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  h.total_bytes += bytes;
  h.device_bytes[device] += bytes;
  h.allocations += 1;
}

void QuotaBook::Credit(uint32_t tenant, uint32_t device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  h.total_bytes -= std::min(h.total_bytes, bytes);
  h.device_bytes[device] -= std::min(h.device_bytes[device], bytes);
  if (h.allocations > 0) --h.allocations;
  h.pending_bytes = std::min(h.pending_bytes, h.total_bytes);  // callers that never commit
}

void QuotaBook::Uncharge(uint32_t tenant, uint32_t device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  h.pending_bytes -= std::min(h.pending_bytes, bytes);
  h.total_bytes -= std::min(h.total_bytes, bytes);
  h.device_bytes[device] -= std::min(h.device_bytes[device], bytes);
  if (h.allocations > 0) --h.allocations;
}

void QuotaBook::Commit(uint32_t tenant, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  TenantHoldings& h = HoldingsLocked(tenant);
  h.pending_bytes -= std::min(h.pending_bytes, bytes);
  h.peak_total_bytes = std::max(h.peak_total_bytes, h.total_bytes - h.pending_bytes);  // pending <= total
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
