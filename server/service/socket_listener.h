// SocketListener: the daemon's one Unix socket, serving two protocols.
//
// The daemon binds and accepts on its socket itself (gRPC's own listener
// would hide who connected). For each accepted connection it reads the
// caller's pid/uid/gid with SO_PEERCRED and peeks at the first bytes:
//  - "PRI " (the HTTP/2 preface): a gRPC client. The credentials go into
//    the PeerTable under the fd number and the fd is handed to the gRPC
//    server (grpc::AddInsecureChannelFromFd), which owns it from then on.
//  - kFdChannelMagic: the slab-handle channel (common/fd_channel.h). A
//    thread serves the connection's SlabRequests until it closes.
//  - anything else, or nothing within 5 s: closed.
//
// The socket file is created mode 0666 (anyone may connect; what they may
// do is decided per caller from kernel credentials), a stale socket file is
// replaced, and a live one (another daemon answering) is an error. The file
// appears only once the socket is listening (it is bound under a temporary
// name and renamed), so its existence means a connect will succeed. Stop()
// closes the socket, removes the file and waits for channel threads.
// Adopt() takes a socket that someone else (systemd) bound instead.
#ifndef GPUMEMD_SERVER_SERVICE_SOCKET_LISTENER_H_
#define GPUMEMD_SERVER_SERVICE_SOCKET_LISTENER_H_

#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/service/memory_broker.h"
#include "server/session/peer_credentials.h"

namespace grpc {
class Server;
}

namespace gpumem {

class SocketListener {
 public:
  SocketListener(std::string path, MemoryBroker* broker, PeerTable* peers);
  ~SocketListener();

  // Binds and listens; creates the socket's directory if missing.
  absl::Status Bind();
  // Instead of Bind(): serves on `fd`, a Unix stream socket that is already
  // bound and listening (systemd socket activation). The listener owns the
  // fd from now on; Stop() closes it but leaves the socket file, which
  // belongs to whoever bound it. path() becomes the socket's bound path.
  absl::Status Adopt(int fd);
  // Starts accepting; gRPC connections go to `server`.
  void Start(grpc::Server* server);
  void Stop();

  const std::string& path() const { return path_; }

 private:
  void AcceptLoop();
  void Dispatch(int fd);
  void ServeChannel(int fd, const PeerCred& cred);

  std::string path_;
  MemoryBroker* broker_;
  PeerTable* peers_;
  grpc::Server* server_ = nullptr;
  int listen_fd_ = -1;
  bool owns_path_ = true;  // false for an adopted socket
  int wake_[2] = {-1, -1};  // Stop() writes here to end AcceptLoop
  std::thread accept_thread_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // dispatch/channel threads running
  absl::flat_hash_set<int> channel_fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_SOCKET_LISTENER_H_
