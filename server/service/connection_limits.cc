// See connection_limits.h.
#include "server/service/connection_limits.h"

#include <dirent.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shrink_if_sparse.h"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace gpumem {
namespace {

// Counting /proc/self/fd opens a directory whose fd may take a number gRPC
// just closed. Under ThreadSanitizer, which is told to ignore what gRPC
// does (its close() included, common/tsan_support.cc), that would read as
// a race on the fd with gRPC, so the count is not shown to it; nothing else
// of this thread is hidden.
class FdProbe {
 public:
#if defined(__SANITIZE_THREAD__)
  FdProbe() { __tsan_ignore_thread_begin(); }
  ~FdProbe() { __tsan_ignore_thread_end(); }
#else
  FdProbe() {}  // user-provided: a scope, not an unused variable
#endif
  FdProbe(const FdProbe&) = delete;
  FdProbe& operator=(const FdProbe&) = delete;
};

// Fds open in this process now (-1 when they cannot be counted: then no fd
// is left even for the directory).
int64_t CountOpenFds() {
  FdProbe probe;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t n = 0;
  while (struct dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory's own fd
}

int64_t FdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int64_t>(rl.rlim_cur);
}

}  // namespace

ConnectionLimits::ConnectionLimits(std::function<bool(const PeerCred&)> is_admin,
                                   std::function<void(const std::string&)> log)
    : is_admin_(std::move(is_admin)), log_(std::move(log)) {}

void ConnectionLimits::Forget(int fd) {
  auto it = entries_.find(fd);
  if (it == entries_.end()) return;
  const Entry e = it->second;
  if (!e.settled) --unsettled_;
  entries_.erase(it);
  ShrinkIfSparse(entries_);  // what a flood of connections grew is given back
  if (e.counted_for_uid) {
    auto u = by_uid_.find(e.uid);
    if (u != by_uid_.end()) {
      u->second.erase(fd);
      ShrinkIfSparse(u->second);
      if (u->second.empty()) by_uid_.erase(u);
    }
  }
  if (e.tenant != 0) {
    auto t = by_tenant_.find(e.tenant);
    if (t != by_tenant_.end()) {
      t->second.erase(fd);
      ShrinkIfSparse(t->second);
      if (t->second.empty()) by_tenant_.erase(t);
    }
  }
}

int64_t ConnectionLimits::FreeFds(absl::Time now, bool rescan) {
  if (rescan && now - scanned_at_ >= kRescanEvery) {
    const int64_t open = CountOpenFds();
    scanned_at_ = now;
    admitted_since_scan_ = 0;
    open_at_scan_ = open < 0 ? FdLimit() : open;
    unsettled_at_scan_ = unsettled_;
  }
  return FdLimit() - open_at_scan_ - unsettled_at_scan_ * (kFdsPerConnection - 1) -
         admitted_since_scan_ * kFdsPerConnection;
}

bool ConnectionLimits::Admit(int fd, const PeerCred& cred, absl::Time now) {
  // The kernel handed this number out again: what it named before is gone.
  Forget(fd);
  std::optional<bool> admin;
  auto is_admin = [&] {
    if (!admin.has_value()) admin = is_admin_(cred);
    return *admin;
  };

  // The fd reserve.
  const int64_t reserve = limits_.fd_reserve;
  // This connection's socket is open already; a link would add two more.
  constexpr int64_t kLinkFds = kFdsPerConnection - 1;
  int64_t free = FreeFds(now, /*rescan=*/scanned_at_ == absl::InfinitePast()) - kLinkFds;
  if (free < reserve) free = FreeFds(now, /*rescan=*/true) - kLinkFds;
  if (free < reserve && !(free >= reserve / 2 && is_admin())) {
    Refuse("fds", "connection(s) refused",
           absl::StrCat(free < 0 ? 0 : free, " file descriptor(s) free under RLIMIT_NOFILE ",
                        FdLimit(), ", fewer than --fd_reserve=", reserve,
                        " (DaemonConfig.fd_reserve) keeps for the daemon's own work"),
           now);
    return false;
  }

  // The tenant socket's cap.
  if (cred.socket_tenant != 0) {
    auto t = by_tenant_.find(cred.socket_tenant);
    if (t != by_tenant_.end() && t->second.size() >= limits_.per_tenant_socket) {
      Refuse(absl::StrCat("tenant ", cred.socket_tenant), "connection(s) refused",
             absl::StrCat("tenant ", cred.socket_tenant, "'s socket holds ", t->second.size(),
                          " connection(s), the most --max_connections_per_tenant_socket=",
                          limits_.per_tenant_socket,
                          " (DaemonConfig.max_connections_per_tenant_socket) allows"),
             now);
      return false;
    }
  }

  // The uid's cap: root on the main socket is never counted; an admin-group
  // member only once past it.
  bool counted = !(cred.uid == 0 && cred.socket_tenant == 0);
  if (counted) {
    auto u = by_uid_.find(cred.uid);
    if (u != by_uid_.end() && u->second.size() >= limits_.per_uid) {
      if (is_admin()) {
        counted = false;
      } else {
        Refuse(absl::StrCat("uid ", cred.uid), "connection(s) refused",
               absl::StrCat("uid ", cred.uid, " holds ", u->second.size(),
                            " connection(s), the most --max_connections_per_uid=",
                            limits_.per_uid, " (DaemonConfig.max_connections_per_uid) allows"),
               now);
        return false;
      }
    }
  }

  Entry e;
  e.uid = cred.uid;
  e.tenant = cred.socket_tenant;
  e.counted_for_uid = counted;
  entries_[fd] = e;
  ++unsettled_;
  if (counted) by_uid_[cred.uid].insert(fd);
  if (e.tenant != 0) by_tenant_[e.tenant].insert(fd);
  ++admitted_since_scan_;
  return true;
}

void ConnectionLimits::Settled(int fd) {
  auto it = entries_.find(fd);
  if (it == entries_.end() || it->second.settled) return;
  it->second.settled = true;
  --unsettled_;
}

void ConnectionLimits::Closed(int fd) { Forget(fd); }

void ConnectionLimits::Sweep(absl::Time now) {
  std::vector<std::string> idle;
  for (auto& [key, r] : refusals_) {
    if (now - r.last_line < kLogEvery) continue;
    if (r.count > 0) {
      Flush(r, now);
    } else {
      idle.push_back(key);
    }
  }
  for (const std::string& key : idle) refusals_.erase(key);
  ShrinkIfSparse(refusals_);
}

void ConnectionLimits::AcceptFailed(int err, absl::Time now) {
  Refuse("accept", "accept failure(s)",
         absl::StrCat(strerror(err), " (RLIMIT_NOFILE ", FdLimit(),
                      "): accepting paused briefly; the daemon's own work has --fd_reserve=",
                      limits_.fd_reserve, " (DaemonConfig.fd_reserve)"),
         now);
}

void ConnectionLimits::Refuse(const std::string& key, const char* what, const std::string& why,
                              absl::Time now) {
  Refusals& r = refusals_[key];
  ++r.count;
  r.what = what;
  r.why = why;
  if (now - r.last_line >= kLogEvery) Flush(r, now);
}

void ConnectionLimits::Flush(Refusals& r, absl::Time now) {
  log_(absl::StrCat(r.count, " ", r.what, " since the last such line: ", r.why));
  r.count = 0;
  r.last_line = now;
}

size_t ConnectionLimits::UidCount(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : it->second.size();
}

size_t ConnectionLimits::TenantCount(uint32_t tenant) const {
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? 0 : it->second.size();
}

}  // namespace gpumem
