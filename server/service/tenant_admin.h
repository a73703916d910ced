// TenantAdmin: the tenant RPCs (GetUsage, GetLedger, SetQuota) over the
// tenant directory, the quota book and the ledger.
//
// Who sees what (identity from the kernel, never a field):
//  - An administrator (root, or a member of --admin_group: the `is_admin`
//    the daemon passes) sees and may name every tenant; anyone else sees
//    only the tenant they are charged to (GetUsage lists only it; GetLedger
//    is limited to it, and naming another tenant is PERMISSION_DENIED).
//  - SetQuota is for administrators only (PERMISSION_DENIED otherwise). The new quota
//    replaces the old one whole, takes effect for the next carve, is recorded
//    as a QUOTA_SET event and in the ledger's quotas table, and lasts until
//    the daemon loads its config again (SIGHUP or restart). It names a
//    tenant of the directory in force (NOT_FOUND for a removed one).
//  - Each call reads the tenant directory in force once (it is replaced
//    by config reloads). "The caller's tenant" is the one that directory
//    gives its uid/gid now (a live session fixed to an earlier tenant
//    before a reload does not change that). GetUsage lists, for an administrator, the
//    configured tenants and the tenants a reload removed that still hold
//    allocations (their names, no priority, the quota still enforced on
//    them) until those are freed.
// Figures: current bytes and allocation counts come from the quota book (exact
// now); peak and byte-seconds from the ledger's fold of its events (at most
// one writer cycle, 100 ms, behind), over the ledger file's whole life.
// Thread-safe (every part it uses is).
#ifndef GPUMEMD_SERVER_SERVICE_TENANT_ADMIN_H_
#define GPUMEMD_SERVER_SERVICE_TENANT_ADMIN_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/ledger/tenant_ledger.h"
#include "server/placement/device_view.h"
#include "server/quota/quota_book.h"
#include "server/session/peer_credentials.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

class TenantAdmin {
 public:
  // Everything must outlive the admin. `quota_changed` runs after SetQuota
  // (the broker tries its waiters again).
  TenantAdmin(const tenants::TenantDirectoryHolder* directory, quota::QuotaBook* quotas,
              ledger::TenantLedger* ledger, std::vector<placement::DeviceView> devices,
              std::function<bool(const PeerCred&)> is_admin,
              std::function<void()> quota_changed)
      : directory_(directory), quotas_(quotas), ledger_(ledger),
        devices_(std::move(devices)), is_admin_(std::move(is_admin)),
        quota_changed_(std::move(quota_changed)) {}

  absl::StatusOr<v1::GetUsageResponse> GetUsage(const PeerCred& caller) const;
  absl::StatusOr<v1::GetLedgerResponse> GetLedger(const PeerCred& caller,
                                                  const v1::GetLedgerRequest& request) const;
  absl::StatusOr<v1::SetQuotaResponse> SetQuota(const PeerCred& caller,
                                                const v1::SetQuotaRequest& request);
  absl::StatusOr<v1::PutTenantResponse> PutTenant(const PeerCred& caller,
                                                  const v1::PutTenantRequest& request);
  absl::StatusOr<v1::DeleteTenantResponse> DeleteTenant(const PeerCred& caller,
                                                        const v1::DeleteTenantRequest& request);

 private:

  const tenants::TenantDirectoryHolder* directory_;
  quota::QuotaBook* quotas_;
  ledger::TenantLedger* ledger_;
  const std::vector<placement::DeviceView> devices_;
  std::function<bool(const PeerCred&)> is_admin_;
  std::function<void()> quota_changed_;
};

// The quota's words, e.g. "total_bytes 8.00 GiB; device 1 2.00 GiB;
// max_allocations 10" ("no limit" when unlimited).
std::string DescribeQuota(const tenants::Quota& quota);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_TENANT_ADMIN_H_
