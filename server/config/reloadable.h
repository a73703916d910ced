// The settings a running daemon takes from a new config on SIGHUP, applied
// through one function, and the list of settings that wait for a restart.
//
// Guarantees:
//  - ApplyReloadableConfig is the only place config reaches running parts:
//    the daemon calls it at start and on every SIGHUP with a config that
//    LoadDaemonConfig accepted, so start and reload cannot disagree.
//  - It changes only what affects new requests and future maintenance;
//    no session, allocation or slab is dropped or moved.
//  - All or nothing: what can still fail at apply time (building the new
//    quotas; the admin group, if it vanished from the system since
//    validation) is done first, and on failure nothing is changed. Writing
//    the reloaded quotas to the ledger's quota table is best effort (a
//    failure is reported in the returned line; the quotas apply anyway).
//  - A setting also given as a command-line flag keeps the flag's value
//    (flags win over the file, at start and on reload).
//
// Reloadable today: admin_group, pool.empty_slab_release_seconds, and
// tenant quotas when the rest of the tenant section is unchanged.
// Restart-only: backend, socket, sim_devices, sim_topology, handle_kinds,
// pool.slab_size (devices, the listening socket, handle kinds and slab
// geometry are fixed for the daemon's life), ledger, and the tenant section
// (tenants, their uids/gids, priorities and default_tenant: the tenant
// directory is immutable). Quotas of an unchanged tenant section reload.
#ifndef GPUMEMD_SERVER_CONFIG_RELOADABLE_H_
#define GPUMEMD_SERVER_CONFIG_RELOADABLE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/ledger/tenant_ledger.h"
#include "server/placement/device_view.h"
#include "server/quota/quota_book.h"
#include "server/service/memory_broker.h"

namespace gpumem {

// Reloadable settings given on the command line (they win over the file).
struct ReloadableFlags {
  double empty_slab_release_seconds = -1;  // < 0: not given
  std::string admin_group;                 // empty: not given
};

// Where tenant quotas live, for a reload. Quotas are applied only when the
// tenant section differs from the running one in quotas alone (same
// tenants, uids, gids, priorities, default): tenant ids then stay the same.
struct QuotaTargets {
  const v1::DaemonConfig* running = nullptr;  // the config in force
  const std::vector<placement::DeviceView>* devices = nullptr;
  quota::QuotaBook* quotas = nullptr;
  ledger::TenantLedger* ledger = nullptr;
};

// One human-readable line per setting applied, e.g.
// "pool.empty_slab_release_seconds = 5 (config)". `quota_targets` null: at
// start (quotas were set from the same config already).
absl::StatusOr<std::vector<std::string>> ApplyReloadableConfig(
    const v1::DaemonConfig& config, const ReloadableFlags& flags, MemoryBroker* broker,
    const QuotaTargets* quota_targets = nullptr);

// Whether the tenant sections differ in anything but quotas.
bool TenantMembershipChanged(const v1::DaemonConfig& running, const v1::DaemonConfig& next);

// Names of restart-only fields whose value differs between the two configs.
std::vector<std::string> RestartOnlyChanges(const v1::DaemonConfig& running,
                                            const v1::DaemonConfig& next);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_RELOADABLE_H_
