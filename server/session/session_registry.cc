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

#include <algorithm>
#include <cstdio>
#include <cstdlib>

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

// The kernel's start time of process `pid` (clock ticks since boot, field
// 22 of /proc/PID/stat), which tells a process from a later one given the
// same pid; 0 when it cannot be read.
uint64_t StartTicks(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "re");
  if (f == nullptr) return 0;
  char buf[1024];
  const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may hold spaces: count
  // fields after its closing one.
  const char* p = strrchr(buf, ')');
  if (p == nullptr) return 0;
  int field = 2;
  for (++p; *p != '\0' && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  return strtoull(p, nullptr, 10);
}

constexpr uint64_t kWakeKey = 0;  // session ids start at 1

}  // namespace

SessionRegistry::SessionRegistry(EndCallback on_end, state::DurableState* state)
    : on_end_(std::move(on_end)), state_(state) {
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

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Attach(const PeerCred& cred) {
  if (cred.pid <= 0) {
    if (cred.bound_session != 0) {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(cred.bound_session);
      if (it != sessions_.end() && SamePrincipal(it->second.session->cred(), cred)) {
        return it->second.session;
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
  auto it = by_pid_.find(KeyOf(cred));
  if (it != by_pid_.end()) {
    Entry& e = sessions_[it->second];
    // The same process, even if it changed uid since: its session (and
    // memory) stays; each allocation records the uid that made it.
    if (!Exited(e.pidfd)) return e.session;
    // The pid now belongs to another process. The old session's pidfd is
    // readable, so the watcher thread ends it (never this thread: callers
    // may hold locks that on_end takes); the new process gets a new one.
    by_pid_.erase(it);
  }
  return CreateLocked(cred);
}

std::shared_ptr<Session> SessionRegistry::Find(const PeerCred& cred) const {
  absl::MutexLock lock(&mu_);
  if (cred.pid <= 0) {
    auto it = sessions_.find(cred.bound_session);
    if (it == sessions_.end() || !SamePrincipal(it->second.session->cred(), cred)) {
      return nullptr;
    }
    return it->second.session;
  }
  auto it = by_pid_.find(KeyOf(cred));
  if (it == by_pid_.end()) return nullptr;
  const Entry& e = sessions_.at(it->second);
  if (Exited(e.pidfd)) return nullptr;
  return e.session;
}

std::shared_ptr<Session> SessionRegistry::Get(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second.session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::BindConnection(
    const PeerCred& cred) {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    return absl::InternalError(absl::StrCat("getrandom: ", strerror(errno)));
  }
  std::string token;
  for (unsigned char b : bytes) absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  PeerCred bound = cred;
  bound.bound_session = id;
  Entry e;
  e.session = std::make_shared<Session>(id, bound, token, state_);
  by_token_[token] = id;
  sessions_[id] = e;
  return e.session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Restore(
    const state::SessionRecord& r, std::optional<tenants::TenantRef> tenant) {
  PeerCred cred{r.pid, r.uid, r.gid, 0};
  if (r.via_socket) {
    // Its principal is its socket tenant, as the directory in force numbers
    // it now (the caller checked that the tenant still has a socket).
    if (!tenant.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "session ", r.id, " came through a tenant's socket, and that tenant is gone"));
    }
    cred.socket_tenant = tenant->id;
  }
  absl::MutexLock lock(&mu_);
  next_id_ = std::max(next_id_, r.id + 1);
  if (sessions_.contains(r.id)) {
    return absl::AlreadyExistsError(absl::StrCat("session ", r.id, " restored twice"));
  }
  Entry e;
  if (r.bound) {
    cred.pid = 0;
    cred.bound_session = r.id;
    e.session = std::make_shared<Session>(r.id, cred, r.token_string(), state_, 0, r.slot,
                                          std::move(tenant));
    by_token_[r.token_string()] = r.id;
    unbound_.insert(r.id);
    sessions_[r.id] = e;
    return e.session;
  }
  const int pidfd = r.pid > 0 ? PidfdOpen(r.pid) : -1;
  if (pidfd < 0 || Exited(pidfd) || StartTicks(r.pid) != r.start_ticks) {
    if (pidfd >= 0) close(pidfd);
    return absl::NotFoundError(absl::StrCat(
        "the process of session ", r.id, " (pid ", r.pid, ") is gone"));
  }
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = r.id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &ev) != 0) {
    close(pidfd);
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  e.session = std::make_shared<Session>(r.id, cred, "", state_, r.start_ticks, r.slot,
                                        std::move(tenant));
  e.pidfd = pidfd;
  by_pid_[KeyOf(cred)] = r.id;
  sessions_[r.id] = e;
  return e.session;
}

void SessionRegistry::AdvanceIdsPast(uint64_t id) {
  absl::MutexLock lock(&mu_);
  next_id_ = std::max(next_id_, id + 1);
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::RebindConnection(
    absl::string_view token, const PeerCred& cred) {
  absl::MutexLock lock(&mu_);
  auto it = by_token_.find(std::string(token));
  if (it == by_token_.end() || !unbound_.contains(it->second) ||
      !SamePrincipal(sessions_.at(it->second).session->cred(), cred)) {
    return absl::PermissionDeniedError(
        "no session of this caller waits for that token (it was not restored, was "
        "rebound already, expired, or is another uid's or another tenant socket's): "
        "start a new session");
  }
  unbound_.erase(it->second);
  return sessions_.at(it->second).session;
}

int SessionRegistry::ExpireUnbound() {
  std::vector<uint64_t> expired;
  {
    absl::MutexLock lock(&mu_);
    expired.assign(unbound_.begin(), unbound_.end());
    unbound_.clear();
  }
  for (uint64_t id : expired) EndSession(id);
  return static_cast<int>(expired.size());
}

absl::StatusOr<uint64_t> SessionRegistry::ResolveToken(absl::string_view token,
                                                       const PeerCred& cred) const {
  absl::MutexLock lock(&mu_);
  auto it = by_token_.find(std::string(token));
  // A token works only for the principal that opened its session: a token
  // of one tenant's socket presented on another's (or on the main socket)
  // names nothing.
  if (it == by_token_.end() || !SamePrincipal(sessions_.at(it->second).session->cred(), cred)) {
    return absl::PermissionDeniedError(
        "unknown or ended session token (its slab channel closed?); reconnect");
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::CreateLocked(
    const PeerCred& cred) {
  int pidfd = PidfdOpen(cred.pid);
  if (pidfd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot watch caller pid ", cred.pid, ": ", strerror(errno),
        " (has the process already exited?)"));
  }
  const uint64_t id = next_id_++;
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &ev) != 0) {
    close(pidfd);
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  Entry e;
  e.session = std::make_shared<Session>(id, cred, "", state_, StartTicks(cred.pid));
  e.pidfd = pidfd;
  by_pid_[KeyOf(cred)] = id;
  sessions_[id] = e;
  return e.session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (const auto& [id, e] : sessions_) out.push_back(e.session);
  return out;
}

std::shared_ptr<Session> SessionRegistry::RemoveLocked(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return nullptr;  // ended by another thread
  if (it->second.pidfd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.pidfd, nullptr);
    close(it->second.pidfd);
  }
  std::shared_ptr<Session> session = std::move(it->second.session);
  if (!session->token().empty()) by_token_.erase(session->token());
  unbound_.erase(session_id);
  auto p = by_pid_.find(KeyOf(session->cred()));
  if (p != by_pid_.end() && p->second == session_id) by_pid_.erase(p);
  sessions_.erase(it);
  return session;
}

std::optional<size_t> SessionRegistry::EndSession(uint64_t session_id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    session = RemoveLocked(session_id);
  }
  if (session == nullptr) return std::nullopt;
  std::vector<uint64_t> ids = session->End();
  const size_t held = ids.size();
  on_end_(session, std::move(ids));
  return held;
}

std::vector<SessionRegistry::Taken> SessionRegistry::TakeSessions(
    const std::function<bool(const Session&)>& pick) {
  std::vector<Taken> taken;
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, e] : sessions_) {
    if (pick(*e.session)) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    Taken t;
    t.session = RemoveLocked(id);
    t.allocation_ids = t.session->End();
    taken.push_back(std::move(t));
  }
  return taken;
}

void SessionRegistry::FinishSessions(std::vector<Taken> taken) {
  for (Taken& t : taken) on_end_(t.session, std::move(t.allocation_ids));
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
      EndSession(events[i].data.u64);
    }
  }
}

}  // namespace gpumem
