#include "server/session/peer_credentials.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<PeerCred> ReadPeerCred(int fd) {
  struct ucred uc;
  socklen_t len = sizeof(uc);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", strerror(errno)));
  }
  return PeerCred{uc.pid, uc.uid, uc.gid};
}

void PeerTable::Set(int fd, const PeerCred& cred) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = cred;
}

absl::StatusOr<PeerCred> PeerTable::Lookup(absl::string_view peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "caller \"", peer, "\" did not come through the daemon's Unix socket; "
        "its identity is unknown"));
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) {
    return absl::InternalError(absl::StrCat("no credentials for connection fd ", fd));
  }
  return it->second;
}

}  // namespace gpumem
