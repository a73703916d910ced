#include "server/service/socket_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <iostream>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/fd_passing.h"

namespace gpumem {
namespace {

constexpr int kPeekTimeoutMs = 5000;

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

absl::Status MakeParentDirs(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  std::string dir = path.substr(0, slash);
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return absl::OkStatus();
  absl::Status parent = MakeParentDirs(dir);
  if (!parent.ok()) return parent;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create socket directory ", dir, ": ", strerror(errno),
        " (use --socket=PATH somewhere writable)"));
  }
  return absl::OkStatus();
}

}  // namespace

SocketListener::SocketListener(std::string path, MemoryBroker* broker,
                               PeerTable* peers)
    : path_(std::move(path)), broker_(broker), peers_(peers) {}

SocketListener::~SocketListener() { Stop(); }

absl::Status SocketListener::Bind() {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path_.empty() || path_.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path must be 1..", sizeof(addr.sun_path) - 1, " bytes: \"", path_, "\""));
  }
  memcpy(addr.sun_path, path_.data(), path_.size());
  absl::Status dirs = MakeParentDirs(path_);
  if (!dirs.ok()) return dirs;

  struct stat st;
  if (lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, " exists and is not a socket; refusing to replace it"));
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(probe);
    if (live) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another daemon is already serving ", path_));
    }
    unlink(path_.c_str());  // stale, left by a daemon that died
  }
  // Bound and listening under a temporary name first, then renamed into
  // place: whoever sees the socket file (a client, a test, a unit waiting for
  // it) can connect at once. Binding in place would leave a window between
  // bind() and listen() where connecting fails with ECONNREFUSED. If the
  // temporary name does not fit sun_path, the socket is bound in place.
  const std::string tmp = absl::StrCat(path_, ".", getpid());
  const bool via_tmp = tmp.size() < sizeof(addr.sun_path);
  struct sockaddr_un bind_addr = addr;
  if (via_tmp) {
    memset(bind_addr.sun_path, 0, sizeof(bind_addr.sun_path));
    memcpy(bind_addr.sun_path, tmp.data(), tmp.size());
    unlink(tmp.c_str());  // left by an earlier daemon with this pid
  }
  const std::string& bound = via_tmp ? tmp : path_;
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Errno("socket");
  auto fail = [&](absl::Status s) {
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(bound.c_str());
    return s;
  };
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&bind_addr), sizeof(bind_addr)) != 0) {
    const int err = errno;
    close(listen_fd_);
    listen_fd_ = -1;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot bind ", bound, ": ", strerror(err)));
  }
  chmod(bound.c_str(), 0666);
  if (listen(listen_fd_, 128) != 0) return fail(Errno("listen"));
  if (via_tmp && rename(tmp.c_str(), path_.c_str()) != 0) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "cannot move socket ", tmp, " to ", path_, ": ", strerror(errno))));
  }
  return absl::OkStatus();
}

absl::Status SocketListener::Adopt(int fd) {
  struct sockaddr_un addr;
  socklen_t len = sizeof(addr);
  memset(&addr, 0, sizeof(addr));
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname on the inherited socket");
  }
  if (addr.sun_family != AF_UNIX) {
    return absl::FailedPreconditionError("the inherited socket is not a Unix socket");
  }
  const size_t path_len = len > offsetof(sockaddr_un, sun_path)
                              ? len - offsetof(sockaddr_un, sun_path) : 0;
  path_ = std::string(addr.sun_path, strnlen(addr.sun_path, path_len));
  listen_fd_ = fd;
  owns_path_ = false;
  return absl::OkStatus();
}

void SocketListener::Start(grpc::Server* server) {
  server_ = server;
  if (pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void SocketListener::AcceptLoop() {
  for (;;) {
    // Stop() wakes this poll through the pipe rather than by shutting the
    // listening socket down: an adopted socket is shared with systemd, which
    // keeps listening on it after the daemon exits.
    struct pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(p, wake_[0] >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;  // Stop()
    if ((p[0].revents & POLLIN) == 0) return;  // the socket failed
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        std::cerr << "gpumemd: accept: " << strerror(errno) << "\n";
        usleep(100 * 1000);
        continue;
      }
      return;  // the socket was shut down by Stop()
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    ++active_;
    std::thread([this, fd] {
      Dispatch(fd);
      absl::MutexLock lock(&mu_);
      --active_;
    }).detach();
  }
}

void SocketListener::Dispatch(int fd) {
  absl::StatusOr<PeerCred> cred = ReadPeerCred(fd);
  struct pollfd p = {fd, POLLIN, 0};
  char head[4] = {0, 0, 0, 0};
  ssize_t n = -1;
  if (cred.ok() && poll(&p, 1, kPeekTimeoutMs) > 0) {
    n = recv(fd, head, sizeof(head), MSG_PEEK | MSG_WAITALL);
  }
  if (n == 4 && memcmp(head, "PRI ", 4) == 0) {
    peers_->Set(fd, *cred);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns fd now
    return;
  }
  if (n == 4 && memcmp(head, kFdChannelMagic, 4) == 0) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      channel_fds_.insert(fd);
    }
    ServeChannel(fd, *cred);
    absl::MutexLock lock(&mu_);
    channel_fds_.erase(fd);
    close(fd);
    return;
  }
  close(fd);
}

void SocketListener::ServeChannel(int fd, const PeerCred& cred) {
  for (;;) {
    SlabRequest req;
    if (!ReadAll(fd, &req, sizeof(req)).ok()) return;
    if (memcmp(req.magic, kFdChannelMagic, 4) != 0 ||
        req.version != kFdChannelVersion) {
      return;  // not our protocol: drop the connection
    }
    absl::StatusOr<SlabFd> slab = broker_->ExportSlab(cred, req.slab_id);
    SlabResponse resp = {};
    if (slab.ok()) {
      resp.slab_size = slab->size;
      absl::Status s = SendWithFd(fd, &resp, sizeof(resp), slab->fd);
      close(slab->fd);
      if (!s.ok()) return;
      continue;
    }
    std::string msg(slab.status().message().substr(0, kFdChannelMaxMessage));
    resp.code = static_cast<uint32_t>(slab.status().code());
    resp.message_len = static_cast<uint32_t>(msg.size());
    std::string out(reinterpret_cast<const char*>(&resp), sizeof(resp));
    out += msg;
    if (!WriteAll(fd, out.data(), out.size()).ok()) return;
  }
}

void SocketListener::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (int fd : channel_fds_) shutdown(fd, SHUT_RDWR);
  }
  if (listen_fd_ >= 0) {
    if (wake_[1] >= 0) {
      char byte = 1;
      (void)!write(wake_[1], &byte, 1);
    } else {
      shutdown(listen_fd_, SHUT_RDWR);  // no pipe (pipe2 failed): wake accept()
    }
    if (accept_thread_.joinable()) accept_thread_.join();
    for (int& w : wake_) {
      if (w >= 0) close(w);
      w = -1;
    }
    close(listen_fd_);
    listen_fd_ = -1;
    if (owns_path_) unlink(path_.c_str());
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_));
}

}  // namespace gpumem
