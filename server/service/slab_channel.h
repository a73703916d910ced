// SlabChannel: the slab-handle channel (common/fd_channel.h) as the socket
// listener serves it, apart from the sockets: how a new connection's first
// bytes tell the two protocols apart, and a channel's request bytes parsed
// and answered against the broker. The listener does the I/O; this unit is
// what it decides, so that a fuzzer can drive it with any bytes.
// Invariants of ServeSlabChannel, for any bytes: requests are answered in
// order, one answer each, as soon as all their bytes have arrived; a
// malformed request ends the connection after the answers before it; an
// answer never exceeds its bounds, and an fd given to `send` is closed by
// the unit once `send` returns.
#ifndef GPUMEMD_SERVER_SERVICE_SLAB_CHANNEL_H_
#define GPUMEMD_SERVER_SERVICE_SLAB_CHANNEL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "server/core/memory_broker.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

// What a new connection's first bytes (up to 4 so far) make it.
enum class Preface {
  kNeedMore,     // a prefix of one of the two: wait for more bytes
  kGrpc,         // "PRI " (the HTTP/2 preface)
  kSlabChannel,  // kFdChannelMagic
  kUnknown,      // neither: close it
};
Preface ClassifyPreface(const char* bytes, size_t n);

// One slab channel connection's state.
struct SlabChannelConn {
  PeerCred cred;
  std::string in;        // bytes of a partly read request
  std::string token;     // of the session bound to it (kHello, kRebind)
  std::deque<int> fds;   // received with the bytes, not yet taken by a
                         // kGiveSlab; whoever owns the conn closes the rest
};

// One answer: its bytes, and the fds to attach (-1: none): `fd` alone, or
// for kOpenRing both (the ring's memfd, then its eventfd).
struct SlabChannelReply {
  std::string bytes;
  int fd = -1;
  int fd2 = -1;
};

// A request ring lent over the channel (kOpenRing): the caller's own copies
// of the ring's fds, which the channel closes once it sent them.
struct LentRing {
  int memfd = -1;
  int eventfd = -1;
  uint64_t size = 0;  // the memfd's
};

// Who lends rings (server/service/ring_transport.h); kOpenRing asks it.
class RingLender {
 public:
  virtual ~RingLender() = default;
  // A ring of `slots` slots (0: the default; capped) for the caller's
  // session, or why not (common/fd_channel.h, kOpenRing).
  virtual absl::StatusOr<LentRing> Lend(const PeerCred& caller, uint64_t slots) = 0;
};

// Appends `data` to `conn.in` and answers each whole request in it through
// `send`, which returns false when the answer could not be sent. Returns
// false when the connection must be closed (a malformed request, or a send
// that failed).
//  - A request is whole at 16 bytes, and for kRebind with the token after
//    them (its length in slab_id, 1 to kFdChannelMaxMessage, else the
//    connection ends). A partial request waits in `conn.in`.
//  - A request with the wrong magic or version, or an unknown op, ends the
//    connection (false), after the answers to the requests before it.
//  - An answer is a SlabResponse with at most kFdChannelMaxMessage message
//    bytes after it; an fd is attached only to a successful kOpenSlab, two
//    (fd, fd2) only to a successful kOpenRing, and they are closed here
//    once `send` returns (sent or not).
//  - kOpenRing asks `rings`; without one (null) it is refused
//    FAILED_PRECONDITION "request rings are off (--request_rings=false)".
//  - kHello from a caller without a visible pid binds a session to the
//    connection once (conn.cred.bound_session, conn.token); kRebind, on a
//    channel with none yet, takes back such a session of a previous daemon
//    by its token. The caller of the unit ends it when the connection
//    closes (MemoryBroker::EndConnection).
//  - kGiveSlab takes the oldest fd of `conn.fds` (a slab's handle given
//    back after a restart) and hands it to the broker, which owns it from
//    then on; without one it is answered INVALID_ARGUMENT.
bool ServeSlabChannel(MemoryBroker* broker, SlabChannelConn& conn, absl::string_view data,
                      const std::function<bool(const SlabChannelReply&)>& send,
                      RingLender* rings = nullptr);

// The refusal of kOpenRing by a daemon whose rings are off.
absl::Status RingsOffError();

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_SLAB_CHANNEL_H_
