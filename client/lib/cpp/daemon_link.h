// DaemonLink: one connection of a Client to one gpumemd process: the slab
// channel (common/fd_channel.h), the gRPC channel, its stub and its stream.
//
// The slab channel is opened first: it fails fast when nobody listens, and
// its first request says who this process is to the daemon: hello (a new
// session; a process the daemon cannot see by pid gets a connection-bound
// one and its token) or, after a restart, rebind (the restored
// connection-bound session of that token). It is also the lifeline: the
// daemon closes it only by exiting, so its hangup is how a Client notices a
// restart at once (client/lib/cpp/client.h).
//
// A Client holds one link at a time and makes a new one after a restart;
// calls in flight keep the link they started on (shared_ptr) until they end.
// Slab-channel requests are serialized on the link's own lock. Thread-safe.
#ifndef GPUMEMD_CLIENT_LIB_CPP_DAEMON_LINK_H_
#define GPUMEMD_CLIENT_LIB_CPP_DAEMON_LINK_H_

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/cpp/stream_transport.h"
#include "common/fd_channel.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace client {

class DaemonLink {
 public:
  // Connects to `socket_path`. With a non-empty `rebind_token` (the
  // connection-bound session a restarted daemon may have kept) it asks for
  // that session first; *rebound says whether it was given back (else the
  // link has a new session, as with an empty token). On failure
  // *unanswered (when given) says the socket took the connection but no
  // answer came (the daemon hung up, or was silent for 5 s): a daemon that
  // died or is starting, worth trying again, unlike one that is not there
  // or that refused.
  static absl::StatusOr<std::shared_ptr<DaemonLink>> Open(const std::string& socket_path,
                                                          const std::string& rebind_token,
                                                          bool* rebound,
                                                          bool* unanswered = nullptr);
  ~DaemonLink();
  DaemonLink(const DaemonLink&) = delete;
  DaemonLink& operator=(const DaemonLink&) = delete;

  v1::GpuMemory::Stub* stub() const { return stub_.get(); }
  StreamTransport* stream() const { return stream_.get(); }
  // Empty unless the daemon cannot see this process's pid.
  const std::string& session_token() const { return session_token_; }
  // Adds the session token, when there is one, to a call.
  void Prepare(grpc::ClientContext* ctx) const;

  // The slab channel's requests (common/fd_channel.h).
  absl::StatusOr<SlabFd> OpenSlab(uint64_t slab_id);
  absl::Status CloseSlab(uint64_t slab_id);
  absl::Status GiveSlab(uint64_t slab_id, int fd);  // `fd` stays the caller's

  // The slab channel's fd, to poll for its hangup (never read it).
  int lifeline() const { return channel_fd_; }
  // True once the daemon closed the slab channel (it exited).
  bool HungUp() const;
  // After the hangup: the daemon said goodbye (it stopped for good and
  // released everything; common/fd_channel.h), so nothing survives.
  bool SaidGoodbye();

 private:
  DaemonLink() = default;

  std::string session_token_;
  int channel_fd_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
  std::unique_ptr<StreamTransport> stream_;
  absl::Mutex channel_mu_;  // one slab-channel request at a time
  bool goodbye_ ABSL_GUARDED_BY(channel_mu_) = false;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_CPP_DAEMON_LINK_H_
