// The watcher sleeps in epoll_wait on every session's pidfd plus an eventfd
// used to stop it. The epoll entry's data is the session id, so a readable
// pidfd names the session to end directly.
#include "server/session/session_registry.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace {

int PidfdOpen(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

bool Exited(int pidfd) {
  struct pollfd p = {pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

constexpr uint64_t kWakeKey = 0;  // session ids start at 1

}  // namespace

SessionRegistry::SessionRegistry(EndCallback on_end) : on_end_(std::move(on_end)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  watcher_ = std::thread([this] { Watch(); });
}

SessionRegistry::~SessionRegistry() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  watcher_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : sessions_) {
    if (e.pidfd >= 0) close(e.pidfd);
  }
  close(wake_fd_);
  close(epoll_fd_);
}

absl::StatusOr<SessionInfo> SessionRegistry::Attach(const PeerCred& cred) {
  if (cred.pid <= 0) {
    if (cred.bound_session != 0) {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(cred.bound_session);
      if (it != sessions_.end() && it->second.info.cred.uid == cred.uid) {
        return it->second.info;
      }
    }
    return absl::PermissionDeniedError(
        "the caller's pid is not visible from the daemon's pid namespace (a "
        "container?), so its memory is reclaimed when its slab channel "
        "closes: open the slab channel first and send its session token "
        "with each call (metadata gpumem-session-token; the gpumem client "
        "library does this), or run the client in the daemon's pid namespace");
  }
  // The whole lookup-or-create runs under one lock, so concurrent first
  // calls of one process (32 threads at once) make exactly one session.
  // pidfd_open and epoll_ctl are quick, non-blocking system calls.
  absl::MutexLock lock(&mu_);
  auto it = by_pid_.find(cred.pid);
  if (it != by_pid_.end()) {
    Entry& e = sessions_[it->second];
    // The same process, even if it changed uid since: its session (and
    // memory) stays; each allocation records the uid that made it.
    if (!Exited(e.pidfd)) return e.info;
    // The pid now belongs to another process. The old session's pidfd is
    // readable, so the watcher thread ends it (never this thread: callers
    // may hold locks that on_end takes); the new process gets a new one.
    by_pid_.erase(it);
  }
  return CreateLocked(cred);
}

std::optional<SessionInfo> SessionRegistry::Find(const PeerCred& cred) const {
  absl::MutexLock lock(&mu_);
  if (cred.pid <= 0) {
    auto it = sessions_.find(cred.bound_session);
    if (it == sessions_.end() || it->second.info.cred.uid != cred.uid) return std::nullopt;
    return it->second.info;
  }
  auto it = by_pid_.find(cred.pid);
  if (it == by_pid_.end()) return std::nullopt;
  const Entry& e = sessions_.at(it->second);
  if (Exited(e.pidfd)) return std::nullopt;
  return e.info;
}

absl::StatusOr<SessionInfo> SessionRegistry::BindConnection(const PeerCred& cred) {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    return absl::InternalError(absl::StrCat("getrandom: ", strerror(errno)));
  }
  std::string token;
  for (unsigned char b : bytes) absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  absl::MutexLock lock(&mu_);
  Entry e;
  e.info.id = next_id_++;
  e.info.cred = cred;
  e.info.cred.bound_session = e.info.id;
  e.info.started = absl::Now();
  e.info.token = token;
  by_token_[token] = e.info.id;
  sessions_[e.info.id] = e;
  return e.info;
}

absl::StatusOr<uint64_t> SessionRegistry::ResolveToken(absl::string_view token,
                                                       uid_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = by_token_.find(std::string(token));
  if (it == by_token_.end() || sessions_.at(it->second).info.cred.uid != uid) {
    return absl::PermissionDeniedError(
        "unknown or ended session token (its slab channel closed?); reconnect");
  }
  return it->second;
}

absl::StatusOr<SessionInfo> SessionRegistry::CreateLocked(const PeerCred& cred) {
  int pidfd = PidfdOpen(cred.pid);
  if (pidfd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot watch caller pid ", cred.pid, ": ", strerror(errno),
        " (has the process already exited?)"));
  }
  Entry e;
  e.info.id = next_id_++;
  e.info.cred = cred;
  e.info.started = absl::Now();
  e.pidfd = pidfd;
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = e.info.id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &ev) != 0) {
    close(pidfd);
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  by_pid_[cred.pid] = e.info.id;
  sessions_[e.info.id] = e;
  return e.info;
}

bool SessionRegistry::IsLive(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  return sessions_.contains(session_id);
}

std::vector<SessionInfo> SessionRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, e] : sessions_) out.push_back(e.info);
  return out;
}

void SessionRegistry::End(uint64_t session_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;  // ended by another thread
    if (it->second.pidfd >= 0) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.pidfd, nullptr);
      close(it->second.pidfd);
    }
    if (!it->second.info.token.empty()) by_token_.erase(it->second.info.token);
    auto p = by_pid_.find(it->second.info.cred.pid);
    if (p != by_pid_.end() && p->second == session_id) by_pid_.erase(p);
    sessions_.erase(it);
  }
  on_end_(session_id);
}

void SessionRegistry::Watch() {
  struct epoll_event events[64];
  for (;;) {
    int n = epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeKey) return;
      End(events[i].data.u64);
    }
  }
}

}  // namespace gpumem
