// Bounded waiters and no oracles, through the core (server/core/
// memory_broker.h) over the sim backend, with real (forked) client
// processes standing for the callers:
//  - wait_ms above the configured maximum is INVALID_ARGUMENT naming it;
//  - the bytes one tenant's waiters hold are bounded (RESOURCE_EXHAUSTED
//    naming the setting), another tenant still waits, and a waiter's
//    compact form is small;
//  - the case: a waiter for the whole device, where another tenant
//    holds a little, never reserves, and that tenant's allocations all
//    succeed meanwhile; a waiter that could fit beside the others does
//    reserve (so the check can fail);
//  - Free, ExportSlab and CloseSlab of another uid's allocation or slab
//    answer a non-admin exactly what a non-existent id gets; root gets the
//    precise refusal.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "tests/core/sleeping_child.h"

namespace gpumem {
namespace {

using ::gpumem::testing::SleepingChild;
using ::gpumem::v1::AllocateRequest;
using ::gpumem::v1::AllocateResponse;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kUidA = 4101;  // the waiting tenant (each uid is one)
constexpr uid_t kUidB = 4102;  // another tenant

AllocateRequest Request(uint64_t size, uint32_t wait_ms = 0) {
  AllocateRequest r;
  r.set_size_bytes(size);
  r.set_wait_ms(wait_ms);
  return r;
}

v1::FreeRequest FreeOf(uint64_t id) {
  v1::FreeRequest f;
  f.set_id(id);
  return f;
}

// A waiting request's answer, seen from the test's thread. (An absl::Mutex,
// which ThreadSanitizer sees, not Debian's uninstrumented Notification.)
struct Waited {
  absl::Mutex mu;
  bool answered ABSL_GUARDED_BY(mu) = false;
  MemoryBroker::AllocateAnswer answer ABSL_GUARDED_BY(mu) = absl::UnknownError("none");

  MemoryBroker::AllocateCallback Callback() {
    return [this](MemoryBroker::AllocateAnswer a) {
      absl::MutexLock lock(&mu);
      answer = std::move(a);
      answered = true;
    };
  }
  bool Answered() {
    absl::MutexLock lock(&mu);
    return answered;
  }
  // Waits at most `d` for the answer; its status (UNKNOWN: not answered).
  absl::Status Await(absl::Duration d) {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&answered), d);
    return answer.status();
  }
};

class BoundedWaitersTest : public ::testing::Test {
 protected:
  BoundedWaitersTest() : backend_({64 * kMiB}) {}

  void Start(admission::AdmissionOptions admission) {
    BrokerOptions o;
    o.pool.slab_size = kMiB;
    o.pool.granularity = 4096;
    o.pool.empty_release_after = absl::ZeroDuration();
    o.reclaim_wait = absl::ZeroDuration();
    o.admission = admission;
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
    ASSERT_TRUE(broker_->Start().ok());
  }
  void TearDown() override { broker_.reset(); }

  void WaitIdle() {
    const absl::Time until = absl::Now() + absl::Seconds(5);
    do {
      absl::SleepFor(absl::Milliseconds(1));
    } while (!broker_->AdmissionIdle() && absl::Now() < until);
  }

  SleepingChild a_;   // tenant A's waiting process
  SleepingChild a2_;  // another process of tenant A
  SleepingChild b_;   // tenant B
  SimBackend backend_;
  std::unique_ptr<MemoryBroker> broker_;
};

TEST_F(BoundedWaitersTest, WaitMsAboveTheMaximumIsRefusedByName) {
  admission::AdmissionOptions o;
  o.max_wait = absl::Seconds(60);
  Start(o);
  absl::StatusOr<AllocateResponse> r =
      broker_->AllocateAndWait(a_.Cred(kUidA, kUidA), Request(kMiB, 60001));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--max_wait_ms=60000")) << r.status();
  // Refused before anything is placed, even where it would fit at once.
  EXPECT_EQ(broker_->AllocateAndWait(a_.Cred(kUidA, kUidA), Request(kMiB, 4294967295u))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(broker_->AllocateAndWait(a_.Cred(kUidA, kUidA), Request(kMiB, 60000)).ok());
}

TEST_F(BoundedWaitersTest, BytesOfOneTenantsWaitersAreBounded) {
  constexpr uint64_t kLimit = 64 << 10;
  admission::AdmissionOptions o;
  o.max_waiting_bytes_per_tenant = kLimit;
  Start(o);
  // Nothing serves A's requests for the whole device while B holds a block.
  ASSERT_TRUE(broker_->AllocateAndWait(b_.Cred(kUidB, kUidB), Request(kMiB)).ok());
  std::vector<std::unique_ptr<Waited>> waited;
  std::vector<uint64_t> tickets;
  absl::Status refusal;
  for (int i = 0; i < 1000 && refusal.ok(); ++i) {
    auto w = std::make_unique<Waited>();
    MemoryBroker::AllocateOutcome out =
        broker_->Allocate(a_.Cred(kUidA, kUidA), Request(64 * kMiB, 60000), w->Callback());
    if (out.kind == MemoryBroker::AllocateOutcome::Kind::kWaiting) {
      tickets.push_back(out.wait_ticket);
      waited.push_back(std::move(w));
    } else {
      refusal = out.answer.status();
    }
  }
  ASSERT_EQ(refusal.code(), absl::StatusCode::kResourceExhausted) << refusal;
  EXPECT_TRUE(absl::StrContains(refusal.message(), "--max_waiting_bytes_per_tenant=65536"))
      << refusal;
  EXPECT_TRUE(absl::StrContains(refusal.message(), "tenant \"uid-4101\"")) << refusal;
  // A waiter's compact form is small: a plain request's waiter holds under
  // 4 KiB, so at least 16 of them fit in 64 KiB.
  const size_t accepted = tickets.size();
  EXPECT_GE(accepted, 16u);
  EXPECT_LT(accepted, 1000u);
  std::cout << "waiters of one tenant within 64 KiB: " << accepted << " (about "
            << kLimit / accepted << " bytes each)\n";
  // Another tenant still waits.
  Waited other;
  MemoryBroker::AllocateOutcome b_wait =
      broker_->Allocate(b_.Cred(kUidB, kUidB), Request(64 * kMiB, 60000), other.Callback());
  EXPECT_EQ(b_wait.kind, MemoryBroker::AllocateOutcome::Kind::kWaiting);
  // Once some leave, the tenant may wait again.
  broker_->CancelWait(tickets[0]);
  EXPECT_EQ(waited[0]->Await(absl::Seconds(5)).code(), absl::StatusCode::kCancelled);
  WaitIdle();
  Waited again;
  EXPECT_EQ(
      broker_->Allocate(a_.Cred(kUidA, kUidA), Request(64 * kMiB, 60000), again.Callback()).kind,
      MemoryBroker::AllocateOutcome::Kind::kWaiting);
  broker_.reset();  // answers the waiters before `waited` goes
}

// The case, scaled to a 64 MiB device: A waits for all of it while
// B holds 2 MiB; B's 40 allocate+free pairs that follow all succeed (with
// a bypass limit of 2, A would reserve after B's second and refuse B's
// later carves for as long as it reserved).
TEST_F(BoundedWaitersTest, WaiterThatCannotFitBesideOthersNeverReserves) {
  admission::AdmissionOptions o;
  o.bypass_limit = 2;
  o.reserve_for = absl::Seconds(30);
  Start(o);
  const PeerCred b = b_.Cred(kUidB, kUidB);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(broker_->AllocateAndWait(b, Request(kMiB)).ok());
  Waited large;
  MemoryBroker::AllocateOutcome out =
      broker_->Allocate(a_.Cred(kUidA, kUidA), Request(64 * kMiB, 60000), large.Callback());
  ASSERT_EQ(out.kind, MemoryBroker::AllocateOutcome::Kind::kWaiting);
  int ok = 0;
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<AllocateResponse> r = broker_->AllocateAndWait(b, Request(kMiB));
    EXPECT_TRUE(r.ok()) << i << ": " << r.status();
    if (!r.ok()) continue;
    ++ok;
    EXPECT_TRUE(broker_->Free(b, FreeOf(r->allocations(0).id())).ok());
    WaitIdle();  // admission tries A again, and is bypassed again
  }
  EXPECT_EQ(ok, 40);
  EXPECT_FALSE(large.Answered()) << "it cannot fit: it waits on";
  broker_->CancelWait(out.wait_ticket);
  EXPECT_EQ(large.Await(absl::Seconds(5)).code(), absl::StatusCode::kCancelled);
}

// The control: A waits for 32 MiB while another process of A holds 60 MiB
// and B holds 2 MiB. Beside B's 2 MiB it could fit, so it reserves and B's
// next carve on the device is held for it.
TEST_F(BoundedWaitersTest, WaiterThatCouldFitBesideOthersReserves) {
  admission::AdmissionOptions o;
  o.bypass_limit = 2;
  o.reserve_for = absl::Seconds(30);
  Start(o);
  const PeerCred b = b_.Cred(kUidB, kUidB);
  std::vector<uint64_t> own;
  for (int i = 0; i < 60; ++i) {
    absl::StatusOr<AllocateResponse> r =
        broker_->AllocateAndWait(a2_.Cred(kUidA, kUidA), Request(kMiB));
    ASSERT_TRUE(r.ok()) << r.status();
    own.push_back(r->allocations(0).id());
  }
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(broker_->AllocateAndWait(b, Request(kMiB)).ok());
  Waited large;
  MemoryBroker::AllocateOutcome out =
      broker_->Allocate(a_.Cred(kUidA, kUidA), Request(32 * kMiB, 60000), large.Callback());
  ASSERT_EQ(out.kind, MemoryBroker::AllocateOutcome::Kind::kWaiting);
  int ok = 0, held = 0;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<AllocateResponse> r = broker_->AllocateAndWait(b, Request(kMiB));
    if (r.ok()) {
      ++ok;
      EXPECT_TRUE(broker_->Free(b, FreeOf(r->allocations(0).id())).ok());
    } else {
      EXPECT_TRUE(absl::StrContains(r.status().message(), "held for an earlier waiting request"))
          << r.status();
      ++held;
    }
    WaitIdle();
  }
  EXPECT_EQ(ok, 2) << "served until A had been passed over twice";
  EXPECT_EQ(held, 4);
  // A's own blocks come back: it is served.
  for (uint64_t id : own) ASSERT_TRUE(broker_->Free(a2_.Cred(kUidA, kUidA), FreeOf(id)).ok());
  EXPECT_TRUE(large.Await(absl::Seconds(5)).ok());
}

// `s` with every decimal `id` in its message replaced by N, code first.
std::string Shape(const absl::Status& s, uint64_t id) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ",
                      absl::StrReplaceAll(s.message(), {{absl::StrCat(id), "N"}}));
}

TEST_F(BoundedWaitersTest, AnothersAllocationIsNoneToANonAdmin) {
  Start({});
  absl::StatusOr<AllocateResponse> a =
      broker_->AllocateAndWait(a_.Cred(kUidA, kUidA), Request(2 * kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t id = a->allocations(0).id();
  const uint64_t slab = a->allocations(0).slab_id();
  const uint64_t missing_id = id + 1000;
  const uint64_t missing_slab = slab + 1000;
  const PeerCred b = b_.Cred(kUidB, kUidB);

  // Free: the same code and words as an id nobody has.
  const absl::Status theirs = broker_->Free(b, FreeOf(id)).status();
  const absl::Status nobodys = broker_->Free(b, FreeOf(missing_id)).status();
  EXPECT_EQ(theirs.code(), absl::StatusCode::kNotFound) << theirs;
  EXPECT_EQ(Shape(theirs, id), Shape(nobodys, missing_id));
  EXPECT_FALSE(absl::StrContains(theirs.message(), "uid")) << theirs;
  // The try-first path (TryFree) answers the same.
  std::optional<absl::StatusOr<v1::FreeResponse>> tried = broker_->TryFree(b, FreeOf(id));
  ASSERT_TRUE(tried.has_value());
  EXPECT_EQ(Shape(tried->status(), id), Shape(nobodys, missing_id));

  // The slab channel's open and close: another tenant's slab is no slab.
  const absl::Status open_theirs = broker_->ExportSlab(b, slab).status();
  const absl::Status open_nobodys = broker_->ExportSlab(b, missing_slab).status();
  EXPECT_EQ(open_theirs.code(), absl::StatusCode::kNotFound) << open_theirs;
  EXPECT_EQ(Shape(open_theirs, slab), Shape(open_nobodys, missing_slab));
  const absl::Status close_theirs = broker_->CloseSlab(b, slab);
  const absl::Status close_nobodys = broker_->CloseSlab(b, missing_slab);
  EXPECT_EQ(close_theirs.code(), absl::StatusCode::kNotFound) << close_theirs;
  EXPECT_EQ(Shape(close_theirs, slab), Shape(close_nobodys, missing_slab));
  EXPECT_EQ(Shape(close_theirs, slab), Shape(open_theirs, slab));

  // Root (an admin) is told why.
  SleepingChild root_child;
  const PeerCred root = root_child.Cred(0, 0);
  const absl::StatusOr<SlabFd> root_open = broker_->ExportSlab(root, slab);
  EXPECT_EQ(root_open.status().code(), absl::StatusCode::kPermissionDenied) << root_open.status();
  EXPECT_TRUE(absl::StrContains(root_open.status().message(), "another tenant"))
      << root_open.status();
  // Its owner still frees it; then it is gone for everyone alike.
  EXPECT_TRUE(broker_->Free(a_.Cred(kUidA, kUidA), FreeOf(id)).ok());
  EXPECT_EQ(Shape(broker_->Free(b, FreeOf(id)).status(), id), Shape(nobodys, missing_id));
}

}  // namespace
}  // namespace gpumem
