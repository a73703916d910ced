// SessionTenants: the tenant each session is charged to, and how many live
// sessions each tenant has.
//
// Without configured tenants each call is charged to its caller's uid. With
// them, a session's tenant is fixed the first time the session needs one
// (its first Allocate or slab export), from the directory in force then, and
// kept for the session's life (Session::FixTenant): a reload that moves the
// uid to another tenant, or removes its tenant, changes nothing for a live
// session. A caller through a tenant's socket is that tenant at once,
// whatever its uid, and never root nor an administrator.
//
// Invariants: a session counts once, toward the first tenant it is charged
// to, from then until Ended; a tenant never has more than its max_sessions
// counted at once; an ended session is never counted. Thread-safe.
#ifndef GPUMEMD_SERVER_SESSION_SESSION_TENANTS_H_
#define GPUMEMD_SERVER_SESSION_SESSION_TENANTS_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/session/peer_credentials.h"
#include "server/session/session.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

class SessionTenants {
 public:
  // `directory` (the one in force) must outlive this.
  explicit SessionTenants(const tenants::TenantDirectoryHolder* directory)
      : directory_(directory) {}
  SessionTenants(const SessionTenants&) = delete;
  SessionTenants& operator=(const SessionTenants&) = delete;

  // The tenant `session` (of `caller`) is charged to, with its priority and
  // limits as the directory in force says (a removed tenant keeps those it
  // had); PERMISSION_DENIED when the config gives the caller none.
  // RESOURCE_EXHAUSTED naming the tenant and the limit when this would be
  // one more session than the tenant's max_sessions.
  absl::StatusOr<tenants::TenantRef> Charge(Session& session, const PeerCred& caller);
  // Session `session_id` ended: it counts no more.
  void Ended(uint64_t session_id);

 private:
  absl::Status Count(const Session& session, const tenants::TenantRef& tenant);

  const tenants::TenantDirectoryHolder* const directory_;
  absl::Mutex mu_;
  // Each counted live session's tenant, and each tenant's count.
  absl::flat_hash_map<uint64_t, uint32_t> counted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, uint32_t> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_SESSION_TENANTS_H_
