// See reloadable.h. Each reloadable setting: resolve flag > file > default,
// apply, describe. The fallible one goes first.
#include "server/config/reloadable.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

namespace {

v1::DaemonConfig TenantsWithoutQuotas(const v1::DaemonConfig& c) {
  v1::DaemonConfig out;
  *out.mutable_tenant() = c.tenant();
  out.set_default_tenant(c.default_tenant());
  for (v1::TenantConfig& t : *out.mutable_tenant()) t.clear_quota();
  return out;
}

}  // namespace

bool TenantMembershipChanged(const v1::DaemonConfig& running, const v1::DaemonConfig& next) {
  return TenantsWithoutQuotas(running).SerializeAsString() !=
         TenantsWithoutQuotas(next).SerializeAsString();
}

absl::StatusOr<std::vector<std::string>> ApplyReloadableConfig(
    const v1::DaemonConfig& config, const ReloadableFlags& flags, MemoryBroker* broker,
    const QuotaTargets* quota_targets) {
  std::vector<std::string> applied;

  // Quotas first with the admin group: both can fail; nothing is changed
  // before they are known to apply.
  std::optional<tenants::TenantDirectory> next_tenants;
  if (quota_targets != nullptr && !TenantMembershipChanged(*quota_targets->running, config)) {
    absl::StatusOr<tenants::TenantDirectory> built = tenants::TenantDirectory::Build(
        config, nullptr, "config", *quota_targets->devices);
    if (!built.ok()) return built.status();
    next_tenants = *std::move(built);
  }

  const bool admin_from_flag = !flags.admin_group.empty();
  const std::string& admin = admin_from_flag ? flags.admin_group : config.admin_group();
  absl::Status admin_set = broker->SetAdminGroup(admin);
  if (!admin_set.ok()) return admin_set;
  applied.push_back(absl::StrCat(
      "admin_group = \"", admin, "\" (",
      admin_from_flag ? "flag" : (admin.empty() ? "default: root only" : "config"), ")"));

  double release = flags.empty_slab_release_seconds;
  std::string from = "flag";
  if (release < 0) {
    release = config.pool().empty_slab_release_seconds() > 0
                  ? config.pool().empty_slab_release_seconds() : 30;
    from = config.pool().empty_slab_release_seconds() > 0 ? "config" : "default";
  }
  broker->SetEmptySlabRelease(absl::Seconds(release));
  applied.push_back(absl::StrCat("pool.empty_slab_release_seconds = ", release,
                                 " (", from, ")"));

  if (next_tenants.has_value() && next_tenants->configured()) {
    std::vector<ledger::QuotaRow> rows;
    for (const tenants::Tenant& t : next_tenants->tenants()) {
      quota_targets->quotas->SetQuota(t.id, t.quota);
      if (!t.quota.unlimited()) {
        rows.push_back({t.name, t.quota, "config (reload)", absl::GetCurrentTimeNanos()});
      }
    }
    absl::Status recorded = quota_targets->ledger->ReplaceQuotas(rows);
    broker->ServeWaiters();  // a raised quota may admit a waiting request
    applied.push_back(absl::StrCat("quotas of ", next_tenants->tenants().size(),
                                   " tenant(s) from the config",
                                   recorded.ok() ? "" : absl::StrCat(
                                       " (ledger not updated: ", recorded.message(), ")")));
  }
  return applied;
}

std::vector<std::string> RestartOnlyChanges(const v1::DaemonConfig& running,
                                            const v1::DaemonConfig& next) {
  std::vector<std::string> changed;
  if (running.backend() != next.backend()) changed.push_back("backend");
  if (running.socket() != next.socket()) changed.push_back("socket");
  if (running.sim_devices() != next.sim_devices()) changed.push_back("sim_devices");
  if (running.sim_topology() != next.sim_topology()) changed.push_back("sim_topology");
  if (!std::equal(running.handle_kinds().begin(), running.handle_kinds().end(),
                  next.handle_kinds().begin(), next.handle_kinds().end())) {
    changed.push_back("handle_kinds");
  }
  if (running.pool().slab_size() != next.pool().slab_size()) {
    changed.push_back("pool.slab_size");
  }
  if (running.ledger() != next.ledger()) changed.push_back("ledger");
  if (TenantMembershipChanged(running, next)) {
    changed.push_back("tenants (members, priorities, default_tenant; quotas not applied)");
  }
  return changed;
}

}  // namespace gpumem
