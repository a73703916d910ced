// SocketListener: the daemon's one Unix socket, serving two protocols from
// one thread. The daemon binds and accepts on its socket itself (gRPC's own
// listener would hide who connected). One thread runs an epoll loop over
// the listening sockets (the main one and socket tenants') and every
// connection that is not gRPC's: at accept a connection's pid/uid/gid is
// read with SO_PEERCRED, and its first four bytes decide what it is: a
// gRPC connection, linked to the gRPC server through H2Guard (h2_guard.h)
// with its credentials in the PeerTable, or a slab-handle channel
// (common/fd_channel.h), served by this loop for as long as it is open.
//
// Invariants: the thread count does not grow with clients (an idle
// connection costs an fd, no thread); the socket file exists only while a
// connect to it will succeed; every accepted connection is admitted or
// closed at once by ConnectionLimits (connection_limits.h), which counts it
// until it closes; the loop never spins on a failing accept().
#ifndef GPUMEMD_SERVER_SERVICE_SOCKET_LISTENER_H_
#define GPUMEMD_SERVER_SERVICE_SOCKET_LISTENER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/core/memory_broker.h"
#include "server/service/connection_limits.h"
#include "server/service/h2_guard.h"
#include "server/service/slab_channel.h"
#include "server/service/tenant_socket_file.h"
#include "server/service/tenant_socket_host.h"
#include "server/session/peer_credentials.h"

namespace grpc {
class Server;
}

namespace gpumem {

// A new connection waits (in epoll, costing no thread) for its first four
// bytes: "PRI " (the HTTP/2 preface) makes it a gRPC connection: H2Guard
// links it to one end of a socket pair whose other end goes to the gRPC
// server (grpc::AddInsecureChannelFromFd), the credentials in the PeerTable
// under that end's fd number; this loop relays the link for as long as it
// lives. A caller whose principal has reset too many streams gets no new
// link (the connection is closed). kFdChannelMagic makes it a slab-handle
// channel. Anything else is closed, and so is a connection silent for
// kFirstBytesTimeout.
//
// Slab channel requests are answered in the loop: open (an fd over
// SCM_RIGHTS, recorded as held by the caller's session), close, and hello,
// which gives a caller in another pid namespace a session bound to this
// connection (ended when it closes) and its token; after a restart, rebind
// (a restored connection-bound session, by its token) and give (a slab's
// handle handed back, checked by the backend). A channel whose peer does
// not read its answers (the socket buffer is full) or sends a malformed
// request is closed.
//
// accept() failing with EMFILE/ENFILE closes the oldest silent connection
// if there is one, else stops accepting for kAcceptPause (the listening
// sockets are left out of epoll meanwhile); such failures are logged once a
// second.
class SocketListener final : public TenantSocketHost {
 public:
  // How long a new connection may stay silent before it is closed.
  static constexpr absl::Duration kFirstBytesTimeout = absl::Seconds(5);
  // How long accepting stops after accept() found no fd left.
  static constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
  // How often gRPC connections that closed are looked for, and refusals
  // not yet logged are written.
  static constexpr absl::Duration kSweepEvery = absl::Seconds(1);

  SocketListener(std::string path, MemoryBroker* broker, PeerTable* peers);
  ~SocketListener();

  // Binds and listens; creates the socket's directory if missing. The file
  // is mode 0666 (anyone may connect; what they may do is decided per caller
  // from kernel credentials); a stale socket file is replaced, and a live
  // one (another daemon answering) is an error. The file appears only once
  // the socket is listening (it is bound under a temporary name and
  // renamed), so its existence means a connect will succeed.
  absl::Status Bind();
  // Instead of Bind(): serves on `fd`, a Unix stream socket that is already
  // bound and listening (systemd socket activation). The listener owns the
  // fd from now on; Stop() closes it but leaves the socket file, which
  // belongs to whoever bound it. path() becomes the socket's bound path.
  // `owns_path`: the socket is gpumemd's own, kept over a restart in
  // systemd's fd store; then Stop() removes its file like Bind()'s.
  absl::Status Adopt(int fd, bool owns_path = false);
  // Starts the loop; gRPC connections go to `server`.
  absl::Status Start(grpc::Server* server);
  // Stops accepting on every socket and reading slab channels; gRPC's links
  // keep being relayed, so that gRPC's own shutdown reaches its clients.
  // Then Stop() or StopForRestart(). No-op before Start.
  void StopAccepting();
  // Closes the socket, removes its file (not an adopted socket's), removes
  // the tenant sockets and ends the loop, closing channels and gRPC's links.
  void Stop();
  // A stop for a restart: the socket file stays (the listening socket lives
  // on in systemd's fd store, or the next daemon replaces the file), and
  // slab channels close without the goodbye (common/fd_channel.h): their
  // clients wait for the next daemon.
  void StopForRestart() {
    owns_path_ = false;
    goodbye_ = false;
    Stop();
  }
  int listen_fd() const { return listen_fd_; }

  const std::string& path() const { return path_; }
  // Who lends request rings (kOpenRing); null (the default): rings are off.
  // Set before Start; `rings` outlives the listener.
  void SetRingLender(RingLender* rings) { rings_ = rings; }

  // The connection limits in force (before or after Start; thread-safe,
  // a reload calls it).
  void SetConnectionLimits(const ConnectionLimitSettings& limits);

  // TenantSocketHost (after Start; FAILED_PRECONDITION before it or once
  // stopping). Each socket tenant's socket is another listening socket of the
  // loop, whose connections are marked with its tenant
  // (PeerCred::socket_tenant) at accept. Adding and removing run on the
  // loop's thread (the caller waits for it), so a removal and the loop's own
  // work on that socket's connections never overlap.
  absl::Status AddTenantSocket(uint32_t tenant, const std::string& socket_dir,
                               const std::string& path) override;
  void RemoveTenantSocket(uint32_t tenant, bool close_connections) override;
  std::map<uint32_t, std::string> TenantSockets() const override;

 private:
  // cred, in, token: the slab channel's (slab_channel.h).
  struct Conn : SlabChannelConn {
    bool channel = false;       // past the first bytes: a slab channel
    uint64_t generation = 0;    // tells a reused fd number from the old one
  };
  // A peer that sends more fds than it gives slabs for loses the channel.
  static constexpr size_t kMaxQueuedFds = 16;

  void Loop();
  // Accepts on `listen_fd`; connections are marked with `tenant` (0: the
  // main socket).
  void AcceptAll(int listen_fd, uint32_t tenant);
  // Runs `task` on the loop's thread and waits for it; false (not run) when
  // the loop has not started or has stopped.
  bool RunInLoop(std::function<void()> task);
  void RunTasks();
  // The loop's side of RemoveTenantSocket.
  void DropTenantSocket(uint32_t tenant, bool close_connections);
  void OnReadable(int fd);
  void ServeRequests(int fd, Conn& conn);
  void CloseConn(int fd);
  void ExpirePending();
  // Stops accepting on every listening socket until `until` (EMFILE).
  void PauseAccepting(absl::Time until);
  void ResumeAccepting();

  std::string path_;
  MemoryBroker* broker_;
  PeerTable* peers_;
  RingLender* rings_ = nullptr;
  grpc::Server* server_ = nullptr;
  int listen_fd_ = -1;
  bool owns_path_ = true;  // false for an adopted socket
  bool goodbye_ = true;    // Stop() tells slab channels nothing survives
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread loop_;
  bool stopped_ = false;
  // Work for the loop's thread (RunInLoop), signalled on task_fd_.
  int task_fd_ = -1;
  absl::Mutex tasks_mu_;
  std::vector<std::function<void()>> tasks_ ABSL_GUARDED_BY(tasks_mu_);
  bool loop_started_ ABSL_GUARDED_BY(tasks_mu_) = false;
  bool loop_done_ ABSL_GUARDED_BY(tasks_mu_) = false;
  // Socket tenants' sockets. Changed on the loop's thread only; the lock
  // is for TenantSockets() on others.
  mutable absl::Mutex sockets_mu_;
  std::map<uint32_t, std::unique_ptr<TenantSocketFile>> tenant_sockets_
      ABSL_GUARDED_BY(sockets_mu_);
  // Loop thread only:
  absl::flat_hash_map<int, uint32_t> tenant_listen_fds_;  // listening fd -> tenant
  absl::flat_hash_map<int, Conn> conns_;
  // New connections in accept order: (deadline, fd, generation).
  struct Pending {
    absl::Time deadline;
    int fd;
    uint64_t generation;
  };
  std::deque<Pending> pending_;
  uint64_t next_generation_ = 1;
  ConnectionLimits limits_;
  std::unique_ptr<H2Guard> guard_;  // made by Start
  absl::Time accept_paused_until_ = absl::InfinitePast();
  bool accept_paused_ = false;
  bool accepting_stopped_ = false;  // StopAccepting
  absl::Time next_sweep_ = absl::InfinitePast();
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_SOCKET_LISTENER_H_
