// Fuzzes RingReader (server/ring/ring_reader.h), the daemon's reader of a
// shared-memory request ring, whose every byte the client controls.
//
// Input: byte 0 picks the ring's slot count (1 to 256); the rest is a
// sequence of steps, each an op byte and its operands: scribble bytes
// anywhere in the region (header included), set a slot's state word to any
// value, set its length word, publish a request as a client would (any
// length, also past the slot), Collect (any bound), Answer a request the
// reader holds (or one it does not: another seq, another slot, a slot past
// the ring, an answer too long, a second answer).
//
// A model of the slots the reader holds, built only from what Collect
// delivered, checks on every step:
// - every request delivered was in a slot whose state was kSlotRequest and
//   that the reader did not hold, and equals that slot's words and payload
//   as they were before Collect; its length is at most kRingPayloadBytes;
// - a slot that claimed more is answered INVALID_ARGUMENT and not
//   delivered; Collect takes at most its bound, and below it takes every
//   request it may; it writes nothing into a slot it did not take;
// - Answer succeeds exactly for a slot the model holds with that seq and
//   an answer that fits, writes only that slot (state, seq, status, length,
//   payload), and otherwise changes nothing;
// - held() and HasWork() agree with the model.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/ring/request_ring.h"
#include "server/ring/ring_reader.h"

namespace gpumem {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "ring_reader_fuzzer: %s\n", what);
    abort();
  }
}

// Reads operands from the input; zeros once it runs out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ == end_; }
  uint8_t Byte() { return p_ < end_ ? *p_++ : 0; }
  uint32_t Word(int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | Byte();
    return v;
  }
  // `n` bytes drawn from what follows, without consuming it (a payload of
  // 992 bytes does not end the steps); past the end, counting bytes.
  std::string Bytes(size_t n) {
    std::string s;
    s.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      s.push_back(static_cast<char>(p_ < end_ ? p_[i % static_cast<size_t>(end_ - p_)] : i));
    }
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

constexpr uint32_t kSlotCounts[8] = {1, 2, 3, 4, 8, 16, 64, 256};

struct Fuzz {
  std::unique_ptr<RingRegion> region;
  std::unique_ptr<RingReader> reader;
  std::map<uint32_t, uint32_t> held;  // the model: slot -> seq
  std::vector<unsigned char> before;

  unsigned char* base() { return static_cast<unsigned char*>(region->base()); }
  size_t slot_offset(uint32_t i) { return sizeof(RingHeader) + size_t{i} * kRingSlotBytes; }
  const RingSlot* before_slot(uint32_t i) {
    return reinterpret_cast<const RingSlot*>(before.data() + slot_offset(i));
  }
  uint32_t word(const RingSlot* s, size_t offset) {
    uint32_t v;
    memcpy(&v, reinterpret_cast<const unsigned char*>(s) + offset, sizeof(v));
    return v;
  }
  uint32_t before_state(uint32_t i) { return word(before_slot(i), offsetof(RingSlot, state)); }
  void Snapshot() { memcpy(before.data(), base(), before.size()); }
  bool SlotUnchanged(uint32_t i) {
    return memcmp(before.data() + slot_offset(i), base() + slot_offset(i), kRingSlotBytes) == 0;
  }
  bool HeaderUnchanged() { return memcmp(before.data(), base(), sizeof(RingHeader)) == 0; }

  void CheckModel() {
    Check(reader->held() == static_cast<int>(held.size()), "held() is not the model's");
    bool work = false;
    for (uint32_t i = 0; i < region->slot_count(); ++i) {
      if (!held.count(i) && region->slot(i)->state.load() == kSlotRequest) work = true;
    }
    Check(reader->HasWork() == work, "HasWork() is not the model's");
  }

  void Collect(int max) {
    Snapshot();
    std::map<uint32_t, RingRequest> delivered;
    const int taken = reader->Collect(max, [&](RingRequest r) {
      Check(r.slot < region->slot_count(), "a request from a slot past the ring");
      Check(!held.count(r.slot), "a request from a slot the reader holds");
      Check(!delivered.count(r.slot), "a slot delivered twice in one Collect");
      const RingSlot* s = before_slot(r.slot);
      Check(before_state(r.slot) == kSlotRequest, "a request from a slot not in kSlotRequest");
      Check(r.seq == word(s, offsetof(RingSlot, seq)), "seq is not the slot's");
      Check(r.kind == word(s, offsetof(RingSlot, kind)), "kind is not the slot's");
      Check(r.bytes.size() <= kRingPayloadBytes, "a request longer than a slot's payload");
      Check(r.bytes.size() == word(s, offsetof(RingSlot, length)), "length is not the slot's");
      Check(memcmp(r.bytes.data(), s->payload, r.bytes.size()) == 0,
            "payload is not the slot's");
      delivered.emplace(r.slot, std::move(r));
    });
    Check(taken >= 0 && taken <= (max < 0 ? 0 : max), "Collect took more than its bound");
    int refused = 0;
    for (uint32_t i = 0; i < region->slot_count(); ++i) {
      const bool takeable = !held.count(i) && before_state(i) == kSlotRequest;
      const uint32_t length = word(before_slot(i), offsetof(RingSlot, length));
      RingSlot* now = region->slot(i);
      if (delivered.count(i)) {
        Check(now->state.load() == kSlotTaken, "a delivered slot is not kSlotTaken");
        held[i] = delivered[i].seq;
        continue;
      }
      if (takeable && length > kRingPayloadBytes && !SlotUnchanged(i)) {
        // Refused by the reader itself.
        ++refused;
        Check(now->state.load() == kSlotAnswer, "a bad length was not answered");
        Check(now->status.load() == static_cast<uint32_t>(absl::StatusCode::kInvalidArgument),
              "a bad length was not answered INVALID_ARGUMENT");
        Check(now->seq.load() == word(before_slot(i), offsetof(RingSlot, seq)),
              "a bad length's answer has another seq");
        Check(now->length.load() <= kRingPayloadBytes, "a refusal's message is too long");
        continue;
      }
      Check(SlotUnchanged(i), "Collect wrote into a slot it did not take");
      if (takeable && taken < max) Check(false, "Collect left a request below its bound");
    }
    Check(taken == static_cast<int>(delivered.size()) + refused,
          "Collect's count is not what it delivered and refused");
    Check(HeaderUnchanged(), "Collect wrote into the header");
    // Some answers at once (the rest wait: a request may be held for long).
    for (auto& [slot, r] : delivered) {
      if ((r.seq ^ r.kind) & 1) continue;
      Answer(slot, r.seq, absl::StatusCode::kOk, r.bytes);
    }
  }

  void Answer(uint32_t slot, uint32_t seq, absl::StatusCode code, const std::string& bytes) {
    Snapshot();
    const absl::Status s = reader->Answer(slot, seq, code, bytes);
    auto it = held.find(slot);
    const bool may = it != held.end() && it->second == seq && bytes.size() <= kRingPayloadBytes;
    if (!may) {
      Check(!s.ok(), "Answer wrote a slot the reader does not hold for that seq");
      Check(memcmp(before.data(), base(), before.size()) == 0, "a refused Answer wrote");
      return;
    }
    Check(s.ok(), "Answer refused a slot the reader holds");
    held.erase(it);
    RingSlot* now = region->slot(slot);
    Check(now->state.load() == kSlotAnswer && now->seq.load() == seq &&
              now->status.load() == static_cast<uint32_t>(code) &&
              now->length.load() == bytes.size() &&
              memcmp(now->payload, bytes.data(), bytes.size()) == 0,
          "the answer is not what was given");
    Check(HeaderUnchanged(), "Answer wrote into the header");
    for (uint32_t i = 0; i < region->slot_count(); ++i) {
      if (i != slot) Check(SlotUnchanged(i), "Answer wrote into another slot");
    }
  }
};

}  // namespace
}  // namespace gpumem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpumem;
  if (size < 1) return 0;
  Input in(data, size);
  Fuzz f;
  auto region = RingRegion::Create(kSlotCounts[in.Byte() % 8]);
  Check(region.ok(), "RingRegion::Create failed");
  f.region = std::move(*region);
  f.reader = std::make_unique<RingReader>(f.region.get());
  f.before.resize(f.region->size());
  const uint32_t slots = f.region->slot_count();
  for (int steps = 0; !in.empty() && steps < 2000; ++steps) {
    const uint8_t op = in.Byte();
    switch (op % 8) {
      case 0: {  // scribble anywhere
        const size_t at = in.Word(3) % f.region->size();
        const size_t n = std::min<size_t>(in.Byte(), f.region->size() - at);
        const std::string bytes = in.Bytes(n);
        memcpy(f.base() + at, bytes.data(), n);
        break;
      }
      case 1: {  // a state word: mostly the real values, sometimes anything
        RingSlot* s = f.region->slot(in.Byte() % slots);
        const uint8_t v = in.Byte();
        s->state.store(v < 240 ? v % 6 : in.Word(4));
        break;
      }
      case 2:  // a length word, any value
        f.region->slot(in.Byte() % slots)->length.store(in.Word(4));
        break;
      case 3: {  // a client's request; lengths up to past the slot
        const uint32_t i = in.Byte() % slots;
        RingSlot* s = f.region->slot(i);
        s->seq.store(in.Word(2));
        s->kind.store(in.Byte());
        const uint32_t length = in.Word(2) % (kRingPayloadBytes + 64);
        s->length.store(length);
        const std::string bytes = in.Bytes(std::min(length, kRingPayloadBytes));
        memcpy(s->payload, bytes.data(), bytes.size());
        s->state.store(kSlotRequest);
        break;
      }
      case 4:
      case 5:
        f.Collect(static_cast<int>(in.Byte() % 20));
        break;
      case 6: {  // answer a held request, sometimes too long
        if (f.held.empty()) break;
        auto it = f.held.begin();
        std::advance(it, in.Byte() % f.held.size());
        const uint32_t length = in.Word(2) % (kRingPayloadBytes + 16);
        f.Answer(it->first, it->second, static_cast<absl::StatusCode>(in.Byte() % 17),
                 in.Bytes(length));
        break;
      }
      default: {  // an answer the reader may not give: any slot, any seq
        const uint32_t slot = in.Byte() % (slots + 2);
        uint32_t seq = in.Word(4);
        if (in.Byte() & 1) {
          auto it = f.held.find(slot);
          if (it != f.held.end()) seq = it->second + (in.Byte() & 1);  // the real one, or next
        }
        f.Answer(slot, seq, absl::StatusCode::kOk, in.Bytes(in.Byte()));
        break;
      }
    }
    f.CheckModel();
  }
  // Everything held can still be answered, once.
  while (!f.held.empty()) {
    const auto [slot, seq] = *f.held.begin();
    f.Answer(slot, seq, absl::StatusCode::kOk, "done");
    f.Answer(slot, seq, absl::StatusCode::kOk, "twice");
  }
  f.CheckModel();
  return 0;
}
