// See tenant_budget.h.
#include "client/lib/tenant_budget.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {
namespace {

uint64_t Headroom(uint64_t limit, uint64_t held) { return limit > held ? limit - held : 0; }

}  // namespace

absl::StatusOr<MemInfo> TenantMemInfo(const v1::GetStatsResponse& stats,
                                      const v1::GetUsageResponse& usage,
                                      const v1::Session& session, uint32_t device,
                                      uint64_t own_idle_bytes) {
  const v1::DeviceStats* dev = nullptr;
  for (const v1::DeviceStats& d : stats.devices()) {
    if (d.index() == device) dev = &d;
  }
  if (dev == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " does not exist: the daemon has ", stats.devices_size(),
        " devices"));
  }
  uint64_t total = dev->total_bytes();
  uint64_t free = dev->free_bytes();
  // The caller's tenant: its quota and charges (GetUsage), its retained bytes
  // (GetStats' row, when it has one).
  const v1::TenantUsage* mine = nullptr;
  for (const v1::TenantUsage& t : usage.tenants()) {
    if (t.name() == session.tenant_name()) mine = &t;
  }
  if (mine != nullptr && mine->has_quota()) {
    uint64_t retained_all = 0, retained_here = 0;
    for (const v1::TenantStats& t : stats.tenants()) {
      if (!session.has_tenant() || t.tenant() != session.tenant()) continue;
      retained_all = t.retained_bytes();
      for (const v1::TenantDeviceStats& td : t.devices()) {
        if (td.device_index() == device) retained_here = td.retained_bytes();
      }
    }
    uint64_t charged_here = 0;
    for (const v1::DeviceUsage& du : mine->devices()) {
      if (du.device_index() == device) charged_here = du.current_bytes();
    }
    const v1::Quota& q = mine->quota();
    if (q.has_total_bytes()) {
      total = std::min(total, q.total_bytes());
      free = std::min(free, Headroom(q.total_bytes(), mine->current_bytes() + retained_all));
    }
    for (const v1::DeviceQuota& dq : q.devices()) {
      uint32_t index;
      if (!absl::SimpleAtoi(dq.device(), &index) || index != device || !dq.has_bytes()) continue;
      total = std::min(total, dq.bytes());
      free = std::min(free, Headroom(dq.bytes(), charged_here + retained_here));
    }
  }
  MemInfo out;
  out.total_bytes = total;
  out.free_bytes = std::min(total, free + own_idle_bytes);
  return out;
}

absl::StatusOr<MemInfo> PoolMemInfo(CachingPool* pool, uint32_t device) {
  absl::StatusOr<Client*> daemon = pool->Daemon();
  if (!daemon.ok()) return daemon.status();
  absl::StatusOr<v1::Session> session = (*daemon)->GetSession();
  if (!session.ok()) return session.status();
  absl::StatusOr<v1::GetUsageResponse> usage = (*daemon)->GetUsage();
  if (!usage.ok()) return usage.status();
  absl::StatusOr<v1::GetStatsResponse> stats = (*daemon)->GetStats(false);
  if (!stats.ok()) return stats.status();
  uint64_t idle = 0;
  for (const PoolStats::LeaseRow& r : pool->Stats().rows) {
    if (r.device == static_cast<int>(device) && r.bytes > r.used_bytes) idle += r.bytes - r.used_bytes;
  }
  return TenantMemInfo(*stats, *usage, *session, device, idle);
}

}  // namespace client
}  // namespace gpumem
