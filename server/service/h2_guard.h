// H2Guard: stands between every gRPC client and gRPC, so that no client can
// make gRPC do unbounded work with the streams it opens: Debian's gRPC builds
// a call for each stream, even one reset at once (HTTP/2 rapid reset), and
// does not hold clients to the SETTINGS_MAX_CONCURRENT_STREAMS it advertises.
// Each gRPC connection is a link (the client's socket, and one end of a
// socket pair that gRPC serves); the listener's loop moves bytes both ways,
// reading frame headers in passing (h2_frame_scanner.h). Resets spend the
// principal's budget (reset_budget.h); a stream too many or a reset past the
// budget ends the link with a GOAWAY, and the principal waits out a second.
//
// Invariants: bytes pass unchanged and in order until a link ends; a
// direction holds at most one read's worth its receiver has not taken; a
// link's two fds close together. Not thread-safe: the listener's loop owns it.
#ifndef GPUMEMD_SERVER_SERVICE_H2_GUARD_H_
#define GPUMEMD_SERVER_SERVICE_H2_GUARD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/service/h2_frame_scanner.h"
#include "server/service/reset_budget.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

class H2Guard {
 public:
  // Bytes read from a side at a time, and each end of a link's socket pair
  // holds about as much: a link adds little buffering to what the client's
  // socket holds, so a client that stops reading (or dies with requests
  // unread) is held back about as soon as without it.
  static constexpr size_t kChunkBytes = 16 << 10;
  // Before a client's SETTINGS ACK, the streams it may open at once are
  // this many times max_streams.
  static constexpr uint32_t kUnsettledStreamsFactor = 4;

  // A link ended: its client's fd (closed by now) is no longer counted.
  using OnEnd = std::function<void(int client_fd)>;
  // A rate-limited log line: key, what was done, why (connection_limits.h).
  using Note = std::function<void(const std::string& key, const char* what,
                                  const std::string& why, absl::Time now)>;

  // `epoll_fd`: the loop's; the guard adds and removes its links' fds.
  // `max_streams`: what gRPC advertises (SETTINGS_MAX_CONCURRENT_STREAMS).
  H2Guard(int epoll_fd, uint32_t max_streams, OnEnd on_end, Note note);
  H2Guard(const H2Guard&) = delete;
  H2Guard& operator=(const H2Guard&) = delete;
  ~H2Guard() { EndAll(); }

  // Whether a new gRPC connection of `cred` may be served at `now`
  // (ResetBudget::Admits; noted when refused).
  bool Admits(const PeerCred& cred, absl::Time now);
  // Links `client_fd` (a gRPC client's connection, none of its bytes read,
  // not in the loop's epoll) and returns the fd to give gRPC. On failure
  // `client_fd` is still the caller's.
  absl::StatusOr<int> Link(int client_fd, const PeerCred& cred);

  // Whether `fd` is one of a link's (its events go to OnEvent).
  bool Owns(int fd) const { return by_fd_.contains(fd); }
  void OnEvent(int fd, uint32_t events);

  // Ends the links of connections through tenant `tenant`'s socket.
  void EndTenant(uint32_t tenant);
  // Ends every link.
  void EndAll();
  // Upkeep at the loop's tick; returns how many links ended since the last
  // call.
  int Sweep(absl::Time now);

  size_t links() const { return links_.size(); }

 private:
  // One direction of a link.
  struct Flow {
    explicit Flow(H2FrameScanner::Direction d) : scanner(d) {}
    H2FrameScanner scanner;
    std::string waiting;  // read, not yet taken by the receiver
  };
  struct Linked {
    int client_fd = -1;
    int grpc_fd = -1;  // the guard's end of the pair
    PeerCred cred;
    Flow up{H2FrameScanner::Direction::kFromClient};    // client -> gRPC
    Flow down{H2FrameScanner::Direction::kFromServer};  // gRPC -> client
    uint32_t last_stream = 0;                           // highest stream passed up
    absl::flat_hash_set<uint32_t> open;                 // streams the client opened, not ended
    bool settings_acked = false;                        // it knows max_streams
    uint32_t client_interest = 0;
    uint32_t grpc_interest = 0;
  };
  enum class Outcome { kGoOn, kEnd, kEndResets, kEndStreams };

  // Reads once from `from` and passes on what may pass.
  Outcome Pump(Linked& l, bool up, absl::Time now);
  // Writes what waits in `flow` to `to`.
  Outcome Flush(Flow& flow, int to);
  void Interest(Linked& l);
  // Ends `l` (destroyed); for kEndResets and kEndStreams, tells the
  // client why first.
  void End(Linked& l, Outcome why);

  const int epoll_fd_;
  const uint32_t max_streams_;
  const OnEnd on_end_;
  const Note note_;
  std::unique_ptr<char[]> chunk_;  // the read buffer, shared by all links
  ResetBudget budget_;
  absl::flat_hash_map<int, std::unique_ptr<Linked>> links_;  // by client fd
  absl::flat_hash_map<int, Linked*> by_fd_;                  // both fds
  int ended_ = 0;  // since the last Sweep
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_H2_GUARD_H_
