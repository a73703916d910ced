// See reloadable.h. Each reloadable setting: resolve flag > file > default,
// apply, describe. The fallible ones go first.
#include "server/config/reloadable.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace gpumem {

std::string DescribeTenantChange(const tenants::TenantDirectory& before,
                                 const tenants::TenantDirectory& after) {
  std::vector<std::string> kept, added, removed, changed;
  for (const tenants::Tenant& t : after.tenants()) {
    const tenants::Tenant* old = before.FindId(t.id);
    if (old == nullptr) {
      added.push_back(absl::StrCat("\"", t.name, "\" (id ", t.id, ")"));
    } else if (old->priority != t.priority || old->uids != t.uids || old->gids != t.gids) {
      changed.push_back(absl::StrCat("\"", t.name, "\" (id ", t.id, ")"));
    } else {
      kept.push_back(absl::StrCat("\"", t.name, "\" (id ", t.id, ")"));
    }
  }
  for (const tenants::Tenant& t : before.tenants()) {
    if (after.FindId(t.id) == nullptr) {
      removed.push_back(absl::StrCat("\"", t.name, "\" (id ", t.id, ")"));
    }
  }
  std::string out = absl::StrCat(after.tenants().size(), " tenant(s)");
  auto part = [&out](const char* what, const std::vector<std::string>& names) {
    if (!names.empty()) absl::StrAppend(&out, "; ", what, " ", absl::StrJoin(names, ", "));
  };
  part("kept", kept);
  part("changed (members or priority)", changed);
  part("added", added);
  part("removed", removed);
  if (!removed.empty()) {
    absl::StrAppend(&out, " (live allocations of removed tenants stay charged to them "
                          "until freed)");
  }
  return out;
}

absl::StatusOr<ReloadOutcome> ApplyReloadableConfig(
    const v1::DaemonConfig& config, const ReloadableFlags& flags, MemoryBroker* broker,
    const TenantTargets* tenant_targets) {
  ReloadOutcome out;

  // The tenant directory and the admin group first: both can fail, and
  // nothing is changed before they are known to apply.
  std::shared_ptr<const tenants::TenantDirectory> in_force;
  std::optional<tenants::TenantDirectory> next_tenants;
  if (tenant_targets != nullptr) {
    in_force = tenant_targets->directory->Get();
    absl::StatusOr<tenants::TenantDirectory> built = tenants::TenantDirectory::Build(
        config, tenant_targets->locations, tenant_targets->config_path,
        *tenant_targets->devices, in_force.get());
    if (!built.ok()) return built.status();
    if (built->configured() != in_force->configured()) {
      out.restart_only.push_back(
          built->configured()
              ? "tenants (configured now, none in force: uid tenants and configured ids "
                "could collide)"
              : "tenants (none configured now: each uid its own tenant again)");
    } else if (built->configured()) {
      next_tenants = *std::move(built);
    }
  }

  const bool admin_from_flag = !flags.admin_group.empty();
  const std::string& admin = admin_from_flag ? flags.admin_group : config.admin_group();
  absl::Status admin_set = broker->SetAdminGroup(admin);
  if (!admin_set.ok()) return admin_set;
  out.applied.push_back(absl::StrCat(
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
  out.applied.push_back(absl::StrCat("pool.empty_slab_release_seconds = ", release,
                                     " (", from, ")"));

  if (next_tenants.has_value()) {
    // Quotas before the swap: a session resolved with the new directory
    // finds its tenant's quota in the book already.
    std::vector<ledger::QuotaRow> rows;
    for (const tenants::Tenant& t : next_tenants->tenants()) {
      tenant_targets->quotas->SetQuota(t.id, t.quota);
      if (!t.quota.unlimited()) {
        rows.push_back({t.name, t.quota, "config (reload)", absl::GetCurrentTimeNanos()});
      }
    }
    const std::string change = DescribeTenantChange(*in_force, *next_tenants);
    const size_t count = next_tenants->tenants().size();
    tenant_targets->directory->Replace(*std::move(next_tenants));
    absl::Status recorded = tenant_targets->ledger->ReplaceQuotas(rows);
    broker->ServeWaiters();  // a raised quota may admit a waiting request
    out.applied.push_back(absl::StrCat("tenants: ", change));
    out.applied.push_back(absl::StrCat("quotas of ", count, " tenant(s) from the config",
                                       recorded.ok() ? "" : absl::StrCat(
                                           " (ledger not updated: ", recorded.message(), ")")));
  }
  return out;
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
  return changed;
}

}  // namespace gpumem
