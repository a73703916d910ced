#include "server/session/free_permission.h"

#include "absl/strings/str_cat.h"

namespace gpumem {

absl::Status MayFree(const PeerCred& caller, uint64_t id, uid_t maker_uid, uint32_t tenant,
                     const PeerCred& owner) {
  if (caller.socket_tenant != 0) {
    // Through a tenant's socket: that tenant's allocations only, and
    // nothing said of anyone else's.
    if (tenant != caller.socket_tenant) {
      return absl::NotFoundError(
          absl::StrCat("no allocation ", id, " of this socket's tenant"));
    }
    return absl::OkStatus();
  }
  if (caller.uid != 0 && (caller.uid != maker_uid || owner.socket_tenant != 0)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "allocation ", id, " belongs to ",
        owner.socket_tenant != 0 ? "a socket tenant" : absl::StrCat("uid ", maker_uid),
        "; uid ", caller.uid, " may not free it"));
  }
  return absl::OkStatus();
}

}  // namespace gpumem
