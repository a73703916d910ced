#include "server/service/socket_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/fd_passing.h"

namespace gpumem {
namespace {

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

absl::Status SocketListener::Adopt(int fd, bool owns_path) {
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
  owns_path_ = owns_path;
  return absl::OkStatus();
}

absl::Status SocketListener::Start(grpc::Server* server) {
  server_ = server;
  int flags = fcntl(listen_fd_, F_GETFL);
  fcntl(listen_fd_, F_SETFL, flags | O_NONBLOCK);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return Errno("epoll/eventfd");
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) return Errno("epoll_ctl");
  ev.data.fd = wake_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return Errno("epoll_ctl");
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void SocketListener::Loop() {
  struct epoll_event events[256];
  for (;;) {
    int timeout_ms = -1;
    if (!pending_.empty()) {
      const absl::Duration left = pending_.front().deadline - absl::Now();
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(left) + 1));
    }
    int n = epoll_wait(epoll_fd_, events, 256, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::cerr << "gpumemd: epoll_wait: " << strerror(errno) << "\n";
      return;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) return;  // Stop()
      if (fd == listen_fd_) {
        AcceptAll();
      } else {
        OnReadable(fd);
      }
    }
    ExpirePending();
  }
}

void SocketListener::AcceptAll() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of fds: the oldest silent connection makes room.
        std::cerr << "gpumemd: accept: " << strerror(errno) << "\n";
        if (!pending_.empty()) {
          const Pending p = pending_.front();
          pending_.pop_front();
          auto it = conns_.find(p.fd);
          if (it != conns_.end() && !it->second.channel &&
              it->second.generation == p.generation) {
            CloseConn(p.fd);
          }
          continue;
        }
      }
      return;  // EAGAIN: all accepted (or nothing to make room with)
    }
    absl::StatusOr<PeerCred> cred = ReadPeerCred(fd);
    if (!cred.ok()) {
      close(fd);
      continue;
    }
    // Edge-triggered: a pending connection is peeked at, not read, so
    // level-triggered readiness would report the same bytes forever.
    struct epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    Conn& c = conns_[fd];
    c = Conn();
    c.cred = *cred;
    c.generation = next_generation_++;
    pending_.push_back({absl::Now() + kFirstBytesTimeout, fd, c.generation});
  }
}

void SocketListener::ExpirePending() {
  const absl::Time now = absl::Now();
  while (!pending_.empty() && pending_.front().deadline <= now) {
    const Pending p = pending_.front();
    pending_.pop_front();
    auto it = conns_.find(p.fd);
    if (it != conns_.end() && !it->second.channel &&
        it->second.generation == p.generation) {
      CloseConn(p.fd);  // said nothing in time
    }
  }
}

void SocketListener::CloseConn(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  auto it = conns_.find(fd);
  const uint64_t bound = it == conns_.end() ? 0 : it->second.cred.bound_session;
  if (it != conns_.end()) {
    for (int received : it->second.fds) close(received);
  }
  if (it != conns_.end()) conns_.erase(it);
  close(fd);
  // A connection-bound session lives exactly as long as its connection.
  if (bound != 0) broker_->EndConnection(bound);
}

void SocketListener::OnReadable(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Conn& conn = it->second;
  if (conn.channel) {
    ServeRequests(fd, conn);
    return;
  }
  char head[4];
  ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  const Preface preface = n > 0 ? ClassifyPreface(head, static_cast<size_t>(n))
                                : Preface::kUnknown;
  if (preface == Preface::kNeedMore) {
    // A partial preface: wait for more bytes (edge-triggered, so the
    // unconsumed peek does not wake us again; the deadline still applies).
    return;
  }
  if (preface == Preface::kGrpc) {
    const PeerCred cred = conn.cred;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    conns_.erase(it);
    peers_->Set(fd, cred);
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns fd now
    return;
  }
  if (preface == Preface::kSlabChannel) {
    conn.channel = true;  // no deadline from now on: it is a lifeline
    ServeRequests(fd, conn);
    return;
  }
  CloseConn(fd);  // EOF, error, or not one of our protocols
}

void SocketListener::ServeRequests(int fd, Conn& conn) {
  // Non-blocking: a peer that stopped reading its answers loses the
  // connection rather than stalling the loop (SendWithFd reports EAGAIN).
  auto send = [fd](const SlabChannelReply& r) {
    return SendWithFd(fd, r.bytes.data(), r.bytes.size(), r.fd).ok();
  };
  char buf[4096];
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  for (;;) {
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // Fds that came with these bytes (kGiveSlab's), queued in order; more
    // than fit the control buffer were closed by the kernel: not our client.
    bool bad_fds = (msg.msg_flags & MSG_CTRUNC) != 0;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        conn.fds.push_back(received);
      }
    }
    if (bad_fds || conn.fds.size() > kMaxQueuedFds || n <= 0 ||
        !ServeSlabChannel(broker_, conn, absl::string_view(buf, static_cast<size_t>(n)), send)) {
      CloseConn(fd);
      return;
    }
  }
}

namespace {

// The goodbye of a daemon that stops for good (common/fd_channel.h): best
// effort, never blocking (the socket is non-blocking).
void SendGoodbye(int fd) {
  SlabResponse resp = {};
  resp.code = static_cast<uint32_t>(absl::StatusCode::kUnavailable);
  resp.message_len = static_cast<uint32_t>(sizeof(kFdChannelGoodbye) - 1);
  resp.slab_size = kFdChannelGoodbyeMark;
  std::string out(reinterpret_cast<const char*>(&resp), sizeof(resp));
  out += kFdChannelGoodbye;
  (void)!send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

void SocketListener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (loop_.joinable()) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    loop_.join();
  }
  for (auto& [fd, conn] : conns_) {
    if (goodbye_ && conn.channel) SendGoodbye(fd);
    close(fd);
    for (int received : conn.fds) close(received);
    if (conn.cred.bound_session != 0) broker_->EndConnection(conn.cred.bound_session);
  }
  conns_.clear();
  pending_.clear();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    if (owns_path_) unlink(path_.c_str());  // an adopted socket stays systemd's
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

}  // namespace gpumem
