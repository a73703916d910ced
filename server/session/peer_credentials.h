// Who is on the other end of a Unix socket, as the kernel says (SO_PEERCRED),
// and a table from gRPC connection fds to those credentials.
//
// gRPC does not expose a Unix peer's identity, so the daemon accepts
// connections itself, reads SO_PEERCRED, and records it here under the fd
// number before handing the fd to gRPC. A handler finds its caller by
// ServerContext::peer(), which is "fd:N" for such connections. Entries are
// replaced when the kernel reuses a number for a new connection.
//
// A connection accepted on a tenant's own socket (a socket tenant, see
// server/tenants/tenant_directory.h) is marked with that tenant
// (PeerCred::socket_tenant): its caller is that tenant, whatever its uid,
// gid or pid namespace say, and never an administrator. On the main socket
// (socket_tenant 0) the caller is its uid/gid, as the config resolves them.
#ifndef GPUMEMD_SERVER_SESSION_PEER_CREDENTIALS_H_
#define GPUMEMD_SERVER_SESSION_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

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
  // The tenant whose own socket the connection came through, or 0 for the
  // main socket (no socket tenant has id 0). Set by the transport at
  // accept, from the socket the connection arrived on; never from a request.
  uint32_t socket_tenant = 0;
};

// Whether `a` and `b` are the same principal: callers through the same
// tenant's socket (whatever their uids), or main-socket callers of one uid.
// What a non-administrator may see and touch of others is decided by this.
bool SamePrincipal(const PeerCred& a, const PeerCred& b);

absl::StatusOr<PeerCred> ReadPeerCred(int fd);

// Which socket an fd number stood for when it was recorded (the kernel
// numbers sockets' inodes uniquely while they live), so that whoever acts on
// a recorded number later can tell whether it still names that socket.
struct ConnectionRef {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
};

class PeerTable {
 public:
  void Set(int fd, const PeerCred& cred);
  // `peer` as gRPC prints it ("fd:12"). NOT_FOUND / INTERNAL when unknown.
  absl::StatusOr<PeerCred> Lookup(absl::string_view peer) const;
  // Forgets every connection through tenant `tenant`'s socket and returns
  // them (calls still arriving on them find no credentials from now on).
  std::vector<ConnectionRef> TakeTenant(uint32_t tenant);

 private:
  struct Entry {
    PeerCred cred;
    ConnectionRef ref;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_PEER_CREDENTIALS_H_
