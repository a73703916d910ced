// The slab-handle channel: the second protocol on the daemon's socket.
//
// gRPC cannot carry file descriptors, so a client fetches a slab's handle on
// a plain Unix stream connection to the same socket path. The daemon tells
// the two protocols apart by the first four bytes: a gRPC client starts with
// the HTTP/2 preface "PRI ", this channel with kFdChannelMagic. The caller's
// identity comes from SO_PEERCRED on this connection, never from the request.
//
// Wire format (host byte order, both ends are on one machine):
//   request  := SlabRequest                          (16 bytes)
//   response := SlabResponse [message bytes]         (fd attached to a
//                                                     successful kOpenSlab;
//                                                     two to a successful
//                                                     kOpenRing)
// One connection carries any number of request/response pairs in turn; a
// connection that sends anything but a SlabOp request is closed.
#ifndef GPUMEMD_COMMON_FD_CHANNEL_H_
#define GPUMEMD_COMMON_FD_CHANNEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace gpumem {

inline constexpr char kFdChannelMagic[4] = {'G', 'M', 'S', 'L'};
inline constexpr uint16_t kFdChannelVersion = 2;
inline constexpr uint32_t kFdChannelMaxMessage = 1024;

enum class SlabOp : uint16_t {
  // A new fd for the slab's handle; the daemon records that the caller's
  // session holds the slab from then on.
  kOpenSlab = 1,
  // The caller unmapped the slab and holds no handle to it any more, so a
  // released slab need not stay retained for it.
  kCloseSlab = 2,
  // Sent first by the client library. For a caller whose pid the daemon
  // cannot see (another pid namespace), the daemon binds a session to this
  // connection (its memory is freed when the connection closes) and answers
  // with the session's token as the message bytes; the client sends it as
  // gRPC metadata kSessionTokenHeader. Others get no token.
  kHello = 3,
  // After a daemon restart (ResumeResponse.needs_handle): the caller hands
  // back the handle of a slab it holds open, as the fd attached to this
  // request; the daemon checks it is that slab's (same memory) and of the
  // caller's tenant.
  kGiveSlab = 4,
  // After a daemon restart, instead of kHello: binds the restored
  // connection-bound session whose token follows the request (slab_id: the
  // token's length, at most kFdChannelMaxMessage) to this connection;
  // answers the token. Refused (PERMISSION_DENIED) for a token that is
  // unknown, of another uid, rebound already or expired.
  kRebind = 5,
  // Lends the caller's session a request ring (common/ring/request_ring.h):
  // slab_id is the slot count wanted (0: kDefaultRingSlots; more than
  // kRingMaxSlots is capped). The answer carries two fds, the ring's sealed
  // memfd then its eventfd, and slab_size is the memfd's size. The ring
  // belongs to the session (found as for kOpenSlab: by pid, or the session
  // bound to this channel) and ends with it. Refused: rings off
  // (FAILED_PRECONDITION "request rings are off (--request_rings=false)"),
  // a session that has a ring already (ALREADY_EXISTS), too many rings for
  // the caller's uid or in all (RESOURCE_EXHAUSTED), a caller with no
  // session (PERMISSION_DENIED, as kOpenSlab). New in version 2: an older
  // daemon closes the channel at this op (an unknown op).
  kOpenRing = 6,
};

// kOpenRing's slot count when the request asks for 0.
inline constexpr uint32_t kDefaultRingSlots = 64;

// A daemon that stops for good (it released every allocation) writes one
// unasked response before it closes each channel: code UNAVAILABLE,
// slab_size kFdChannelGoodbyeMark, message kFdChannelGoodbye. A client that
// reads it knows nothing it held survives and need not wait for a restart;
// a daemon that crashes, or stops to restart, says nothing.
inline constexpr uint64_t kFdChannelGoodbyeMark = UINT64_MAX;
inline constexpr char kFdChannelGoodbye[] =
    "gpumemd stopped for good and released every allocation";
// True for the status a request gets when the daemon's goodbye came as its
// answer.
bool IsFdChannelGoodbye(const absl::Status& status);
// Client side: reads a goodbye waiting on `channel`, without blocking;
// true if there was one.
bool ReadFdChannelGoodbye(int channel);

// gRPC metadata key carrying a connection-bound session's token.
inline constexpr char kSessionTokenHeader[] = "gpumem-session-token";

struct SlabRequest {
  char magic[4];      // kFdChannelMagic
  uint16_t version;   // kFdChannelVersion
  uint16_t op;        // SlabOp
  uint64_t slab_id;
};
static_assert(sizeof(SlabRequest) == 16, "wire layout");

struct SlabResponse {
  uint32_t code;          // absl::StatusCode; 0 = OK and an fd is attached
  uint32_t message_len;   // bytes that follow (<= kFdChannelMaxMessage): error
                          // text, or kHello's token
  uint64_t slab_size;     // bytes to map, on success
};
static_assert(sizeof(SlabResponse) == 16, "wire layout");

struct SlabFd {
  int fd = -1;
  uint64_t size = 0;
};

// Client side: connects to `socket_path`; returns the connected fd.
absl::StatusOr<int> ConnectFdChannel(const std::string& socket_path);

// Client side: asks for `slab_id` on a connected channel. On success the
// caller owns the returned fd.
absl::StatusOr<SlabFd> RequestSlabFd(int channel, uint64_t slab_id);

// A lent request ring's two fds, both the caller's to close (or to hand to
// RingRegion::Attach, which takes them).
struct RingFds {
  int memfd = -1;
  int eventfd = -1;
};

// Client side: asks for a request ring of `slots` slots (kOpenRing).
absl::StatusOr<RingFds> OpenRingFdChannel(int channel, uint32_t slots);

// Client side: tells the daemon this process closed `slab_id`.
absl::Status CloseSlabFd(int channel, uint64_t slab_id);

// Client side: the hello; the session token, empty when none is needed.
// *answered (when given) is false when the daemon hung up or the receive
// timed out before any answer came: a daemon that died or is restarting,
// as opposed to one that refused.
absl::StatusOr<std::string> HelloFdChannel(int channel, bool* answered = nullptr);

// Client side, after a restart: hands `fd` (a slab's handle, still the
// caller's) back for `slab_id`.
absl::Status GiveSlabFd(int channel, uint64_t slab_id, int fd);

// Client side, after a restart: binds the restored session of `token` to
// this channel.
absl::Status RebindFdChannel(int channel, const std::string& token);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_FD_CHANNEL_H_
