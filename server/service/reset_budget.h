// ResetBudget: how many HTTP/2 streams each principal may reset, as a token
// bucket per principal: a uid on the main socket, or all the callers of one
// tenant's socket together (SamePrincipal, peer_credentials.h).
//
// Resetting a stream it just opened costs a client two small frames and
// costs gRPC a call built and torn down (HTTP/2 rapid reset,
// CVE-2023-44487); a client that cancels what it no longer needs resets a
// few. A principal may reset kBurst streams at once and kPerSecond a second
// after that, over all its connections, so that reconnecting gives it
// nothing back.
//
// Invariants: a principal is tracked only while its budget is not whole;
// one principal's resets never spend another's. Not thread-safe: the
// listener's loop thread owns it.
#ifndef GPUMEMD_SERVER_SERVICE_RESET_BUDGET_H_
#define GPUMEMD_SERVER_SERVICE_RESET_BUDGET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

class ResetBudget {
 public:
  static constexpr double kBurst = 256;
  static constexpr double kPerSecond = 32;

  // Spends one reset of `cred`'s principal at `now`: false when none was
  // left (nothing is spent then).
  bool Spend(const PeerCred& cred, absl::Time now);
  // Spends everything `cred`'s principal has left (a connection of it broke
  // the protocol): its new connections wait a second.
  void SpendAll(const PeerCred& cred, absl::Time now);
  // Whether a new connection of `cred`'s principal may be served at `now`:
  // not while it has less than a second's worth of resets (kPerSecond)
  // left, so that one that spent its budget waits a second.
  bool Admits(const PeerCred& cred, absl::Time now) const;
  // Forgets the principals whose budget is whole again by `now`.
  void Sweep(absl::Time now);

  // For log lines: "uid N" or "tenant T's socket".
  static std::string PrincipalName(const PeerCred& cred);
  // Principals tracked (whose budget is not whole).
  size_t tracked() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens = kBurst;
    absl::Time at;  // when `tokens` was counted
  };
  static uint64_t Key(const PeerCred& cred);
  static double TokensAt(const Bucket& b, absl::Time now);

  absl::flat_hash_map<uint64_t, Bucket> buckets_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_RESET_BUDGET_H_
