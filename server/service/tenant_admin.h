// TenantAdmin: the tenant RPCs (GetUsage, GetLedger, SetQuota, PutTenant,
// DeleteTenant) over the tenant directory, the quota book and the ledger.
//
// Invariants: identity comes from the kernel, never a field; an
// administrator (root, or a member of --admin_group: the `is_admin` the
// daemon passes) sees and may name every tenant, anyone else only the
// tenant they are charged to; each call reads the tenant directory in force
// once (it is replaced by config reloads), and "the caller's tenant" is the
// one that directory gives its uid/gid now (a live session fixed to an
// earlier tenant before a reload does not change that); changes to the
// directory are serialized with reloads (TenantDirectoryHolder::changes()).
// Figures: current bytes and allocation counts come from the quota book
// (exact now); peak and byte-seconds from the ledger's fold of its events
// (at most one writer cycle behind), over the ledger file's whole life.
// Thread-safe (every part it uses is).
#ifndef GPUMEMD_SERVER_SERVICE_TENANT_ADMIN_H_
#define GPUMEMD_SERVER_SERVICE_TENANT_ADMIN_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/ledger/tenant_ledger.h"
#include "server/core/memory_broker.h"
#include "server/placement/device_view.h"
#include "server/quota/quota_book.h"
#include "server/service/tenant_socket_host.h"
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

  // Lists only the caller's tenant, or for an administrator the configured
  // tenants and the tenants a reload removed that still hold allocations
  // (their names, no priority, the quota still enforced on them) until
  // those are freed.
  absl::StatusOr<v1::GetUsageResponse> GetUsage(const PeerCred& caller) const;
  // Limited to the caller's tenant unless it is an administrator; naming
  // another tenant is PERMISSION_DENIED.
  absl::StatusOr<v1::GetLedgerResponse> GetLedger(const PeerCred& caller,
                                                  const v1::GetLedgerRequest& request) const;
  // Administrators only (PERMISSION_DENIED otherwise). The new quota
  // replaces the old one whole, takes effect for the next carve, is recorded
  // as a QUOTA_SET event and in the ledger's quotas table, and lasts until
  // the daemon loads its config again (SIGHUP or restart). It names a
  // tenant of the directory in force (NOT_FOUND for a removed one).
  absl::StatusOr<v1::SetQuotaResponse> SetQuota(const PeerCred& caller,
                                                const v1::SetQuotaRequest& request);
  // Socket tenants (PutTenant, DeleteTenant; root and the admin group only,
  // never a caller through a tenant's socket): a tenant bound to a socket of
  // its own, in a directory of its own inside tenant_socket_dir (the
  // socket's owner and group, passable only by those the socket lets
  // connect: SetTenantSocketAccess), so that every connection through it is
  // charged to it whatever the caller's uid or pid namespace. Tenants the
  // config defines are the config's: both refuse them (FAILED_PRECONDITION).
  //
  // PutTenant is idempotent: it makes the tenant (listed in the directory,
  // then its socket made, then its row committed to the ledger, each undone
  // if a later one fails) or updates its quota and priority (its socket
  // stays where it is; asking for another path is FAILED_PRECONDITION).
  // Who may connect to a tenant's socket is its file's owner, group and
  // mode (tenants::SocketAccess): from the config (TenantConfig.socket_uid,
  // socket_gid, socket_mode, or tenants::DefaultSocketAccess) or PutTenant
  // (socket_uid, socket_gid, socket_mode; none: root, 0666, for a socket
  // reached through a mount of its directory, as a DRA claim's). A socket
  // is root-only from the moment it appears until its access is set; a
  // reload or an update that changes the access changes the live socket's.
  // PutTenant's access is not in the ledger: a restored socket tenant's
  // socket is root-only (0600) until PutTenant gives it again.
  absl::StatusOr<v1::PutTenantResponse> PutTenant(const PeerCred& caller,
                                                  const v1::PutTenantRequest& request);
  // A tenant with live allocations is FAILED_PRECONDITION naming them
  // unless end_sessions is set; then (and always for its sessions holding
  // nothing) its sessions end, its memory returns, its waiters are
  // answered, its socket stops accepting and is removed, and the
  // connections through it are closed; then its ledger row goes. An unknown
  // name is existed = false.
  absl::StatusOr<v1::DeleteTenantResponse> DeleteTenant(const PeerCred& caller,
                                                        const v1::DeleteTenantRequest& request);

  // What socket tenants need; until set, PutTenant and DeleteTenant are
  // UNIMPLEMENTED. Everything must outlive the admin.
  struct SocketTenantParts {
    tenants::TenantDirectoryHolder* directory = nullptr;  // the one given above
    MemoryBroker* broker = nullptr;
    TenantSocketHost* sockets = nullptr;
    std::string socket_dir;  // tenant_socket_dir, normalized
  };
  void ServeSocketTenants(SocketTenantParts parts) { sockets_ = std::move(parts); }

  // Start: the ledger's socket tenants back in the directory, with their
  // quotas (before the broker restores what a previous daemon kept, whose
  // sessions may be theirs); their sockets are made by ServeRestoredSockets. One line per
  // tenant not restored, saying why, and per socket moved: one an earlier
  // gpumemd made directly in tenant_socket_dir moves into its tenant's own
  // directory (tenants::ResolveSocketPath of its file name), and its row
  // says so.
  std::vector<std::string> RestoreSocketTenants();
  // Start, once the listener runs: the sockets of the socket tenants
  // RestoreSocketTenants listed. One line per socket that cannot be made
  // (its tenant stays listed: PutTenant tries its socket again).
  std::vector<std::string> ServeRestoredSockets();
  // The sockets of the tenants the config gives one, made or removed to
  // match the directory in force (start, and after each reload; TenantConfig.
  // socket). Connections through a socket a reload removed stay open, as
  // live sessions of a removed tenant do. One line per socket that could not
  // be made.
  std::vector<std::string> SyncConfigSockets();

 private:
  // The socket tenant `spec` listed, with its socket (made if the host has
  // none for it): PutTenant's work under the directory's change lock.
  // `*created` says it was new; `record` writes its ledger row.
  absl::StatusOr<uint32_t> Put(const tenants::TenantDirectory::SocketTenantSpec& spec,
                               bool record, const PeerCred& caller, bool* created);
  // Tenant `id`'s socket made at `path` and given `access`; nothing left
  // on failure.
  absl::Status MakeSocket(uint32_t id, const std::string& path,
                          const tenants::SocketAccess& access);

  const tenants::TenantDirectoryHolder* directory_;
  quota::QuotaBook* quotas_;
  ledger::TenantLedger* ledger_;
  const std::vector<placement::DeviceView> devices_;
  std::function<bool(const PeerCred&)> is_admin_;
  std::function<void()> quota_changed_;
  SocketTenantParts sockets_;
};

// The quota's words, e.g. "total_bytes 8.00 GiB; device 1 2.00 GiB;
// max_allocations 10" ("no limit" when unlimited).
std::string DescribeQuota(const tenants::Quota& quota);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_TENANT_ADMIN_H_
