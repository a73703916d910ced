// ConnectionLimits: who may open one more connection to the daemon, decided
// at accept, so that no uid and no tenant socket can take every file
// descriptor and the daemon always keeps some for its own work.
//
// Invariants: every connection the listener accepted is tracked from accept
// to close, gRPC's too (the listener owns every client socket for its whole
// life); counts are exact, and a refusal is never late (open fds are
// over-counted between scans, never under); root
// and the admin group keep a way in; refusals are logged, rate-limited,
// saying how many were refused and which setting refused them. Not
// thread-safe: the listener's loop thread owns it.
#ifndef GPUMEMD_SERVER_SERVICE_CONNECTION_LIMITS_H_
#define GPUMEMD_SERVER_SERVICE_CONNECTION_LIMITS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "server/defaults/defaults.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

// Three limits, each refused by closing the new connection at once, and
// what one gRPC connection may do.
struct ConnectionLimitSettings {
  // Per uid, over the main socket and every tenant socket together
  // (max_connections_per_uid); root and the admin group are not counted
  // against it. A caller through a tenant socket is never an administrator
  // (admin_group.h), so it is always counted.
  uint32_t per_uid = defaults::kMaxConnectionsPerUid;
  // Per tenant socket, whoever its callers are
  // (max_connections_per_tenant_socket).
  uint32_t per_tenant_socket = defaults::kMaxConnectionsPerTenantSocket;
  // A connection is refused when fewer than this many descriptors would be
  // left free under RLIMIT_NOFILE; root and the admin group only when fewer
  // than half of it would be.
  uint32_t fd_reserve = defaults::kFdReserve;
  // Streams a gRPC connection may have open at once: what gRPC advertises
  // (max_concurrent_streams, fixed at start as gRPC's is); the listener's
  // links hold clients to it.
  uint32_t streams_per_connection = 100;
};

class ConnectionLimits {
 public:
  // How often open fds are counted afresh (from /proc/self/fd) at most,
  // plus one per connection admitted since: an over-count between scans, so
  // a refusal is never late; a refusal near the reserve rescans first. And
  // how long a refusal waits at least before its next log line (per uid,
  // per tenant socket, and for the reserve).
  static constexpr absl::Duration kRescanEvery = absl::Milliseconds(100);
  static constexpr absl::Duration kLogEvery = absl::Seconds(1);
  // The fds one connection may hold: its socket and, once it is gRPC's, its
  // link's socket pair (h2_guard.h). Each is counted so against the reserve.
  static constexpr int kFdsPerConnection = 3;

  // `is_admin`: root or the admin group (called only when a limit is hit).
  // `log`: one line, without the "gpumemd: " prefix.
  ConnectionLimits(std::function<bool(const PeerCred&)> is_admin,
                   std::function<void(const std::string&)> log);

  void Set(const ConnectionLimitSettings& limits) { limits_ = limits; }
  const ConnectionLimitSettings& limits() const { return limits_; }

  // A connection just accepted as `fd`: true when it may stay (it is counted
  // from now on), false when the caller must close it (counted as refused,
  // and logged when its key's last line is old enough). `now` for the log.
  bool Admit(int fd, const PeerCred& cred, absl::Time now);
  // `fd` is what it will stay: a slab channel, or a gRPC link (its pair
  // open). Until then it is counted as if it might still open a link.
  void Settled(int fd);
  // The listener closed `fd`.
  void Closed(int fd);
  // Writes the refusals not yet logged whose key's last line is old enough.
  void Sweep(absl::Time now);
  // accept() failed with EMFILE/ENFILE (errno `err`): logs it at most once a
  // second with how many there were.
  void AcceptFailed(int err, absl::Time now);
  // Something refused or ended under `key` (e.g. "uid 1001"): logged now
  // when the key's last line is at least kLogEvery old, else counted into
  // its next line. `what`: "connection(s) refused"; `why` names the limit.
  void Refuse(const std::string& key, const char* what, const std::string& why,
              absl::Time now);

  // For tests and the log: connections counted for `uid` / `tenant` socket.
  size_t UidCount(uid_t uid) const;
  size_t TenantCount(uint32_t tenant) const;
  size_t tracked() const { return entries_.size(); }

 private:
  struct Entry {
    uid_t uid = 0;
    uint32_t tenant = 0;
    bool counted_for_uid = true;  // false for root and the admin group
    bool settled = false;         // Settled: holds all the fds it will
  };
  // Refusals of one key not logged yet.
  struct Refusals {
    uint64_t count = 0;
    absl::Time last_line = absl::InfinitePast();
    const char* what = "";  // "connection(s) refused"
    std::string why;        // the latest refusal's reason, naming the setting
  };

  void Forget(int fd);
  // Free fds after this connection, counted afresh when `rescan` and the
  // last count is older than kRescanEvery.
  int64_t FreeFds(absl::Time now, bool rescan);
  void Flush(Refusals& r, absl::Time now);

  std::function<bool(const PeerCred&)> is_admin_;
  std::function<void(const std::string&)> log_;
  ConnectionLimitSettings limits_;
  absl::flat_hash_map<int, Entry> entries_;
  absl::flat_hash_map<uid_t, absl::flat_hash_set<int>> by_uid_;      // counted ones
  absl::flat_hash_map<uint32_t, absl::flat_hash_set<int>> by_tenant_;  // tenant sockets
  int64_t open_at_scan_ = 0;
  int64_t unsettled_at_scan_ = 0;  // each may still open a link's two fds
  int64_t admitted_since_scan_ = 0;
  int64_t unsettled_ = 0;  // entries not Settled
  absl::Time scanned_at_ = absl::InfinitePast();
  absl::flat_hash_map<std::string, Refusals> refusals_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_CONNECTION_LIMITS_H_
