// RingTransport (server/service/ring_transport.h) over a real MemoryBroker
// and the sim backend, with a client's RingSubmitter on the lent fds: what
// Lend refuses (rings off, a second ring, the per-uid and total bounds, a
// caller with no session), that a bound session's end takes its ring and
// answers what waited on it, and that an allocation whose answer does not
// fit a slot is freed and refused.
#include "server/service/ring_transport.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "client/lib/ring/ring_submitter.h"
#include "common/ring/request_ring.h"
#include "common/ring/ring_kinds.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/service/worker_pool.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

PeerCred Self() { return PeerCred{getpid(), getuid(), getgid()}; }

class RingTransportUnitTest : public ::testing::Test {
 protected:
  RingTransportUnitTest() : backend_(std::vector<uint64_t>(16, 64 * kMiB)) {
    BrokerOptions o;
    o.pool.slab_size = 4 * kMiB;
    o.pool.granularity = 4096;
    o.reclaim_wait = absl::ZeroDuration();
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
  }
  void SetUp() override { ASSERT_TRUE(broker_->Start().ok()); }
  void TearDown() override {
    broker_->StopWaiting();
    if (rings_ != nullptr) rings_->Close();
    workers_.Shutdown();
    rings_.reset();
    broker_.reset();
  }

  void MakeRings(RingTransportOptions options) {
    absl::StatusOr<std::unique_ptr<RingTransport>> r =
        RingTransport::Create(broker_.get(), &workers_, nullptr, options);
    ASSERT_TRUE(r.ok()) << r.status();
    rings_ = *std::move(r);
  }
  // A session bound to a "connection", as a pid-0 caller's hello makes.
  PeerCred Bound() {
    PeerCred c{0, getuid(), getgid()};
    absl::StatusOr<std::shared_ptr<Session>> s = broker_->BindConnection(c);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) c.bound_session = (*s)->id();
    return c;
  }
  // Attaches a lent ring as a client would.
  std::unique_ptr<RingRegion> Attach(const LentRing& lent) {
    absl::StatusOr<std::unique_ptr<RingRegion>> r = RingRegion::Attach(lent.memfd, lent.eventfd);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  SimBackend backend_;
  std::unique_ptr<MemoryBroker> broker_;
  WorkerPool workers_{1};
  std::unique_ptr<RingTransport> rings_;
};

TEST_F(RingTransportUnitTest, LendRefusals) {
  RingTransportOptions off;
  off.enabled = false;
  MakeRings(off);
  absl::StatusOr<LentRing> refused = rings_->Lend(Self(), 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "request rings are off (--request_rings=false)");
  rings_.reset();

  RingTransportOptions two_per_uid;
  two_per_uid.max_rings_per_uid = 2;
  MakeRings(two_per_uid);
  // No session: a pid-0 caller without a hello.
  EXPECT_EQ(rings_->Lend(PeerCred{0, getuid(), getgid()}, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<LentRing> mine = rings_->Lend(Self(), 1000);  // capped
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size, RingLayoutBytes(kRingMaxSlots));
  std::unique_ptr<RingRegion> region = Attach(*mine);
  EXPECT_EQ(rings_->Lend(Self(), 0).status().code(), absl::StatusCode::kAlreadyExists);
  const PeerCred second = Bound();
  absl::StatusOr<LentRing> theirs = rings_->Lend(second, 0);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  std::unique_ptr<RingRegion> second_region = Attach(*theirs);
  absl::StatusOr<LentRing> third = rings_->Lend(Bound(), 0);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_TRUE(absl::StrContains(third.status().message(), "max_connections_per_uid"));
  EXPECT_EQ(rings_->ring_count(), 2u);
  // A session's end takes its ring; the uid may have one more then.
  broker_->EndConnection(second.bound_session);
  EXPECT_EQ(rings_->ring_count(), 1u);
  absl::StatusOr<LentRing> again = rings_->Lend(Bound(), 0);
  ASSERT_TRUE(again.ok()) << again.status();
  std::unique_ptr<RingRegion> third_region = Attach(*again);
}

TEST_F(RingTransportUnitTest, ASessionsEndAnswersWhatWaitsOnItsRing) {
  MakeRings({});
  const PeerCred caller = Bound();
  absl::StatusOr<LentRing> lent = rings_->Lend(caller, 4);
  ASSERT_TRUE(lent.ok()) << lent.status();
  std::unique_ptr<RingRegion> region = Attach(*lent);
  RingSubmitter submitter(region.get());
  // All of every device's memory (least loaded first: one each), then one
  // more that waits.
  v1::AllocateRequest all;
  all.set_size_bytes(64 * kMiB);
  for (int d = 0; d < 16; ++d) {
    absl::StatusOr<RingAnswer> a =
        submitter.Call(kRingAllocate, all.SerializeAsString(), absl::Seconds(30));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->code, absl::StatusCode::kOk) << a->bytes;
  }
  v1::AllocateRequest more;
  more.set_size_bytes(kMiB);
  more.set_wait_ms(60000);
  absl::StatusOr<RingAnswer> waited = absl::UnknownError("unset");
  std::thread caller_thread([&] {
    waited = submitter.Call(kRingAllocate, more.SerializeAsString(), absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(200));
  broker_->EndConnection(caller.bound_session);
  caller_thread.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_NE(waited->code, absl::StatusCode::kOk);
  EXPECT_EQ(rings_->ring_count(), 0u);
  EXPECT_EQ(broker_->live_allocations(), 0u);
}

TEST_F(RingTransportUnitTest, AnAnswerTooLargeForASlotIsRefusedAndItsMemoryFreed) {
  MakeRings({});
  absl::StatusOr<LentRing> lent = rings_->Lend(Self(), 4);
  ASSERT_TRUE(lent.ok()) << lent.status();
  std::unique_ptr<RingRegion> region = Attach(*lent);
  RingSubmitter submitter(region.get());
  v1::AllocateRequest sharded;
  sharded.set_size_bytes(16 * kMiB);
  sharded.set_shard_count(16);  // 16 allocations, each with its device's UUID
  absl::StatusOr<RingAnswer> a =
      submitter.Call(kRingAllocate, sharded.SerializeAsString(), absl::Seconds(30));
  ASSERT_TRUE(a.ok()) << a.status();
  if (a->code == absl::StatusCode::kOk) {
    GTEST_SKIP() << "the answer fit a slot (" << a->bytes.size() << " bytes)";
  }
  EXPECT_EQ(a->code, absl::StatusCode::kResourceExhausted) << a->bytes;
  EXPECT_TRUE(absl::StrContains(a->bytes, "answer too large for the request ring")) << a->bytes;
  EXPECT_EQ(broker_->live_allocations(), 0u);
}

}  // namespace
}  // namespace gpumem
