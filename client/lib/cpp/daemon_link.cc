// See daemon_link.h.
#include "client/lib/cpp/daemon_link.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace gpumem {
namespace client {

absl::StatusOr<std::shared_ptr<DaemonLink>> DaemonLink::Open(const std::string& socket_path,
                                                             const std::string& rebind_token,
                                                             bool* rebound,
                                                             bool* unanswered) {
  *rebound = false;
  if (unanswered != nullptr) *unanswered = false;
  absl::StatusOr<int> fd = ConnectFdChannel(socket_path);
  if (!fd.ok()) return fd.status();
  std::shared_ptr<DaemonLink> link(new DaemonLink());
  link->channel_fd_ = *fd;
  // A daemon that accepted (or whose kept socket queued) the connection but
  // does not answer yet: the caller tries again rather than hang.
  struct timeval wait = {5, 0};
  setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  if (!rebind_token.empty()) {
    absl::Status back = RebindFdChannel(*fd, rebind_token);
    if (back.ok()) {
      *rebound = true;
      link->session_token_ = rebind_token;
    } else if (back.code() == absl::StatusCode::kUnavailable ||
               back.code() == absl::StatusCode::kInternal) {
      return back;  // the channel broke: try again
    }
    // Refused (not kept, expired): a new session below, on this channel.
  }
  if (!*rebound) {
    bool answered = false;
    absl::StatusOr<std::string> token = HelloFdChannel(*fd, &answered);
    if (!token.ok()) {
      if (unanswered != nullptr) *unanswered = !answered;
      return token.status();
    }
    link->session_token_ = *token;
  }
  struct timeval forever = {0, 0};
  setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof(forever));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // A channel of its own: a link made after a daemon restart must not share
  // the old link's (dead) connection from gRPC's global pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  link->channel_ =
      grpc::CreateCustomChannel("unix:" + socket_path, grpc::InsecureChannelCredentials(), args);
  link->stub_ = v1::GpuMemory::NewStub(link->channel_);
  link->stream_ = std::make_unique<StreamTransport>(link->stub_.get(), link->session_token_);
  return link;
}

DaemonLink::~DaemonLink() {
  stream_.reset();  // before the stub it uses
  if (channel_fd_ >= 0) close(channel_fd_);
}

void DaemonLink::Prepare(grpc::ClientContext* ctx) const {
  if (!session_token_.empty()) ctx->AddMetadata(kSessionTokenHeader, session_token_);
}

absl::StatusOr<SlabFd> DaemonLink::OpenSlab(uint64_t slab_id) {
  absl::MutexLock lock(&channel_mu_);
  absl::StatusOr<SlabFd> out = RequestSlabFd(channel_fd_, slab_id);
  goodbye_ = goodbye_ || IsFdChannelGoodbye(out.status());
  return out;
}

absl::Status DaemonLink::CloseSlab(uint64_t slab_id) {
  absl::MutexLock lock(&channel_mu_);
  absl::Status out = CloseSlabFd(channel_fd_, slab_id);
  goodbye_ = goodbye_ || IsFdChannelGoodbye(out);
  return out;
}

absl::Status DaemonLink::GiveSlab(uint64_t slab_id, int fd) {
  absl::MutexLock lock(&channel_mu_);
  absl::Status out = GiveSlabFd(channel_fd_, slab_id, fd);
  goodbye_ = goodbye_ || IsFdChannelGoodbye(out);
  return out;
}

bool DaemonLink::SaidGoodbye() {
  absl::MutexLock lock(&channel_mu_);
  goodbye_ = goodbye_ || ReadFdChannelGoodbye(channel_fd_);
  return goodbye_;
}

bool DaemonLink::HungUp() const {
  struct pollfd p = {channel_fd_, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace client
}  // namespace gpumem
