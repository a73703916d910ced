// Fair waiting (server/admission/admission.h) against a model of the rule.
//
// The memory is a counter of free units. Waiters take units when admission
// tries them; fresh requests (served without waiting) take them from the
// test's thread, as the core's fast path does. Both respect the reservation
// in force the way the core's ReservingCarver does for one device: a carve
// behind the reservation is allowed only if the reserving request still fits
// afterwards.
//
// The model is a few lines of plain code that states the rule (serving
// order, bypass counting, who reserves, when a reservation ends); random
// scenarios are run step by step through both, waiting after each step
// until admission's thread is idle, and must agree on who was served, which
// fresh requests were refused and whether a reservation is in force. Then
// the two bounds the rule promises, in real time: a large waiter behind a
// stream of small requests is served, and a reservation that cannot be met
// holds the others back at most reserve_for.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/admission/admission.h"

namespace gpumem {
namespace admission {
namespace {

struct Memory {
  std::mutex mu;
  int free_units = 0;
  std::vector<std::string> served;  // waiters, in serving order

  // The reservation rule for one device: a carve of `units` behind `ahead`
  // is allowed if the reserving request still fits afterwards.
  static bool Allowed(int free_after, const Reservation* ahead) {
    return ahead == nullptr || free_after >= static_cast<int>(ahead->claim.bytes);
  }
};

class UnitWaiter final : public Waiter {
 public:
  UnitWaiter(Memory* m, std::string name, uint64_t session, int32_t priority, int units,
             absl::Duration wait = absl::Hours(1))
      : Waiter(session, /*tenant=*/1, "t", priority, /*max_waiting=*/100000,
               absl::Now() + wait),
        m_(m), name_(std::move(name)), units_(units) {
    Claim c;
    c.bytes = static_cast<uint64_t>(units);
    c.devices = {0};
    c.what = name_;
    set_claim(c);
  }

  std::optional<Answer> TryServe(const Reservation* ahead) override {
    std::lock_guard<std::mutex> lock(m_->mu);
    if (m_->free_units < units_ || !Memory::Allowed(m_->free_units - units_, ahead)) {
      return std::nullopt;
    }
    m_->free_units -= units_;
    m_->served.push_back(name_);
    return v1::AllocateResponse();
  }
  Answer Expire(const Reservation* ahead) override {
    if (std::optional<Answer> a = TryServe(ahead)) return *a;
    return absl::ResourceExhaustedError("no room");
  }
  void Done(Answer) override {}

 private:
  Memory* m_;
  std::string name_;
  int units_;
};

// The rule, stated plainly.
class Model {
 public:
  explicit Model(uint32_t bypass_limit) : k_(bypass_limit) {}

  struct W {
    std::string name;
    int32_t priority;
    uint64_t arrival;
    int units;
    uint32_t bypasses = 0;
  };

  void Enqueue(const std::string& name, int32_t priority, int units) {
    waiters_.push_back({name, priority, next_++, units});
    std::stable_sort(waiters_.begin(), waiters_.end(), [](const W& a, const W& b) {
      return a.priority != b.priority ? a.priority > b.priority : a.arrival < b.arrival;
    });
  }
  // A fresh request: served if it fits and the reservation allows it.
  bool Fresh(int32_t priority, int units) {
    const W* r = Reserving();
    const bool behind = r != nullptr && r->priority >= priority;
    if (free_ < units || (behind && free_ - units < r->units)) return false;
    free_ -= units;
    std::vector<size_t> bumped;
    for (size_t i = 0; i < waiters_.size(); ++i) {
      if (waiters_[i].priority >= priority) bumped.push_back(i);
    }
    Bypass(bumped);
    return true;
  }
  // Units freed and admission kicked: passes until none is due.
  void Release(int units) {
    free_ += units;
    bool again = true;
    while (again) again = Pass();
  }

  const std::vector<std::string>& served() const { return served_; }
  bool reserving() const { return reserving_ != kNone; }
  int free_units() const { return free_; }

 private:
  static constexpr uint64_t kNone = ~uint64_t{0};

  const W* Reserving() const {
    for (const W& w : waiters_) {
      if (w.arrival == reserving_) return &w;
    }
    return nullptr;
  }
  size_t IndexOf(uint64_t arrival) const {
    for (size_t i = 0; i < waiters_.size(); ++i) {
      if (waiters_[i].arrival == arrival) return i;
    }
    return waiters_.size();
  }
  // Each of `indices` (in serving order) was bypassed once; the earliest at
  // the limit reserves unless an earlier waiter does already.
  void Bypass(const std::vector<size_t>& indices) {
    for (size_t i : indices) {
      W& w = waiters_[i];
      if (++w.bypasses < k_) continue;
      if (reserving_ == kNone || i < IndexOf(reserving_)) reserving_ = w.arrival;
    }
  }
  // One pass in serving order; true if another pass is due (a reservation
  // ended).
  bool Pass() {
    bool again = false;
    std::vector<uint64_t> skipped;  // arrivals
    for (size_t i = 0; i < waiters_.size();) {
      W& w = waiters_[i];
      const W* r = Reserving();
      const bool behind = r != nullptr && r->arrival != w.arrival && IndexOf(r->arrival) < i;
      if (free_ < w.units || (behind && free_ - w.units < r->units)) {
        skipped.push_back(w.arrival);
        ++i;
        continue;
      }
      free_ -= w.units;
      served_.push_back(w.name);
      if (reserving_ == w.arrival) {
        reserving_ = kNone;
        again = true;  // those held back are tried at once
      }
      waiters_.erase(waiters_.begin() + i);
      std::vector<size_t> bumped;
      for (uint64_t a : skipped) bumped.push_back(IndexOf(a));
      Bypass(bumped);
    }
    return again;
  }

  const uint32_t k_;
  std::vector<W> waiters_;  // serving order
  std::vector<std::string> served_;
  uint64_t next_ = 0;
  uint64_t reserving_ = kNone;
  int free_ = 0;
};

bool WaitIdle(const Admission& a) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  // Idle twice in a row, a moment apart: a notify may be on its way.
  int idle = 0;
  while (absl::Now() < end) {
    idle = a.Idle() ? idle + 1 : 0;
    if (idle >= 2) return true;
    absl::SleepFor(absl::Microseconds(200));
  }
  return false;
}

class FairWaitingModelTest : public ::testing::TestWithParam<int> {};

TEST_P(FairWaitingModelTest, AdmissionDoesWhatTheModelSays) {
  constexpr uint32_t kBypassLimit = 4;
  std::mt19937 rng(GetParam());
  Memory m;
  AdmissionOptions options;
  options.bypass_limit = kBypassLimit;
  options.reserve_for = absl::Hours(1);  // no reservation lapses in this test
  Admission a(options);
  Model model(kBypassLimit);
  std::vector<bool> fresh_real, fresh_model;
  int waiters = 0;
  for (int step = 0; step < 400; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    const int32_t priority = std::uniform_int_distribution<int>(0, 1)(rng);
    // Mostly small requests, now and then a large one.
    const int units = std::uniform_int_distribution<int>(0, 9)(rng) == 0
                          ? 6
                          : std::uniform_int_distribution<int>(1, 2)(rng);
    if (op < 4) {
      const std::string name = absl::StrCat("w", waiters++);
      std::unique_ptr<Waiter> w =
          std::make_unique<UnitWaiter>(&m, name, waiters, priority, units);
      ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
      model.Enqueue(name, priority, units);
    } else if (op < 7) {
      std::optional<Reservation> ahead = a.ReservationAhead(priority);
      bool served = false;
      {
        std::lock_guard<std::mutex> lock(m.mu);
        if (m.free_units >= units &&
            Memory::Allowed(m.free_units - units, ahead.has_value() ? &*ahead : nullptr)) {
          m.free_units -= units;
          served = true;
        }
      }
      if (served) a.NoteServed(priority);
      fresh_real.push_back(served);
      fresh_model.push_back(model.Fresh(priority, units));
    } else {
      const int freed = std::uniform_int_distribution<int>(1, 3)(rng);
      {
        std::lock_guard<std::mutex> lock(m.mu);
        m.free_units += freed;
      }
      a.Kick();
      model.Release(freed);
    }
    ASSERT_TRUE(WaitIdle(a)) << "step " << step;
    std::lock_guard<std::mutex> lock(m.mu);
    ASSERT_EQ(m.served, model.served()) << "step " << step;
    ASSERT_EQ(fresh_real, fresh_model) << "step " << step;
    ASSERT_EQ(m.free_units, model.free_units()) << "step " << step;
    ASSERT_EQ(a.reserving(), model.reserving()) << "step " << step;
  }
  EXPECT_GT(a.reservations_made(), 0u) << "the scenario never reached the bypass limit";
}

INSTANTIATE_TEST_SUITE_P(Seeds, FairWaitingModelTest, ::testing::Range(1, 9));

// A large waiter behind a stream of small fresh requests of its priority:
// each step one unit comes back and one small request arrives. Without the
// rule the small request always takes the unit; with it the large waiter
// reserves after kBypassLimit bypasses and is served once its units have
// accumulated, and the small ones go on after it.
TEST(FairWaitingTest, LargeWaiterIsNotStarvedBySmallOnes) {
  constexpr uint32_t kBypassLimit = 8;
  constexpr int kLarge = 5;
  Memory m;
  AdmissionOptions options;
  options.bypass_limit = kBypassLimit;
  options.reserve_for = absl::Seconds(30);
  Admission a(options);
  std::unique_ptr<Waiter> w = std::make_unique<UnitWaiter>(&m, "large", 1, 0, kLarge);
  ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
  int steps = 0, small_served = 0, small_refused = 0, small_after = 0;
  for (; steps < 1000; ++steps) {
    {
      std::lock_guard<std::mutex> lock(m.mu);
      ++m.free_units;
    }
    a.Kick();
    ASSERT_TRUE(WaitIdle(a));
    bool large_done;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      large_done = !m.served.empty();
    }
    std::optional<Reservation> ahead = a.ReservationAhead(0);
    bool served = false;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.free_units >= 1 &&
          Memory::Allowed(m.free_units - 1, ahead.has_value() ? &*ahead : nullptr)) {
        --m.free_units;
        served = true;
      }
    }
    if (served) {
      a.NoteServed(0);
      ++small_served;
      if (large_done) ++small_after;
    } else {
      ++small_refused;
    }
    if (large_done && small_after >= 5) break;
  }
  std::lock_guard<std::mutex> lock(m.mu);
  ASSERT_EQ(m.served, std::vector<std::string>{"large"});
  // kBypassLimit small ones before the reservation, then the large one gets
  // the next kLarge units (the small ones are refused meanwhile).
  EXPECT_EQ(small_refused, kLarge);
  EXPECT_LE(steps, static_cast<int>(kBypassLimit) + kLarge + 6);
  EXPECT_EQ(small_after, 5);
  EXPECT_EQ(a.reservations_made(), 1u);
}

// A reservation that cannot be met (the large request needs more than can
// come back) holds the small ones back at most reserve_for, then they are
// served again; and the large one reserves again only after as many
// bypasses.
TEST(FairWaitingTest, AReservationHoldsOthersBackAtMostReserveFor) {
  constexpr uint32_t kBypassLimit = 3;
  const absl::Duration kReserve = absl::Milliseconds(300);
  Memory m;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 1000;
  }
  AdmissionOptions options;
  options.bypass_limit = kBypassLimit;
  options.reserve_for = kReserve;
  Admission a(options);
  std::unique_ptr<Waiter> w = std::make_unique<UnitWaiter>(&m, "huge", 1, 0, 1000000);
  ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
  // Small fresh requests, as fast as they come, for 1.5 s: record when they
  // are refused.
  const absl::Time start = absl::Now();
  absl::Time refused_since = absl::InfinitePast();
  absl::Duration longest_refusal = absl::ZeroDuration();
  int served = 0, refusal_spells = 0;
  while (absl::Now() - start < absl::Milliseconds(1500)) {
    std::optional<Reservation> ahead = a.ReservationAhead(0);
    bool ok = false;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (Memory::Allowed(m.free_units - 1, ahead.has_value() ? &*ahead : nullptr)) {
        ok = true;  // taken and given back at once
      }
    }
    const absl::Time now = absl::Now();
    if (ok) {
      a.NoteServed(0);
      ++served;
      if (refused_since != absl::InfinitePast()) {
        longest_refusal = std::max(longest_refusal, now - refused_since);
        refused_since = absl::InfinitePast();
      }
    } else if (refused_since == absl::InfinitePast()) {
      refused_since = now;
      ++refusal_spells;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GE(refusal_spells, 2) << "the huge waiter should have reserved more than once";
  EXPECT_GT(longest_refusal, kReserve / 2);
  EXPECT_LE(longest_refusal, kReserve + absl::Milliseconds(150));
  // Between two reservations, bypass_limit small ones are served.
  EXPECT_GE(served, static_cast<int>(kBypassLimit) * refusal_spells);
  EXPECT_GE(a.reservations_made(), 2u);
}

// A reservation only holds back requests behind it: a fresh request of a
// higher priority is not affected.
TEST(FairWaitingTest, HigherPriorityIsNotHeldBack) {
  Memory m;
  AdmissionOptions options;
  options.bypass_limit = 1;
  options.reserve_for = absl::Hours(1);
  Admission a(options);
  std::unique_ptr<Waiter> w = std::make_unique<UnitWaiter>(&m, "large", 1, 5, 10);
  ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
  a.NoteServed(5);  // one bypass: it reserves
  ASSERT_TRUE(WaitIdle(a));
  ASSERT_TRUE(a.reserving());
  EXPECT_TRUE(a.ReservationAhead(5).has_value());
  EXPECT_TRUE(a.ReservationAhead(0).has_value());
  EXPECT_FALSE(a.ReservationAhead(6).has_value());
  a.NoteServed(9);  // a higher priority does not bypass it
  EXPECT_EQ(a.reservations_made(), 1u);
}

}  // namespace
}  // namespace admission
}  // namespace gpumem
