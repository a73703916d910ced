// See ring_reader.h. Each slot's record entry goes kNotHeld -> held(seq)
// (Collect, after winning the CAS on the slot's state) -> kAnswering
// (Answer, by CAS, so one answer per take) -> kNotHeld (Answer, after the
// answer is written). Collect and HasWork read the record before the slot.
//
// Answer releases the record only after it stored kSlotAnswer, so a fast
// client can publish its next request in that slot while the record still
// says kAnswering. Collect leaves such a slot for later, but HasWork counts
// it: a worker's last look before it sleeps (request_ring.h) must not miss
// a request the client did not ring for. Answer never blocks, so a later
// round or turn takes it.
#include "server/ring/ring_reader.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ring/futex.h"

namespace gpumem {

RingReader::RingReader(RingRegion* region)
    : region_(region),
      slot_count_(region->slot_count()),
      record_(new std::atomic<uint64_t>[region->slot_count()]) {
  for (uint32_t i = 0; i < slot_count_; ++i) record_[i].store(kNotHeld, std::memory_order_relaxed);
}

int RingReader::Collect(int max_requests, absl::FunctionRef<void(RingRequest)> deliver) {
  absl::MutexLock lock(&collect_mu_);
  int taken = 0;
  const uint32_t start = next_slot_;
  for (uint32_t n = 0; n < slot_count_ && taken < max_requests; ++n) {
    const uint32_t i = (start + n) % slot_count_;
    if (record_[i].load(std::memory_order_acquire) != kNotHeld) continue;
    RingSlot* slot = region_->slot(i);
    uint32_t state = slot->state.load(std::memory_order_relaxed);
    if (state != kSlotRequest) continue;
    if (!slot->state.compare_exchange_strong(state, kSlotTaken, std::memory_order_acquire,
                                             std::memory_order_relaxed)) {
      continue;
    }
    // Each word is read once; from here on only the copies count.
    RingRequest request;
    request.slot = i;
    request.seq = slot->seq.load(std::memory_order_relaxed);
    request.kind = slot->kind.load(std::memory_order_relaxed);
    const uint32_t length = slot->length.load(std::memory_order_relaxed);
    record_[i].store(kHeldBit | request.seq, std::memory_order_release);
    held_.fetch_add(1, std::memory_order_relaxed);
    ++taken;
    next_slot_ = (i + 1) % slot_count_;
    if (length > kRingPayloadBytes) {
      // Answer cannot refuse: the record holds (i, seq) and the message fits.
      Answer(i, request.seq, absl::StatusCode::kInvalidArgument,
             absl::StrCat("request ring: slot ", i, " claims a request of ", length,
                          " bytes; a slot carries at most ", kRingPayloadBytes))
          .IgnoreError();
      continue;
    }
    request.bytes.assign(reinterpret_cast<const char*>(slot->payload), length);
    deliver(std::move(request));
  }
  return taken;
}

bool RingReader::HasWork() {
  for (uint32_t i = 0; i < slot_count_; ++i) {
    // A slot held for a request is not work, whatever its state says; one
    // being answered is, if the client published in it already.
    if ((record_[i].load(std::memory_order_seq_cst) & kHeldBit) != 0) continue;
    if (region_->slot(i)->state.load(std::memory_order_seq_cst) == kSlotRequest) return true;
  }
  return false;
}

absl::Status RingReader::Answer(uint32_t slot_index, uint32_t seq, absl::StatusCode code,
                                absl::string_view bytes) {
  if (slot_index >= slot_count_) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ring: no slot ", slot_index, " in a ring of ", slot_count_));
  }
  if (bytes.size() > kRingPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request ring: an answer of ", bytes.size(),
                                                   " bytes; a slot carries at most ",
                                                   kRingPayloadBytes));
  }
  uint64_t held = kHeldBit | seq;
  if (!record_[slot_index].compare_exchange_strong(held, kAnswering, std::memory_order_acquire,
                                                   std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ring: slot ", slot_index, " is not held for request ", seq,
        held == kNotHeld ? " (not held)" : held == kAnswering ? " (being answered)" : ""));
  }
  RingSlot* slot = region_->slot(slot_index);
  slot->seq.store(seq, std::memory_order_relaxed);
  slot->status.store(static_cast<uint32_t>(code), std::memory_order_relaxed);
  slot->length.store(static_cast<uint32_t>(bytes.size()), std::memory_order_relaxed);
  if (!bytes.empty()) memcpy(slot->payload, bytes.data(), bytes.size());
  // The answer's pair (request_ring.h).
  slot->state.store(kSlotAnswer, std::memory_order_seq_cst);
  if (slot->waiters.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&slot->state);
  held_.fetch_sub(1, std::memory_order_relaxed);
  record_[slot_index].store(kNotHeld, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace gpumem
