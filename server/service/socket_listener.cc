#include "server/service/socket_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <malloc.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "absl/synchronization/notification.h"

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
    : path_(std::move(path)),
      broker_(broker),
      peers_(peers),
      limits_([broker](const PeerCred& c) { return broker != nullptr && broker->IsAdmin(c); },
              [](const std::string& line) { std::cerr << "gpumemd: " << line << "\n"; }) {}

void SocketListener::SetConnectionLimits(const ConnectionLimitSettings& limits) {
  bool before_start;
  {
    absl::MutexLock lock(&tasks_mu_);
    before_start = !loop_started_;
  }
  if (before_start) {
    limits_.Set(limits);
    return;
  }
  RunInLoop([&] { limits_.Set(limits); });
}

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
  // The kernel's largest backlog (systemd's socket unit's default too): a
  // flood of connects refused at accept leaves room for others' connects.
  if (listen(listen_fd_, SOMAXCONN) != 0) return fail(Errno("listen"));
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
  task_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || task_fd_ < 0) return Errno("epoll/eventfd");
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) return Errno("epoll_ctl");
  ev.data.fd = wake_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return Errno("epoll_ctl");
  ev.data.fd = task_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, task_fd_, &ev) != 0) return Errno("epoll_ctl");
  guard_ = std::make_unique<H2Guard>(
      epoll_fd_, limits_.limits().streams_per_connection,
      [this](int client_fd) { limits_.Closed(client_fd); },
      [this](const std::string& key, const char* what, const std::string& why, absl::Time now) {
        limits_.Refuse(key, what, why, now);
      });
  {
    absl::MutexLock lock(&tasks_mu_);
    loop_started_ = true;
  }
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

bool SocketListener::RunInLoop(std::function<void()> task) {
  absl::Notification done;
  {
    absl::MutexLock lock(&tasks_mu_);
    if (!loop_started_ || loop_done_) return false;
    tasks_.push_back([&task, &done] {
      task();
      done.Notify();
    });
    // Under the lock: Stop() closes task_fd_ only after it set loop_done_.
    uint64_t one = 1;
    (void)!write(task_fd_, &one, sizeof(one));
  }
  done.WaitForNotification();  // by the loop, or by Stop() after it
  return true;
}

void SocketListener::RunTasks() {
  uint64_t count;
  (void)!read(task_fd_, &count, sizeof(count));
  std::vector<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&tasks_mu_);
    tasks.swap(tasks_);
  }
  for (std::function<void()>& t : tasks) t();
}

absl::Status SocketListener::AddTenantSocket(uint32_t tenant, const std::string& socket_dir,
                                             const std::string& path) {
  if (tenant == 0) return absl::InvalidArgumentError("tenant 0 is the main socket's");
  {
    absl::MutexLock lock(&sockets_mu_);
    if (tenant_sockets_.count(tenant) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenant ", tenant, " has a socket already: ", tenant_sockets_[tenant]->path()));
    }
  }
  absl::StatusOr<std::unique_ptr<TenantSocketFile>> file = TenantSocketFile::Make(socket_dir, path);
  if (!file.ok()) return file.status();
  absl::Status added = absl::OkStatus();
  const bool ran = RunInLoop([&] {
    absl::MutexLock lock(&sockets_mu_);
    if (tenant_sockets_.count(tenant) > 0) {
      added = absl::FailedPreconditionError(absl::StrCat("tenant ", tenant, " has a socket already"));
      return;
    }
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = (*file)->fd();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, (*file)->fd(), &ev) != 0) {
      added = Errno("epoll_ctl");
      return;
    }
    tenant_listen_fds_[(*file)->fd()] = tenant;
    tenant_sockets_[tenant] = *std::move(file);
  });
  if (!ran) return absl::FailedPreconditionError("gpumemd is not serving its sockets (stopping?)");
  return added;  // on failure `file` still owns the socket: removed here
}

void SocketListener::RemoveTenantSocket(uint32_t tenant, bool close_connections) {
  RunInLoop([&] { DropTenantSocket(tenant, close_connections); });
}

void SocketListener::DropTenantSocket(uint32_t tenant, bool close_connections) {
  std::unique_ptr<TenantSocketFile> file;
  {
    absl::MutexLock lock(&sockets_mu_);
    auto it = tenant_sockets_.find(tenant);
    if (it != tenant_sockets_.end()) {
      file = std::move(it->second);
      tenant_sockets_.erase(it);
    }
  }
  if (file != nullptr) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, file->fd(), nullptr);
    tenant_listen_fds_.erase(file->fd());
    file.reset();  // no longer accepting; the file is gone
  }
  if (!close_connections) return;
  std::vector<int> doomed;
  for (const auto& [fd, conn] : conns_) {
    if (conn.cred.socket_tenant == tenant) doomed.push_back(fd);
  }
  for (int fd : doomed) CloseConn(fd);  // ends their connection-bound sessions
  // Calls still arriving on its gRPC connections find no credentials; the
  // links end, and gRPC sees its ends of them close.
  peers_->TakeTenant(tenant);
  guard_->EndTenant(tenant);
}

std::map<uint32_t, std::string> SocketListener::TenantSockets() const {
  absl::MutexLock lock(&sockets_mu_);
  std::map<uint32_t, std::string> out;
  for (const auto& [tenant, file] : tenant_sockets_) out[tenant] = file->path();
  return out;
}

void SocketListener::Loop() {
  struct epoll_event events[256];
  next_sweep_ = absl::Now() + kSweepEvery;
  for (;;) {
    absl::Time wake = next_sweep_;
    if (!pending_.empty()) wake = std::min(wake, pending_.front().deadline);
    if (accept_paused_) wake = std::min(wake, accept_paused_until_);
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - absl::Now()) + 1));
    int n = epoll_wait(epoll_fd_, events, 256, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::cerr << "gpumemd: epoll_wait: " << strerror(errno) << "\n";
      return;
    }
    bool tasks = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) return;  // Stop()
      if (fd == task_fd_) {
        tasks = true;  // after this batch: a task may close fds it names
      } else if (fd == listen_fd_) {
        AcceptAll(listen_fd_, 0);
      } else if (auto t = tenant_listen_fds_.find(fd); t != tenant_listen_fds_.end()) {
        AcceptAll(fd, t->second);
      } else if (guard_->Owns(fd)) {
        guard_->OnEvent(fd, events[i].events);
      } else {
        OnReadable(fd);
      }
    }
    if (tasks) RunTasks();
    ExpirePending();
    const absl::Time now = absl::Now();
    if (accept_paused_ && now >= accept_paused_until_) ResumeAccepting();
    if (now >= next_sweep_) {
      // Connections gone: what gRPC held for them (a flood's streams and
      // buffers) is free in malloc's arenas but not given back to the
      // kernel; trimming returns it, so the daemon's RSS comes back down.
      limits_.Sweep(now);
      if (guard_->Sweep(now) > 0) malloc_trim(0);
      next_sweep_ = now + kSweepEvery;
    }
  }
}

void SocketListener::StopAccepting() {
  RunInLoop([this] {
    accepting_stopped_ = true;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    for (const auto& [fd, tenant] : tenant_listen_fds_) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    }
    // Slab channels and new connections wait, unread, for Stop.
    for (const auto& [fd, conn] : conns_) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  });
}

void SocketListener::PauseAccepting(absl::Time until) {
  accept_paused_until_ = until;
  if (accept_paused_ || accepting_stopped_) return;
  accept_paused_ = true;
  struct epoll_event ev = {};  // no events: left alone until resumed
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
  for (const auto& [fd, tenant] : tenant_listen_fds_) {
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }
}

void SocketListener::ResumeAccepting() {
  accept_paused_ = false;
  if (accepting_stopped_) return;
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
  for (const auto& [fd, tenant] : tenant_listen_fds_) {
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }
}

void SocketListener::AcceptAll(int listen_fd, uint32_t tenant) {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of fds: the oldest silent connection makes room; without one,
        // accepting stops for a moment (level-triggered, the backlog would
        // wake the loop at once again).
        limits_.AcceptFailed(errno, absl::Now());
        if (pending_.empty()) {
          PauseAccepting(absl::Now() + kAcceptPause);
          return;
        }
        {
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
    cred->socket_tenant = tenant;  // the socket it came through, not a claim
    if (!limits_.Admit(fd, *cred, absl::Now())) {
      close(fd);  // refused at once; logged (rate-limited) by limits_
      continue;
    }
    // Edge-triggered: a pending connection is peeked at, not read, so
    // level-triggered readiness would report the same bytes forever.
    struct epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      limits_.Closed(fd);
      close(fd);
      continue;
    }
    Conn& c = conns_[fd];
    c = Conn();
    c.cred = *cred;
    c.cred.socket_tenant = tenant;  // the socket it came through, not a claim
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
  limits_.Closed(fd);
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
    if (!guard_->Admits(cred, absl::Now())) {
      CloseConn(fd);  // its principal reset too many streams; noted by the guard
      return;
    }
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    conns_.erase(it);
    absl::StatusOr<int> grpc_fd = guard_->Link(fd, cred);
    if (!grpc_fd.ok()) {
      limits_.Refuse("link", "gRPC connection(s) closed", std::string(grpc_fd.status().message()),
                     absl::Now());
      limits_.Closed(fd);
      close(fd);
      return;
    }
    limits_.Settled(fd);
    peers_->Set(*grpc_fd, cred);
    grpc::AddInsecureChannelFromFd(server_, *grpc_fd);  // gRPC owns its end now
    return;
  }
  if (preface == Preface::kSlabChannel) {
    conn.channel = true;  // no deadline from now on: it is a lifeline
    limits_.Settled(fd);
    ServeRequests(fd, conn);
    return;
  }
  CloseConn(fd);  // EOF, error, or not one of our protocols
}

void SocketListener::ServeRequests(int fd, Conn& conn) {
  // Non-blocking: a peer that stopped reading its answers loses the
  // connection rather than stalling the loop (SendWithFd reports EAGAIN).
  auto send = [fd](const SlabChannelReply& r) {
    const int fds[2] = {r.fd, r.fd2};
    const int count = r.fd2 >= 0 ? 2 : r.fd >= 0 ? 1 : 0;
    return SendWithFds(fd, r.bytes.data(), r.bytes.size(), fds, count).ok();
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
        !ServeSlabChannel(broker_, conn, absl::string_view(buf, static_cast<size_t>(n)), send,
                          rings_)) {
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
  std::vector<std::function<void()>> left;
  {
    absl::MutexLock lock(&tasks_mu_);
    loop_done_ = true;  // from now on nobody waits for the loop
    left.swap(tasks_);
  }
  for (std::function<void()>& t : left) t();  // posted before the loop ended
  {
    absl::MutexLock lock(&sockets_mu_);
    tenant_sockets_.clear();  // each socket closed and its file removed
  }
  tenant_listen_fds_.clear();
  if (guard_ != nullptr) guard_->EndAll();
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
  if (task_fd_ >= 0) close(task_fd_);
  epoll_fd_ = wake_fd_ = task_fd_ = -1;
}

}  // namespace gpumem
