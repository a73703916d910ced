// See reloadable.h. Each reloadable setting: resolve flag > file > default,
// apply, describe. The fallible one goes first.
#include "server/config/reloadable.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace gpumem {

absl::StatusOr<std::vector<std::string>> ApplyReloadableConfig(
    const v1::DaemonConfig& config, const ReloadableFlags& flags, MemoryBroker* broker) {
  std::vector<std::string> applied;

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
  // Tenants and quotas are read at start (SetQuota changes a quota at run
  // time); a changed tenant section waits for a restart.
  if (running.tenant_size() != next.tenant_size() ||
      running.default_tenant() != next.default_tenant()) {
    changed.push_back("tenants");
  } else {
    for (int i = 0; i < running.tenant_size(); ++i) {
      if (running.tenant(i).SerializeAsString() != next.tenant(i).SerializeAsString()) {
        changed.push_back("tenants");
        break;
      }
    }
  }
  return changed;
}

}  // namespace gpumem
