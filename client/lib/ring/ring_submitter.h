// RingSubmitter: the client's side of a shared-memory request ring
// (common/ring/request_ring.h): one call is one slot, written, published,
// rung for if no daemon worker is looking, and waited on.
//
// A call claims a free slot (CAS kSlotFree -> kSlotClaimed), writes its
// request, release-stores kSlotRequest, then rings the doorbell unless
// reader_active says a worker is looking (the Dekker pair in
// request_ring.h). It spins for the answer for kAnswerSpin, then sleeps on
// the slot's state word (FutexWait, after announcing itself in `waiters`),
// looking again after every wake, until the answer or the timeout. It
// reads the answer and frees the slot.
//
// Guarantees: thread-safe, for any number of calling threads; each call
// gets the answer to its own request (the slot's seq is checked) or an
// error; a call returns by its timeout. When every slot is busy a call
// waits for one, within its timeout (DEADLINE_EXCEEDED, nothing sent). A
// call that times out waiting for its answer leaves its slot to the daemon,
// which may still write into it, so the submitter is broken from then on:
// it says so in the ring's header (a hint to the daemon) and every later
// call fails FAILED_PRECONDITION (the caller goes back to gRPC).
#ifndef GPUMEMD_CLIENT_LIB_RING_RING_SUBMITTER_H_
#define GPUMEMD_CLIENT_LIB_RING_RING_SUBMITTER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/ring/request_ring.h"

namespace gpumem {

// What the daemon answered: a status code and the answer's bytes (for a
// code other than OK, its message).
struct RingAnswer {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string bytes;
};

class RingSubmitter {
 public:
  static constexpr absl::Duration kAnswerSpin = absl::Microseconds(50);

  // `region` (not owned; attached, or the daemon's own in tests) outlives
  // the submitter. One submitter per ring: slots are claimed by CAS, but
  // only this submitter's threads free them.
  explicit RingSubmitter(RingRegion* region);
  RingSubmitter(const RingSubmitter&) = delete;
  RingSubmitter& operator=(const RingSubmitter&) = delete;

  // Sends `request` (at most kRingPayloadBytes, else INVALID_ARGUMENT) as a
  // request of `kind` and waits for its answer, for at most `timeout`.
  // DEADLINE_EXCEEDED at the timeout (breaking the submitter if the request
  // was sent); FAILED_PRECONDITION once broken; INTERNAL for an answer
  // that is not well formed (also breaking it).
  absl::StatusOr<RingAnswer> Call(uint32_t kind, absl::string_view request,
                                  absl::Duration timeout);

  bool broken() const { return broken_.load(std::memory_order_acquire); }
  RingRegion* region() { return region_; }

 private:
  // A free slot, claimed (kSlotClaimed); -1 if none now.
  int TryClaim();
  // Waits for TryClaim to succeed, until `deadline` or the submitter breaks.
  absl::StatusOr<uint32_t> Claim(std::chrono::steady_clock::time_point deadline);
  // Hands `slot` back (kSlotFree) and wakes a caller waiting for one.
  void Release(RingSlot* slot);
  void Break();

  RingRegion* const region_;
  const uint32_t slot_count_;
  std::atomic<uint32_t> next_seq_{1};
  std::atomic<uint32_t> next_slot_{0};  // where TryClaim starts looking
  std::atomic<bool> broken_{false};
  // Callers waiting for a free slot. They count themselves in
  // slot_waiters_ before a last TryClaim; a Release that sees them bumps
  // releases_ under mu_ (a Dekker pair of seq_cst operations: no release is
  // missed).
  std::atomic<int> slot_waiters_{0};
  absl::Mutex mu_;
  uint64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_RING_RING_SUBMITTER_H_
