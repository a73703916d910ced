// AdminGroup: who is an administrator of the daemon. Root always is; so is
// a member of the configured Unix group (primary or supplementary, as the
// system's group database lists the caller's uid). A caller through a
// tenant's own socket (PeerCred::socket_tenant) never is, whatever its uid.
//
// Administrators see every session and tenant in GetStats and GetUsage,
// may name any tenant in GetLedger, and may change quotas and tenants. The
// caller's uid and gid come from the kernel (PeerCred), never a request.
//
// Thread-safe: the group may be replaced (config reload) while IsAdmin runs
// on other threads; each call sees the old group or the new one.
#ifndef GPUMEMD_SERVER_SESSION_ADMIN_GROUP_H_
#define GPUMEMD_SERVER_SESSION_ADMIN_GROUP_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

class AdminGroup {
 public:
  // The group by name ("" for root only). INVALID_ARGUMENT, naming it, if the
  // group does not exist; the group in force stays then.
  absl::Status Set(const std::string& group);
  bool IsAdmin(const PeerCred& caller) const;

 private:
  std::atomic<int64_t> gid_{-1};  // -1: root only
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_ADMIN_GROUP_H_
