#include "server/session/peer_credentials.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <iterator>

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

bool SamePrincipal(const PeerCred& a, const PeerCred& b) {
  if (a.socket_tenant != b.socket_tenant) return false;
  return a.socket_tenant != 0 || a.uid == b.uid;
}

void PeerTable::Set(int fd, const PeerCred& cred) {
  Entry e;
  e.cred = cred;
  e.ref.fd = fd;
  struct stat st;
  if (fstat(fd, &st) == 0) {
    e.ref.dev = st.st_dev;
    e.ref.ino = st.st_ino;
  }
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = e;
}

std::vector<ConnectionRef> PeerTable::TakeTenant(uint32_t tenant) {
  std::vector<ConnectionRef> out;
  if (tenant == 0) return out;
  absl::MutexLock lock(&mu_);
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    auto next = std::next(it);
    if (it->second.cred.socket_tenant == tenant) {
      out.push_back(it->second.ref);
      by_fd_.erase(it);
    }
    it = next;
  }
  return out;
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
  return it->second.cred;
}

}  // namespace gpumem
