// Bounded waiters (server/admission/admission.h): the longest wait a
// request may ask for, the bytes one tenant's waiters may hold, and a
// waiter that could not fit beside other tenants' blocks never reserving.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "server/admission/admission.h"

namespace gpumem {
namespace admission {
namespace {

// A waiter that is never served until told; it says where it could fit.
class FixedWaiter final : public Waiter {
 public:
  FixedWaiter(uint32_t tenant, uint64_t held, std::vector<uint32_t> fitting = {0})
      : Waiter(/*session=*/tenant, tenant, "t" + std::to_string(tenant), /*priority=*/0,
               /*max_waiting=*/100000, absl::Now() + absl::Hours(1)),
        fitting_(std::move(fitting)) {
    Claim c;
    c.tenant = tenant;
    c.devices = {0, 1};
    c.bytes = 100;
    c.what = "w";
    set_claim(c);
    set_held_bytes(held);
  }
  std::optional<Answer> TryServe(const Reservation*) override { return std::nullopt; }
  Answer Expire(const Reservation*) override { return absl::ResourceExhaustedError("no room"); }
  void Done(Answer) override {}
  std::vector<uint32_t> FittingDevices() const override { return fitting_; }

 private:
  const std::vector<uint32_t> fitting_;
};

void WaitIdle(const Admission& a) {
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (!a.Idle() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
}

TEST(BoundedWaitingTest, WaitMsAboveTheMaximumIsRefusedByName) {
  AdmissionOptions o;
  o.max_wait = absl::Seconds(60);
  Admission a(o);
  EXPECT_TRUE(a.CheckWait(0).ok());
  EXPECT_TRUE(a.CheckWait(60000).ok());
  const absl::Status s = a.CheckWait(60001);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "wait_ms 60001 exceeds --max_wait_ms=60000 "
                                "(DaemonConfig.max_wait_ms)"))
      << s;
  // 49.7 days, the case.
  EXPECT_EQ(a.CheckWait(4294967295u).code(), absl::StatusCode::kInvalidArgument);
  // No maximum configured: anything.
  Admission unlimited(AdmissionOptions{});
  EXPECT_TRUE(unlimited.CheckWait(4294967295u).ok());
}

TEST(BoundedWaitingTest, BytesOneTenantsWaitersHoldAreBounded) {
  AdmissionOptions o;
  o.max_waiting_bytes_per_tenant = 10000;
  Admission a(o);
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<Waiter> w = std::make_unique<FixedWaiter>(1, 4000);
    absl::StatusOr<uint64_t> t = a.Enqueue(w, a.kicks());
    ASSERT_TRUE(t.ok()) << i << ": " << t.status();
    tickets.push_back(*t);
  }
  EXPECT_EQ(a.waiting_bytes_by_tenant()[1], 8000u);
  // A third would hold 12000 bytes.
  std::unique_ptr<Waiter> third = std::make_unique<FixedWaiter>(1, 4000);
  absl::StatusOr<uint64_t> refused = a.Enqueue(third, a.kicks());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "tenant \"t1\" has 2 requests"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "--max_waiting_bytes_per_tenant=10000, "
                                "DaemonConfig.max_waiting_bytes_per_tenant"))
      << refused.status();
  ASSERT_NE(third, nullptr) << "a refused waiter stays with its caller";
  // A smaller one still fits, and another tenant is not affected.
  std::unique_ptr<Waiter> small = std::make_unique<FixedWaiter>(1, 2000);
  EXPECT_TRUE(a.Enqueue(small, a.kicks()).ok());
  std::unique_ptr<Waiter> other = std::make_unique<FixedWaiter>(2, 9000);
  EXPECT_TRUE(a.Enqueue(other, a.kicks()).ok());
  // One larger than the whole limit never waits.
  std::unique_ptr<Waiter> huge = std::make_unique<FixedWaiter>(3, 10001);
  EXPECT_EQ(a.Enqueue(huge, a.kicks()).status().code(), absl::StatusCode::kResourceExhausted);
  // Answered waiters give their bytes back.
  a.Cancel(tickets[0]);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (a.waiting_bytes_by_tenant()[1] != 6000u && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(a.waiting_bytes_by_tenant()[1], 6000u);
  EXPECT_TRUE(a.Enqueue(third, a.kicks()).ok());
  a.Stop();
  EXPECT_TRUE(a.waiting_bytes_by_tenant().empty());
}

// The case, at admission: a waiter bypassed again and again that
// could not fit anywhere beside other tenants' blocks never reserves (it is
// looked at once every bypass_limit bypasses); one that could, reserves, on
// the devices where it could only.
TEST(BoundedWaitingTest, WaiterThatCannotFitBesideOthersNeverReserves) {
  AdmissionOptions o;
  o.bypass_limit = 3;
  o.reserve_for = absl::Seconds(30);
  {
    Admission a(o);
    std::unique_ptr<Waiter> w = std::make_unique<FixedWaiter>(1, 0, std::vector<uint32_t>{});
    ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
    WaitIdle(a);
    for (int i = 0; i < 30; ++i) a.NoteServed(0);
    EXPECT_FALSE(a.reserving());
    EXPECT_EQ(a.reservations_made(), 0u);
    EXPECT_EQ(a.reservations_declined(), 10u);  // every 3rd bypass
    EXPECT_FALSE(a.ReservationAhead(0).has_value());
  }
  {
    Admission a(o);
    std::unique_ptr<Waiter> w = std::make_unique<FixedWaiter>(1, 0, std::vector<uint32_t>{1});
    ASSERT_TRUE(a.Enqueue(w, a.kicks()).ok());
    WaitIdle(a);
    for (int i = 0; i < 3; ++i) a.NoteServed(0);
    EXPECT_TRUE(a.reserving());
    EXPECT_EQ(a.reservations_made(), 1u);
    EXPECT_EQ(a.reservations_declined(), 0u);
    std::optional<Reservation> r = a.ReservationAhead(0);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->claim.devices, std::vector<uint32_t>{1}) << "only where it could fit";
  }
}

}  // namespace
}  // namespace admission
}  // namespace gpumem
