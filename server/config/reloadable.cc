// See reloadable.h. Each reloadable setting: resolve flag > file > default,
// apply, describe. The fallible ones go first.
#include "server/config/reloadable.h"

#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
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
    const Settings& settings, const google::protobuf::TextFormat::ParseInfoTree* locations,
    const ReloadTargets& targets, bool at_start) {
  ReloadOutcome out;

  // The tenant directory and the admin group first: both can fail, and
  // nothing is changed before they are known to apply. The directory is
  // read and replaced under its change lock (PutTenant and DeleteTenant
  // change it too).
  absl::MutexLock changes(&targets.directory->changes());
  const std::shared_ptr<const tenants::TenantDirectory> in_force = targets.directory->Get();
  std::optional<tenants::TenantDirectory> next_tenants;
  absl::StatusOr<tenants::TenantDirectory> built = tenants::TenantDirectory::Build(
      settings.file, locations, settings.config_path, *targets.devices,
      at_start ? nullptr : in_force.get(), settings.tenant_socket_dir.value);
  if (!built.ok()) return built.status();
  if (!at_start && built->configured() != in_force->configured()) {
    out.restart_only.push_back(
        built->configured()
            ? "tenants (configured now, none in force: uid tenants and configured ids "
              "could collide)"
            : "tenants (none configured now: each uid its own tenant again)");
  } else if (at_start || built->configured()) {
    next_tenants = *std::move(built);
  }

  const std::string& admin = settings.admin_group.value;
  if (absl::Status set = targets.broker->SetAdminGroup(admin); !set.ok()) return set;
  out.applied.push_back(absl::StrCat(
      "admin_group = \"", admin, "\" (",
      admin.empty() && settings.admin_group.source == Source::kDefault
          ? "default: root only"
          : SourceName(settings.admin_group.source),
      ")"));

  targets.broker->SetEmptySlabRelease(settings.empty_slab_release.value);
  out.applied.push_back(absl::StrCat("pool.empty_slab_release_seconds = ",
                                     absl::ToDoubleSeconds(settings.empty_slab_release.value),
                                     " (", SourceName(settings.empty_slab_release.source), ")"));

  if (next_tenants.has_value()) {
    // Quotas before the swap: a session resolved with the new directory
    // finds its tenant's quota in the book already.
    std::vector<ledger::QuotaRow> rows;
    const std::string origin = at_start ? "config" : "config (reload)";
    for (const tenants::Tenant& t : next_tenants->tenants()) {
      // Socket tenants made at run time get their PutTenant quota back
      // (their rows are the ledger's socket_tenants table, not quotas).
      targets.quotas->SetQuota(t.id, t.quota);
      if (!t.quota.unlimited() && !t.runtime) {
        rows.push_back({t.name, t.quota, origin, absl::GetCurrentTimeNanos()});
      }
    }
    const std::string change = DescribeTenantChange(*in_force, *next_tenants);
    const size_t count = next_tenants->tenants().size();
    const bool configured = next_tenants->configured();
    targets.directory->Replace(*std::move(next_tenants));
    absl::Status recorded = targets.ledger != nullptr ? targets.ledger->ReplaceQuotas(rows)
                                                      : absl::OkStatus();
    if (at_start && !recorded.ok()) return recorded;
    targets.broker->QuotasChanged();  // a raised quota may admit a waiting request
    if (configured) {
      out.applied.push_back(absl::StrCat("tenants: ", change));
      out.applied.push_back(absl::StrCat(
          "quotas of ", count, " tenant(s) from the config",
          recorded.ok() ? "" : absl::StrCat(" (ledger not updated: ", recorded.message(), ")")));
    }
  }
  targets.broker->SetReclaimWait(settings.reclaim_wait.value);
  out.applied.push_back(absl::StrCat("reclaim_wait_ms = ",
                                     absl::ToInt64Milliseconds(settings.reclaim_wait.value),
                                     " (", SourceName(settings.reclaim_wait.source), ")"));
  targets.broker->SetFairness(settings.wait_bypass_limit.value, settings.wait_reserve.value);
  out.applied.push_back(absl::StrCat(
      "wait_bypass_limit = ", settings.wait_bypass_limit.value, " (",
      SourceName(settings.wait_bypass_limit.source), "); wait_reserve_ms = ",
      absl::ToInt64Milliseconds(settings.wait_reserve.value), " (",
      SourceName(settings.wait_reserve.source), ")"));
  return out;
}

}  // namespace gpumem
