// The shared-memory request ring (issue 40): a transport below gRPC for the
// hot calls. After its gRPC hello a client may be lent a ring: one memfd,
// sealed at its size and passed over the slab channel, that the client and
// the daemon both map, and an eventfd the client writes to wake the daemon.
// The ring holds fixed-size slots; each carries one request and then its
// answer. This file is the layout both sides share and RingRegion, one
// side's mapping of it; the daemon's reader is server/ring, the client's
// submitter client/lib/ring.
//
// Layout (host byte order: both ends are on one machine):
//   RingHeader                128 bytes: identity on the first cache line,
//                             reader_active and broken on the second
//   RingSlot[slot_count]      kRingSlotBytes each, cache-line aligned:
//                             32 bytes of words, then the payload
//
// A slot's life; each step is taken by one side only:
//   kSlotFree     --client CAS-->                              kSlotClaimed
//   kSlotClaimed  --client writes seq, kind, length, payload;
//                   release-store-->                           kSlotRequest
//   kSlotRequest  --daemon CAS, then copies the request out--> kSlotTaken
//   kSlotTaken    --daemon writes seq, status, length, payload;
//                   release-store-->                           kSlotAnswer
//   kSlotAnswer   --client reads the answer, release-store-->  kSlotFree
//
// Wake-ups: Dekker pairs, each side a store then a load of the other's
// word, both seq_cst (one total order: at least one side sees the other's
// store), so no wake-up is lost. Plain seq_cst operations rather than
// fences, which ThreadSanitizer does not model.
//   The doorbell. Client: store kSlotRequest; load reader_active; if it is
//   0, write 1 to the eventfd. Daemon, before it stops looking at the ring:
//   store reader_active = 0; scan the slots once more and serve what that
//   finds. Either the last scan sees the request, or the client sees 0 and
//   rings. While reader_active is 1 the daemon is looking and clients need
//   not ring (a syscall saved per call).
//   The answer. Client, before it sleeps: store waiters = 1; load state; if
//   it is not kSlotAnswer, FutexWait(state). Daemon: store kSlotAnswer;
//   load waiters; if it is not 0, FutexWakeAll(state).
//
// Trust: the daemon trusts nothing in the region, whose every byte the
// client may change at any time. It reads the header's identity never (it
// keeps its own slot count), keeps its own record of the slots it holds,
// copies a request out before it reads it and bounds every length by the
// slot (server/ring/ring_reader.h). The eventfd's open file, flags
// included, is the client's too, so the daemon never writes it and reads it
// only with RWF_NOWAIT (a client may clear O_NONBLOCK). A client that
// scribbles harms its own calls only. The client trusts the daemon but
// checks the identity once, at Attach, and bounds the answer's length.
#ifndef GPUMEMD_COMMON_RING_REQUEST_RING_H_
#define GPUMEMD_COMMON_RING_REQUEST_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace gpumem {

inline constexpr uint32_t kRingMagic = 0x51524d47;  // "GMRQ" in memory
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint32_t kRingMaxSlots = 256;
inline constexpr uint32_t kRingSlotBytes = 1024;
inline constexpr uint32_t kRingSlotWordBytes = 32;
// The most bytes a request or an answer carries.
inline constexpr uint32_t kRingPayloadBytes = kRingSlotBytes - kRingSlotWordBytes;

// The values of RingSlot::state. Any other value is a client's scribble and
// is left alone by the daemon.
enum RingSlotState : uint32_t {
  kSlotFree = 0,
  kSlotClaimed = 1,
  kSlotRequest = 2,
  kSlotTaken = 3,
  kSlotAnswer = 4,
};

struct alignas(64) RingHeader {
  // Written once by the daemon before the client sees the region.
  uint32_t magic;       // kRingMagic
  uint32_t version;     // kRingVersion
  uint32_t slot_count;  // 1..kRingMaxSlots
  uint32_t slot_bytes;  // kRingSlotBytes
  uint32_t reserved0[12];
  // 1 while a daemon worker is looking at the ring (the doorbell above).
  alignas(64) std::atomic<uint32_t> reader_active;
  // Set by the client when it gave up on the ring (a call timed out, so a
  // slot may still be answered into); a hint for the daemon, never trusted.
  std::atomic<uint32_t> broken;
  uint32_t reserved1[14];
};
static_assert(sizeof(RingHeader) == 128, "shared layout");
static_assert(offsetof(RingHeader, reader_active) == 64, "shared layout");

struct alignas(64) RingSlot {
  std::atomic<uint32_t> state;    // RingSlotState; the answer's futex word
  std::atomic<uint32_t> waiters;  // nonzero while the client sleeps on state
  std::atomic<uint32_t> seq;      // the client's number for the request,
                                  // written back with the answer
  std::atomic<uint32_t> kind;     // what the request asks (opaque here)
  std::atomic<uint32_t> length;   // payload bytes: the request's, then the answer's
  std::atomic<uint32_t> status;   // the answer's absl::StatusCode
  uint32_t reserved[2];
  unsigned char payload[kRingPayloadBytes];
};
static_assert(sizeof(RingSlot) == kRingSlotBytes, "shared layout");
static_assert(offsetof(RingSlot, payload) == kRingSlotWordBytes, "shared layout");

// The memfd's size for `slot_count` slots.
constexpr size_t RingLayoutBytes(uint32_t slot_count) {
  return sizeof(RingHeader) + size_t{slot_count} * kRingSlotBytes;
}

// One side's mapping of a ring and its eventfd. Owns both fds and the
// mapping; the destructor unmaps and closes. Holds no lock and starts no
// thread: what it returns is shared memory, read and written by the rules
// above.
class RingRegion {
 public:
  // Daemon side: a new ring of `slot_count` (1..kRingMaxSlots) free slots,
  // in a memfd sealed at its size (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL),
  // and a non-blocking eventfd for its doorbell. FAILED_PRECONDITION on a
  // kernel that cannot read an eventfd with RWF_NOWAIT (before Linux 5.12).
  static absl::StatusOr<std::unique_ptr<RingRegion>> Create(uint32_t slot_count);

  // Client side: maps a ring received from the daemon. Takes both fds, and
  // closes them when it refuses. Refused: a memfd not sealed against
  // shrinking and growing (FAILED_PRECONDITION); a size other than the
  // layout's for the header's slot count, a wrong magic, version or slot
  // size, a slot count of 0 or above kRingMaxSlots, an eventfd that is not
  // an open fd (INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<RingRegion>> Attach(int memfd, int eventfd);

  ~RingRegion();
  RingRegion(const RingRegion&) = delete;
  RingRegion& operator=(const RingRegion&) = delete;

  // This side's own copy, fixed at Create or Attach; never read back from
  // the region.
  uint32_t slot_count() const { return slot_count_; }
  RingHeader* header() { return static_cast<RingHeader*>(base_); }
  // `i` < slot_count().
  RingSlot* slot(uint32_t i) {
    return reinterpret_cast<RingSlot*>(static_cast<unsigned char*>(base_) + sizeof(RingHeader)) +
           i;
  }
  // The whole mapping (tests and fuzzers write over it).
  void* base() { return base_; }
  size_t size() const { return size_; }

  // Borrowed; the region keeps them open. Passed to the client over the
  // slab channel (the receiver gets its own copies).
  int memfd() const { return memfd_; }
  int eventfd() const { return eventfd_; }

  // Client: adds 1 to the eventfd (never blocks while the eventfd is
  // O_NONBLOCK, as Create makes it; a full counter is rung already). The
  // daemon never calls it: it shares the eventfd's open file with the
  // client, which could clear O_NONBLOCK and fill the counter.
  void RingDoorbell();
  // Daemon: reads the eventfd's counter back to 0 without blocking, whatever
  // the client did to the shared file's flags (preadv2 with RWF_NOWAIT).
  void DrainDoorbell();

 private:
  RingRegion(void* base, size_t size, uint32_t slot_count, int memfd, int eventfd)
      : base_(base), size_(size), slot_count_(slot_count), memfd_(memfd), eventfd_(eventfd) {}

  void* const base_;
  const size_t size_;
  const uint32_t slot_count_;
  const int memfd_;
  const int eventfd_;
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_RING_REQUEST_RING_H_
