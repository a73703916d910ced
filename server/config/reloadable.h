// The settings a running daemon takes from its config, at start and again on
// SIGHUP, applied through one function, and the list of settings that wait
// for a restart.
//
// Invariants: ApplyReloadableConfig is the only place the reloadable
// settings and the tenant section reach running parts (the daemon calls it
// at start and on every SIGHUP with settings ResolveSettings made from a
// config LoadDaemonConfig accepted), so start and reload cannot disagree; it
// changes only what affects new requests and future maintenance (no
// session, allocation or slab is dropped or moved); it is all or nothing; a
// setting also given as a command-line flag keeps the flag's value (flags
// win over the file, at start and on reload: settings.h).
#ifndef GPUMEMD_SERVER_CONFIG_RELOADABLE_H_
#define GPUMEMD_SERVER_CONFIG_RELOADABLE_H_

#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/status/statusor.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/config/settings.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/placement/device_view.h"
#include "server/quota/quota_book.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

// The running parts the config reaches.
struct ReloadTargets {
  MemoryBroker* broker = nullptr;
  const std::vector<placement::DeviceView>* devices = nullptr;
  tenants::TenantDirectoryHolder* directory = nullptr;  // the one in force
  quota::QuotaBook* quotas = nullptr;
  ledger::TenantLedger* ledger = nullptr;
};

struct ReloadOutcome {
  // One human-readable line per setting applied, e.g.
  // "pool.empty_slab_release_seconds = 5 (config)".
  std::vector<std::string> applied;
  // Parts of the file that wait for the next start (the tenant mode switch).
  std::vector<std::string> restart_only;
};

// Applies the reloadable rows of the settings table (setting_table.h) that
// reach the broker (admin_group, pool.empty_slab_release_seconds,
// reclaim_wait_ms, wait_bypass_limit, wait_reserve_ms; the connection limits
// reach the listener, server/daemon) and the tenant section (tenants, their
// uids/gids, priorities, quotas, limits on waiting requests and sessions,
// default_tenant). Restart-only rows: RestartOnlyChanges and
// KeepRestartOnly (settings.h); switching between no tenants and configured
// tenants waits for a restart too (reported in restart_only below).
//
// All or nothing: what can still fail at apply time (building the new
// tenant directory, whose errors name FILE:LINE; the admin group, if it
// vanished from the system since validation) is done first, and on failure
// nothing is changed. Writing the reloaded quotas to the ledger's quota
// table is best effort (a failure is reported in the returned line; the
// quotas apply anyway).
//
// A reloaded tenant section is a new TenantDirectory built from the one in
// force (server/tenants/tenant_directory.h): a tenant kept by name keeps
// its id; a new one gets an id never used before in the daemon's life; the
// quota book gets every configured tenant's quota (replacing SetQuota's)
// before the directory is swapped in, so a new session never sees a tenant
// without its quota. Then:
//  - new sessions resolve with the new directory; live sessions keep the
//    tenant they were fixed to (server/core/memory_broker.h), so their
//    allocations stay charged there until freed;
//  - a removed tenant's live allocations stay charged to it, under its
//    name, with its last quota still enforced on its live sessions, and it
//    is listed by GetStats and (for admins) GetUsage until they are freed;
//    SetQuota does not name it, and the ledger's quota table drops it;
//  - priorities apply to Allocates that queue to wait after the reload;
//  - socket tenants made at run time (PutTenant) are kept, with their ids,
//    sockets and PutTenant quotas; a config that defines a tenant of one's
//    name (or gives one's socket to a config tenant) is refused, naming the
//    line. Sockets of config tenants (TenantConfig.socket) are made and
//    removed after the directory is swapped in (TenantAdmin::
//    SyncConfigSockets); they resolve inside settings.tenant_socket_dir,
//    which the caller passes as the one in force (it is restart-only).
//
// `locations` (may be null) is the parse tree `settings.file` was read with,
// for FILE:LINE in tenant errors. `at_start`: the directory in force is the
// empty one the daemon starts with, so any tenant mode may be taken.
absl::StatusOr<ReloadOutcome> ApplyReloadableConfig(
    const Settings& settings, const google::protobuf::TextFormat::ParseInfoTree* locations,
    const ReloadTargets& targets, bool at_start);

// What a reload does to the tenants, e.g. `3 tenant(s): kept "a" (id 1);
// added "c" (id 4); removed "b" (id 2; its live allocations stay charged to
// it until freed)`.
std::string DescribeTenantChange(const tenants::TenantDirectory& before,
                                 const tenants::TenantDirectory& after);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_RELOADABLE_H_
