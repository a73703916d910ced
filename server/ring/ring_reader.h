// RingReader: the daemon's view of one request ring (common/ring/
// request_ring.h), which it treats as hostile input: the client may change
// any byte of the region at any instant, including while the reader looks.
//
// Invariants, whatever the region holds:
// - A request reaches the caller only after the reader took its slot
//   (CAS kSlotRequest -> kSlotTaken) and copied kind, seq, length and
//   payload out of the region into private memory; nothing is read twice
//   from the region. Its length is at most kRingPayloadBytes: a slot that
//   claims more is answered INVALID_ARGUMENT by the reader itself (the
//   answer's payload is the message), and its payload is not read.
// - The reader's own record (private memory), never the slot's state word,
//   says which slots it holds and for which seq. A slot it holds is not
//   taken again, whatever its state says (a state scribbled back to
//   kSlotRequest is ignored until the slot is answered), and Answer writes
//   only into a slot the record holds for that seq, once.
// - Every index and length is bounded before use; no call waits for
//   anything the client does (no lock is shared with it, and the region is
//   sealed at its size, so it cannot fault).
// - Collect does a bounded amount of work: it looks at each slot at most
//   once and takes at most max_requests.
//
// Threads: one Collect at a time (RingPoller serves a ring on one worker at
// a time; calls overlapping anyway are serialised). Answer may come from
// any thread at any time, before, during or after a Collect, so a request
// that waits for something holds no thread.
#ifndef GPUMEMD_SERVER_RING_RING_READER_H_
#define GPUMEMD_SERVER_RING_RING_READER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/ring/request_ring.h"

namespace gpumem {

// One request, copied out of its slot. Answer it with (slot, seq).
struct RingRequest {
  uint32_t slot = 0;
  uint32_t seq = 0;
  uint32_t kind = 0;
  std::string bytes;  // at most kRingPayloadBytes
};

class RingReader {
 public:
  // `region` (not owned) outlives the reader.
  explicit RingReader(RingRegion* region);
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  // Takes the requests waiting in the ring, at most `max_requests`, each
  // handed to `deliver` (which may call Answer at once, or leave the answer
  // to any thread later). Returns how many slots it took, the ones it
  // answered itself (a bad length) included. Slots are looked at from where
  // the last take left off, so no slot waits behind the others.
  int Collect(int max_requests, absl::FunctionRef<void(RingRequest)> deliver);

  // True when a slot holds a request that Collect would take now, or as
  // soon as an Answer under way on that slot returns.
  bool HasWork();

  // Writes the answer into `slot` and hands the slot back to the client
  // (kSlotAnswer, then a futex wake if the client sleeps). Refused,
  // writing nothing: a slot the reader does not hold for `seq`, not held at
  // all, or answered already (FAILED_PRECONDITION); bytes longer than
  // kRingPayloadBytes (INVALID_ARGUMENT: the slot stays held, answer it
  // again). For a code other than OK, `bytes` is the message.
  absl::Status Answer(uint32_t slot, uint32_t seq, absl::StatusCode code,
                      absl::string_view bytes);

  // Slots taken and not answered yet.
  int held() const { return held_.load(std::memory_order_relaxed); }
  RingRegion* region() { return region_; }

 private:
  // A slot's entry in the record: kNotHeld, or kHeldBit | seq while a
  // request is held, or kAnswering while Answer writes it.
  static constexpr uint64_t kNotHeld = 0;
  static constexpr uint64_t kHeldBit = uint64_t{1} << 32;
  static constexpr uint64_t kAnswering = uint64_t{2} << 32;

  RingRegion* const region_;
  const uint32_t slot_count_;
  const std::unique_ptr<std::atomic<uint64_t>[]> record_;
  std::atomic<int> held_{0};
  absl::Mutex collect_mu_;
  uint32_t next_slot_ ABSL_GUARDED_BY(collect_mu_) = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_RING_RING_READER_H_
