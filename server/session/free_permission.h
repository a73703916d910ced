// Who may free an allocation: the rule that Free applies before it takes
// anything out of the table.
//
// Allowed to the owning session, any process of the same uid, and root. The
// uid rule does not reach allocations made through a tenant's own socket
// (only root's does); a caller through a tenant's socket may free only that
// tenant's allocations, and is told nothing of anyone else's.
#ifndef GPUMEMD_SERVER_SESSION_FREE_PERMISSION_H_
#define GPUMEMD_SERVER_SESSION_FREE_PERMISSION_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

// Whether `caller` may free allocation `id`, made by `maker_uid` for tenant
// `tenant` in the session `owner` opened. OK; NOT_FOUND to a caller through
// another tenant's socket; PERMISSION_DENIED naming the owner otherwise (a
// caller that is not an administrator must be answered as for an id that
// does not exist: the caller decides, since who is an administrator is not
// known here).
absl::Status MayFree(const PeerCred& caller, uint64_t id, uid_t maker_uid, uint32_t tenant,
                     const PeerCred& owner);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_FREE_PERMISSION_H_
