#include "server/session/session_tenants.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<tenants::TenantRef> SessionTenants::Charge(Session& session,
                                                          const PeerCred& caller) {
  const std::shared_ptr<const tenants::TenantDirectory> dir = directory_->Get();
  // Without configured tenants each uid is its own tenant, call by call
  // (a process that changes uid acts as its new uid; nothing to fix). A
  // caller through a tenant's socket is that tenant, fixed at once.
  if (!dir->configured() && caller.socket_tenant == 0) {
    absl::StatusOr<tenants::TenantRef> own = dir->Resolve(caller.uid, caller.gid);
    if (!own.ok()) return own;
    if (absl::Status counted = Count(session, *own); !counted.ok()) return counted;
    return own;
  }
  absl::StatusOr<tenants::TenantRef> fixed = session.FixTenant(
      [&] { return dir->ResolveCaller(caller.uid, caller.gid, caller.socket_tenant); });
  if (!fixed.ok()) return fixed;
  // Its priority and limits now, if the directory in force still has the
  // tenant (a removed tenant keeps those it had).
  if (const tenants::Tenant* t = dir->FindId(fixed->id)) {
    fixed->priority = t->priority;
    fixed->max_waiting_requests = t->max_waiting_requests;
    fixed->max_sessions = t->max_sessions;
  }
  if (absl::Status counted = Count(session, *fixed); !counted.ok()) return counted;
  return fixed;
}

absl::Status SessionTenants::Count(const Session& session, const tenants::TenantRef& tenant) {
  absl::MutexLock lock(&mu_);
  if (counted_.contains(session.id())) return absl::OkStatus();
  // An ended session is not counted: its end (Ended, which takes this lock
  // after the session was marked ended) may have uncounted it.
  if (session.ended()) return absl::OkStatus();
  uint32_t& live = live_[tenant.id];
  if (tenant.max_sessions > 0 && live >= tenant.max_sessions) {
    const uint32_t now = live;
    if (live == 0) live_.erase(tenant.id);
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", tenant.name, "\" has ", now,
        " live sessions already, its limit (max_sessions ", tenant.max_sessions,
        "); retry once one of its processes has exited"));
  }
  ++live;
  counted_[session.id()] = tenant.id;
  return absl::OkStatus();
}

void SessionTenants::Ended(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto counted = counted_.find(session_id);
  if (counted == counted_.end()) return;
  auto live = live_.find(counted->second);
  if (live != live_.end() && --live->second == 0) live_.erase(live);
  counted_.erase(counted);
}

}  // namespace gpumem
