// Who is on the other end of a Unix socket, as the kernel says (SO_PEERCRED),
// and a table from gRPC connection fds to those credentials.
//
// gRPC does not expose a Unix peer's identity, so the daemon accepts
// connections itself, reads SO_PEERCRED, and records it here under the fd
// number before handing the fd to gRPC. A handler finds its caller by
// ServerContext::peer(), which is "fd:N" for such connections. Entries are
// replaced when the kernel reuses a number for a new connection.
#ifndef GPUMEMD_SERVER_SESSION_PEER_CREDENTIALS_H_
#define GPUMEMD_SERVER_SESSION_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {

struct PeerCred {
  pid_t pid = 0;  // 0 when the peer is in a pid namespace we cannot see
  uid_t uid = 0;
  gid_t gid = 0;
  // Only for a caller without a visible pid: the connection-bound session
  // it proved it belongs to (by a token the daemon gave its slab channel;
  // see SessionRegistry::BindConnection). Set by the transport, never
  // taken from a request.
  uint64_t bound_session = 0;
};

absl::StatusOr<PeerCred> ReadPeerCred(int fd);

class PeerTable {
 public:
  void Set(int fd, const PeerCred& cred);
  // `peer` as gRPC prints it ("fd:12"). NOT_FOUND / INTERNAL when unknown.
  absl::StatusOr<PeerCred> Lookup(absl::string_view peer) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, PeerCred> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_PEER_CREDENTIALS_H_
