// Admission (server/admission/admission.h) against a model of memory: a
// counter of free units that waiters take when they are tried. Checks the
// serving order, deadlines, ended sessions, cancels, the per-tenant limit,
// stop, that no wake-up is lost, and that every waiter is answered exactly
// once and on admission's own thread.
#include "server/admission/admission.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace gpumem {
namespace admission {
namespace {

// Free units and what happened, shared by the test and its waiters.
struct Model {
  std::mutex mu;
  int free_units = 0;
  std::vector<std::string> served;  // names, in serving order
  std::vector<std::pair<std::string, absl::Status>> answers;
  std::atomic<int> done{0};
  std::thread::id admission_thread;
  bool wrong_thread = false;

  void Record(const std::string& name, const Answer& a) {
    std::lock_guard<std::mutex> lock(mu);
    answers.emplace_back(name, a.status());
    if (a.ok()) served.push_back(name);
    if (admission_thread == std::thread::id()) admission_thread = std::this_thread::get_id();
    if (admission_thread != std::this_thread::get_id()) wrong_thread = true;
    ++done;
  }
  absl::Status AnswerOf(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [n, s] : answers) {
      if (n == name) return s;
    }
    return absl::UnknownError("not answered");
  }
  int Answers(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [who, s] : answers) n += who == name;
    return n;
  }
};

class UnitWaiter final : public Waiter {
 public:
  UnitWaiter(Model* model, std::string name, uint64_t session, uint32_t tenant,
             int32_t priority, absl::Duration wait, int units = 1, uint32_t limit = 0)
      : Waiter(session, tenant, "t" + std::to_string(tenant), priority, limit,
               absl::Now() + wait),
        model_(model), name_(std::move(name)), units_(units) {}

  std::optional<Answer> TryServe(const Reservation*) override {
    std::lock_guard<std::mutex> lock(model_->mu);
    if (model_->free_units < units_) return std::nullopt;
    model_->free_units -= units_;
    return v1::AllocateResponse();
  }
  Answer Expire(const Reservation* ahead) override {
    if (std::optional<Answer> a = TryServe(ahead)) return *a;
    return absl::ResourceExhaustedError("no room");
  }
  void Done(Answer answer) override { model_->Record(name_, answer); }

 private:
  Model* model_;
  std::string name_;
  int units_;
};

bool WaitUntil(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(60)) {
  const absl::Time end = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

absl::StatusOr<uint64_t> Add(Admission& a, std::unique_ptr<Waiter> w) {
  return a.Enqueue(w, a.kicks());
}

TEST(AdmissionTest, ServedByPriorityThenArrivalWhenRoomAppears) {
  Model m;
  Admission a(AdmissionOptions{});
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "low-1", 1, 1, 0, absl::Minutes(1))).ok());
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "high-1", 2, 2, 5, absl::Minutes(1))).ok());
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "low-2", 3, 1, 0, absl::Minutes(1))).ok());
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "high-2", 4, 2, 5, absl::Minutes(1))).ok());
  EXPECT_EQ(a.waiting(), 4u);
  EXPECT_EQ(a.waiting_by_tenant().at(1), 2u);
  ASSERT_TRUE(WaitUntil([&] { return a.Idle(); }));  // every event handled
  EXPECT_EQ(m.done.load(), 0);  // no room yet: nobody answered
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 3;
  }
  a.Kick();
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 3; }));
  {
    std::lock_guard<std::mutex> lock(m.mu);
    EXPECT_EQ(m.served, (std::vector<std::string>{"high-1", "high-2", "low-1"}));
  }
  EXPECT_EQ(a.waiting(), 1u);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 1;
  }
  a.Kick();
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 4; }));
  EXPECT_EQ(a.waiting(), 0u);
  EXPECT_TRUE(a.waiting_by_tenant().empty());
  EXPECT_FALSE(m.wrong_thread);
}

TEST(AdmissionTest, DeadlineGivesTheUsualAnswerOnTime) {
  Model m;
  Admission a(AdmissionOptions{});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "w", 1, 1, 0, absl::Milliseconds(100))).ok());
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 1; }));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(95));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(m.AnswerOf("w").code(), absl::StatusCode::kResourceExhausted);
}

TEST(AdmissionTest, EndedSessionIsAnsweredAtOnceAndOthersAreTriedAgain) {
  Model m;
  Admission a(AdmissionOptions{});
  // A big request of session 1 first, a small one of session 2 behind it.
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "big", 1, 1, 9, absl::Minutes(1), 5)).ok());
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "small", 2, 1, 0, absl::Minutes(1))).ok());
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 1;  // room for the small one only, nobody kicked yet
  }
  a.SessionEnded(1);
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 2; }));
  EXPECT_EQ(m.AnswerOf("big").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(m.AnswerOf("big").message(), "exited"));
  EXPECT_TRUE(m.AnswerOf("small").ok());
}

TEST(AdmissionTest, CancelAnswersOnceAndOnlyIfStillWaiting) {
  Model m;
  Admission a(AdmissionOptions{});
  absl::StatusOr<uint64_t> t =
      Add(a, std::make_unique<UnitWaiter>(&m, "w", 1, 1, 0, absl::Minutes(1)));
  ASSERT_TRUE(t.ok());
  a.Cancel(*t);
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 1; }));
  EXPECT_EQ(m.AnswerOf("w").code(), absl::StatusCode::kCancelled);
  a.Cancel(*t);  // answered already: nothing happens
  a.Cancel(12345);
  ASSERT_TRUE(WaitUntil([&] { return a.Idle(); }));  // both cancels handled
  EXPECT_EQ(m.Answers("w"), 1);
}

TEST(AdmissionTest, PerTenantLimitRefusesByNameAndFreesItsPlaceWhenAnswered) {
  Model m;
  Admission a(AdmissionOptions{/*max_waiting_per_tenant=*/2});
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "a", 1, 7, 0, absl::Minutes(1))).ok());
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "b", 1, 7, 0, absl::Minutes(1))).ok());
  std::unique_ptr<Waiter> third = std::make_unique<UnitWaiter>(&m, "c", 1, 7, 0, absl::Minutes(1));
  absl::StatusOr<uint64_t> refused = a.Enqueue(third, a.kicks());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "\"t7\"")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "max_waiting_requests 2"));
  ASSERT_NE(third, nullptr);  // still the caller's
  // Another tenant is not held back by t7's limit; a waiter's own limit wins.
  ASSERT_TRUE(Add(a, std::make_unique<UnitWaiter>(&m, "x", 2, 8, 0, absl::Minutes(1))).ok());
  std::unique_ptr<Waiter> own =
      std::make_unique<UnitWaiter>(&m, "y", 2, 8, 0, absl::Minutes(1), 1, /*limit=*/1);
  EXPECT_EQ(a.Enqueue(own, a.kicks()).status().code(), absl::StatusCode::kResourceExhausted);
  // Once one of t7's is answered, its place is free again.
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 1;
  }
  a.Kick();
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return a.waiting_by_tenant()[7] == 1; }));
  EXPECT_TRUE(a.Enqueue(third, a.kicks()).ok());
}

TEST(AdmissionTest, StopAnswersEveryWaiterAndRefusesNewOnes) {
  Model m;
  auto a = std::make_unique<Admission>(AdmissionOptions{});
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(Add(*a, std::make_unique<UnitWaiter>(&m, "w" + std::to_string(i), i, i % 3, 0,
                                                     absl::Minutes(1)))
                    .ok());
  }
  a->Stop();
  EXPECT_EQ(m.done.load(), 50);
  EXPECT_EQ(m.AnswerOf("w7").code(), absl::StatusCode::kFailedPrecondition);
  std::unique_ptr<Waiter> late = std::make_unique<UnitWaiter>(&m, "late", 1, 1, 0, absl::Minutes(1));
  EXPECT_EQ(a->Enqueue(late, a->kicks()).status().code(), absl::StatusCode::kFailedPrecondition);
  a.reset();  // a second Stop, from the destructor
  EXPECT_EQ(m.done.load(), 50);
}

// A release between a caller's failed try and its Enqueue is not lost: the
// waiter is tried as if it had been queued before the release.
TEST(AdmissionTest, ReleaseBeforeEnqueueIsNotLost) {
  Model m;
  Admission a(AdmissionOptions{});
  const uint64_t seen = a.kicks();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 1;
  }
  a.Kick();  // nobody waits yet
  std::unique_ptr<Waiter> w = std::make_unique<UnitWaiter>(&m, "w", 1, 1, 0, absl::Minutes(1));
  ASSERT_TRUE(a.Enqueue(w, seen).ok());
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 1; }));
  EXPECT_TRUE(m.AnswerOf("w").ok());
}

// Many threads enqueue, kick, cancel and end sessions at once: every waiter
// is answered exactly once and the books end empty (run under TSan too).
TEST(AdmissionTest, ConcurrentUseAnswersEveryWaiterExactlyOnce) {
  Model m;
  constexpr int kThreads = 4, kEach = 200;
  {
    Admission a(AdmissionOptions{/*max_waiting_per_tenant=*/100000});
    std::vector<std::thread> threads;
    std::atomic<int> refused{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          const uint64_t session = t * 1000 + i % 10;
          std::unique_ptr<Waiter> w = std::make_unique<UnitWaiter>(
              &m, absl::StrCat(t, "-", i), session, t, i % 4, absl::Milliseconds(i % 50));
          absl::StatusOr<uint64_t> ticket = a.Enqueue(w, a.kicks());
          if (!ticket.ok()) {
            ++refused;
            continue;
          }
          if (i % 7 == 0) a.Cancel(*ticket);
          if (i % 11 == 0) a.SessionEnded(session);
          if (i % 3 == 0) {
            std::lock_guard<std::mutex> lock(m.mu);
            ++m.free_units;
          }
          a.Kick();
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(refused.load(), 0);
    ASSERT_TRUE(WaitUntil([&] { return m.done.load() == kThreads * kEach; }, absl::Seconds(20)));
    EXPECT_EQ(a.waiting(), 0u);
    EXPECT_TRUE(a.waiting_by_tenant().empty());
  }
  EXPECT_EQ(m.done.load(), kThreads * kEach);
  std::lock_guard<std::mutex> lock(m.mu);
  absl::flat_hash_map<std::string, int> seen;
  for (const auto& [name, status] : m.answers) ++seen[name];
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kEach));
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
  EXPECT_FALSE(m.wrong_thread);
}

// A reclaim hold: its deadline is the bound; once every session asked has
// answered (or ended) it is tried once more and answered at once.
TEST(AdmissionTest, ReclaimHoldEndsWhenEverySessionAskedHasAnswered) {
  Model m;
  Admission a(AdmissionOptions{});
  auto held = std::make_unique<UnitWaiter>(&m, "held", 1, 1, 0, absl::Seconds(30));
  held->HoldForReclaim({7, 8}, absl::Now());  // no wait_ms of its own
  std::unique_ptr<Waiter> w = std::move(held);
  ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
  a.ReclaimAnswered(7);
  a.ReclaimAnswered(99);  // not asked: changes nothing
  ASSERT_TRUE(WaitUntil([&] { return a.Idle(); }));  // both answers handled
  EXPECT_EQ(m.done.load(), 0) << "session 8 has not answered yet";
  const absl::Time answered = absl::Now();
  a.ReclaimAnswered(8);
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 1; }));
  EXPECT_LT(absl::Now() - answered, absl::Seconds(1));
  EXPECT_EQ(m.AnswerOf("held").code(), absl::StatusCode::kResourceExhausted);

  // A session asked that ends counts as answered; room that came back with
  // it serves the held request.
  auto again = std::make_unique<UnitWaiter>(&m, "again", 2, 1, 0, absl::Seconds(30));
  again->HoldForReclaim({9}, absl::Now());
  std::unique_ptr<Waiter> w2 = std::move(again);
  ASSERT_TRUE(a.Enqueue(w2, a.kicks()).ok());
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_units = 1;
  }
  a.SessionEnded(9);
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 2; }));
  EXPECT_TRUE(m.AnswerOf("again").ok());
}

// A session that never answers delays the held request by the bound only.
TEST(AdmissionTest, UnansweredReclaimHoldEndsAtItsBound) {
  Model m;
  Admission a(AdmissionOptions{});
  const absl::Time start = absl::Now();
  auto held = std::make_unique<UnitWaiter>(&m, "held", 1, 1, 0, absl::Milliseconds(200));
  held->HoldForReclaim({7}, start);
  std::unique_ptr<Waiter> w = std::move(held);
  ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
  ASSERT_TRUE(WaitUntil([&] { return m.done.load() == 1; }));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(195));
  EXPECT_LT(took, absl::Seconds(2));
  // A request with its own longer wait keeps waiting after the answers.
  auto waits = std::make_unique<UnitWaiter>(&m, "waits", 2, 1, 0, absl::Seconds(30));
  waits->HoldForReclaim({8}, absl::Now() + absl::Seconds(30));
  std::unique_ptr<Waiter> w2 = std::move(waits);
  ASSERT_TRUE(a.Enqueue(w2, a.kicks()).ok());
  a.ReclaimAnswered(8);
  ASSERT_TRUE(WaitUntil([&] { return a.Idle(); }));  // the answer handled
  EXPECT_EQ(m.done.load(), 1);
  EXPECT_EQ(a.waiting(), 1u);
}

}  // namespace
}  // namespace admission
}  // namespace gpumem
