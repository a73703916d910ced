// See ring_submitter.h. Times are measured on the steady clock; the
// daemon's answer and the wait for a slot are both bounded by the call's
// deadline.
#include "client/lib/ring/ring_submitter.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/ring/futex.h"

namespace gpumem {
namespace {

using Clock = std::chrono::steady_clock;

// A call's deadline; timeouts beyond a year are a year (no overflow).
Clock::time_point DeadlineAfter(absl::Duration timeout) {
  const absl::Duration bounded = std::min(timeout, absl::Hours(24 * 365));
  return Clock::now() + absl::ToChronoNanoseconds(std::max(bounded, absl::ZeroDuration()));
}

absl::Duration Until(Clock::time_point deadline, Clock::time_point now) {
  return absl::FromChrono(deadline - now);
}

absl::StatusCode CodeFromWord(uint32_t word) {
  return word <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)
             ? static_cast<absl::StatusCode>(word)
             : absl::StatusCode::kUnknown;
}

}  // namespace

RingSubmitter::RingSubmitter(RingRegion* region)
    : region_(region), slot_count_(region->slot_count()) {}

absl::StatusOr<RingAnswer> RingSubmitter::Call(uint32_t kind, absl::string_view request,
                                               absl::Duration timeout) {
  if (request.size() > kRingPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request ring: a request of ", request.size(),
                                                   " bytes; a slot carries at most ",
                                                   kRingPayloadBytes));
  }
  if (broken()) {
    return absl::FailedPreconditionError(
        "request ring: broken since a call went unanswered; use gRPC");
  }
  const Clock::time_point deadline = DeadlineAfter(timeout);
  absl::StatusOr<uint32_t> claimed = Claim(deadline);
  if (!claimed.ok()) return claimed.status();
  RingSlot* slot = region_->slot(*claimed);
  const uint32_t seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  slot->seq.store(seq, std::memory_order_relaxed);
  slot->kind.store(kind, std::memory_order_relaxed);
  slot->length.store(static_cast<uint32_t>(request.size()), std::memory_order_relaxed);
  slot->waiters.store(0, std::memory_order_relaxed);
  if (!request.empty()) memcpy(slot->payload, request.data(), request.size());
  // The doorbell's pair (request_ring.h): ring unless a worker is looking.
  slot->state.store(kSlotRequest, std::memory_order_seq_cst);
  if (region_->header()->reader_active.load(std::memory_order_seq_cst) == 0) {
    region_->RingDoorbell();
  }

  const Clock::time_point spin_end = Clock::now() + absl::ToChronoNanoseconds(kAnswerSpin);
  for (;;) {
    uint32_t state = slot->state.load(std::memory_order_acquire);
    if (state == kSlotAnswer) break;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      Break();
      return absl::DeadlineExceededError(
          "request ring: no answer within the call's timeout; the ring is given up");
    }
    if (now < spin_end) {
      CpuRelax();
      continue;
    }
    // The answer's pair (request_ring.h): announce the sleep, look once
    // more, then sleep while the state is what was seen.
    slot->waiters.store(1, std::memory_order_seq_cst);
    state = slot->state.load(std::memory_order_seq_cst);
    if (state == kSlotAnswer) break;
    FutexWait(&slot->state, state, Until(deadline, now));
  }
  slot->waiters.store(0, std::memory_order_relaxed);
  const uint32_t answered_seq = slot->seq.load(std::memory_order_relaxed);
  const uint32_t length = slot->length.load(std::memory_order_relaxed);
  if (answered_seq != seq || length > kRingPayloadBytes) {
    Break();
    return absl::InternalError(absl::StrCat("request ring: a malformed answer (seq ",
                                            answered_seq, " for ", seq, ", ", length,
                                            " bytes); the ring is given up"));
  }
  RingAnswer answer;
  answer.code = CodeFromWord(slot->status.load(std::memory_order_relaxed));
  answer.bytes.assign(reinterpret_cast<const char*>(slot->payload), length);
  Release(slot);
  return answer;
}

int RingSubmitter::TryClaim() {
  const uint32_t start = next_slot_.fetch_add(1, std::memory_order_relaxed);
  for (uint32_t n = 0; n < slot_count_; ++n) {
    RingSlot* slot = region_->slot((start + n) % slot_count_);
    uint32_t state = slot->state.load(std::memory_order_seq_cst);
    if (state != kSlotFree) continue;
    if (slot->state.compare_exchange_strong(state, kSlotClaimed, std::memory_order_seq_cst)) {
      return static_cast<int>((start + n) % slot_count_);
    }
  }
  return -1;
}

absl::StatusOr<uint32_t> RingSubmitter::Claim(Clock::time_point deadline) {
  int claimed = TryClaim();
  if (claimed >= 0) return static_cast<uint32_t>(claimed);
  absl::MutexLock lock(&mu_);
  slot_waiters_.fetch_add(1, std::memory_order_seq_cst);  // then TryClaim's seq_cst loads
  absl::Status refusal;
  for (;;) {
    claimed = TryClaim();
    if (claimed >= 0) break;
    if (broken()) {
      refusal = absl::FailedPreconditionError(
          "request ring: broken since a call went unanswered; use gRPC");
      break;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      refusal = absl::DeadlineExceededError(
          "request ring: every slot stayed busy for the call's timeout; nothing was sent");
      break;
    }
    const uint64_t seen = releases_;
    auto released = [this, seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return releases_ != seen; };
    mu_.AwaitWithTimeout(absl::Condition(&released), Until(deadline, now));
  }
  slot_waiters_.fetch_sub(1, std::memory_order_relaxed);
  if (claimed < 0) return refusal;
  return static_cast<uint32_t>(claimed);
}

void RingSubmitter::Release(RingSlot* slot) {
  slot->state.store(kSlotFree, std::memory_order_seq_cst);
  if (slot_waiters_.load(std::memory_order_seq_cst) > 0) {
    absl::MutexLock lock(&mu_);
    ++releases_;
  }
}

void RingSubmitter::Break() {
  broken_.store(true, std::memory_order_release);
  region_->header()->broken.store(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  ++releases_;  // callers waiting for a slot look again, and see it
}

}  // namespace gpumem
