// GetStats' DaemonCounters and per-tenant peak / waiting figures: the
// DaemonCounters class alone, the shared refusal rule, the quota book's
// peak, and all of them through a MemoryBroker over SimBackend (allocations
// per shard, frees by Free and by a session ending, each refused request
// counted once under its reason, a waiting request shown for its tenant
// while it waits, the session's tenant in GetSession).
#include "server/service/daemon_counters.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "common/refusal_payload.h"
#include "server/backend/sim_backend.h"
#include "server/quota/quota_book.h"
#include "server/service/memory_broker.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

absl::Status Refused(std::vector<v1::DeviceRefusal::Reason> reasons) {
  v1::PlacementRefusal r;
  for (size_t i = 0; i < reasons.size(); ++i) {
    v1::DeviceRefusal* d = r.add_devices();
    d->set_device_index(static_cast<uint32_t>(i));
    d->set_reason(reasons[i]);
  }
  absl::Status s = absl::ResourceExhaustedError("no room");
  s.SetPayload(kPlacementRefusalTypeUrl, absl::Cord(r.SerializeAsString()));
  return s;
}

TEST(RefusalKind, MostCommonDeviceReasonElseOther) {
  using R = v1::DeviceRefusal;
  EXPECT_EQ(RefusalKindOf(Refused({R::REASON_QUOTA, R::REASON_CAPACITY, R::REASON_QUOTA})),
            RefusalKind::kQuota);
  EXPECT_EQ(RefusalKindOf(Refused({R::REASON_FRAGMENTATION, R::REASON_EXCLUDED,
                                   R::REASON_EXCLUDED})),
            RefusalKind::kFragmentation);
  // A tie goes to the first of capacity, fragmentation, quota.
  EXPECT_EQ(RefusalKindOf(Refused({R::REASON_QUOTA, R::REASON_CAPACITY})),
            RefusalKind::kCapacity);
  // Only excluded devices: no reason of the three.
  EXPECT_EQ(RefusalKindOf(Refused({R::REASON_EXCLUDED})), RefusalKind::kOther);
  EXPECT_EQ(RefusalKindOf(absl::InvalidArgumentError("size 0")), RefusalKind::kOther);
  EXPECT_EQ(RefusalLabel(absl::StatusCode::kInvalidArgument, std::nullopt), "invalid_argument");
  EXPECT_EQ(RefusalLabel(absl::StatusCode::kResourceExhausted,
                         RefusalFromStatus(Refused({R::REASON_CAPACITY}))),
            "capacity");
}

TEST(DaemonCounters, FillsTotalsAndSumsWaitingOverTenants) {
  DaemonCounters c;
  c.RecordAllocations(3);
  c.RecordAllocations(1);
  c.RecordFrees(2);
  c.RecordRefusal(Refused({v1::DeviceRefusal::REASON_CAPACITY}));
  c.RecordRefusal(Refused({v1::DeviceRefusal::REASON_FRAGMENTATION}));
  c.RecordRefusal(Refused({v1::DeviceRefusal::REASON_QUOTA}));
  c.RecordRefusal(Refused({v1::DeviceRefusal::REASON_QUOTA}));
  c.RecordRefusal(absl::UnavailableError("stopping"));
  c.RecordWaitStart(7);
  c.RecordWaitStart(7);
  c.RecordWaitStart(9);
  c.RecordWaitEnd(9);
  c.RecordWaitEnd(12);  // unpaired: ignored
  v1::DaemonCounters out;
  absl::SleepFor(absl::Milliseconds(20));
  c.Fill(&out);
  EXPECT_EQ(out.allocations(), 4u);
  EXPECT_EQ(out.frees(), 2u);
  EXPECT_EQ(out.refused_capacity(), 1u);
  EXPECT_EQ(out.refused_fragmentation(), 1u);
  EXPECT_EQ(out.refused_quota(), 2u);
  EXPECT_EQ(out.refused_other(), 1u);
  EXPECT_EQ(out.waiting_requests(), 2u);
  EXPECT_GE(out.uptime_seconds(), 0.02);
  EXPECT_LT(out.uptime_seconds(), 60);
  EXPECT_EQ(c.WaitingOf(7), 2u);
  EXPECT_EQ(c.WaitingOf(9), 0u);
  EXPECT_EQ(c.WaitingTenants(), std::vector<uint32_t>{7});
}

TEST(DaemonCounters, ConcurrentRecordsAllCount) {
  DaemonCounters c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, t] {
      for (int i = 0; i < 10000; ++i) {
        c.RecordAllocations(1);
        c.RecordFrees(1);
        c.RecordWaitStart(t % 2);
        c.RecordWaitEnd(t % 2);
      }
    });
  }
  for (auto& th : threads) th.join();
  v1::DaemonCounters out;
  c.Fill(&out);
  EXPECT_EQ(out.allocations(), 40000u);
  EXPECT_EQ(out.frees(), 40000u);
  EXPECT_EQ(out.waiting_requests(), 0u);
  EXPECT_TRUE(c.WaitingTenants().empty());
}

TEST(QuotaBookPeak, IsTheMostEverHeldInCommittedCharges) {
  quota::QuotaBook book(2);
  quota::QuotaRefusal why;
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 10, &why));
  book.Commit(1, 10);
  ASSERT_TRUE(book.TryCharge(1, "t", 1, 30, &why));
  book.Commit(1, 30);
  book.Credit(1, 1, 30);
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 5, &why));
  book.Commit(1, 5);
  EXPECT_EQ(book.Holdings(1).total_bytes, 15u);
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 40u);
  // A charge undone before it was committed never counts.
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 100, &why));
  EXPECT_EQ(book.Holdings(1).pending_bytes, 100u);
  book.Uncharge(1, 0, 100);
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 1, &why));
  book.Commit(1, 1);
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 40u);
  EXPECT_EQ(book.Holdings(1).total_bytes, 16u);
  EXPECT_EQ(book.Holdings(1).pending_bytes, 0u);
  // Charged and credited without a commit (a caller that never commits):
  // nothing pending is left behind, and the peak is untouched.
  ASSERT_TRUE(book.TryCharge(2, "u", 0, 8, &why));
  book.Credit(2, 0, 8);
  book.Commit(2, 0);
  EXPECT_EQ(book.Holdings(2).pending_bytes, 0u);
  EXPECT_EQ(book.Holdings(2).peak_total_bytes, 0u);
}

// A child that sleeps until killed: a second session whose end the broker
// sees (forked before the broker's threads start).
class SleepingChild {
 public:
  SleepingChild() {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (;;) pause();
    }
  }
  ~SleepingChild() { Kill(); }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  PeerCred Cred() const { return PeerCred{pid_, getuid(), getgid()}; }

 private:
  pid_t pid_ = -1;
};

class BrokerCountersTest : public ::testing::Test {
 protected:
  BrokerCountersTest()
      : backend_({64 * kMiB, 64 * kMiB}), quotas_(2) {}

  void SetUp() override {
    BrokerOptions o;
    o.pool.slab_size = 16 * kMiB;
    o.pool.granularity = 4096;
    o.quotas = &quotas_;
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
    ASSERT_TRUE(broker_->Start().ok());
  }
  void TearDown() override { broker_.reset(); }

  PeerCred Self() const { return PeerCred{getpid(), getuid(), getgid()}; }

  absl::StatusOr<v1::AllocateResponse> Alloc(const PeerCred& c, uint64_t size,
                                             uint32_t shards = 0, uint32_t wait_ms = 0) {
    v1::AllocateRequest r;
    r.set_size_bytes(size);
    r.set_shard_count(shards);
    r.set_wait_ms(wait_ms);
    return broker_->Allocate(c, r);
  }
  absl::Status Free(uint64_t id) {
    v1::FreeRequest r;
    r.set_id(id);
    return broker_->Free(Self(), r).status();
  }
  v1::GetStatsResponse Stats() const { return broker_->Stats(PeerCred{getpid(), 0, 0}); }
  const v1::TenantStats* Tenant(const v1::GetStatsResponse& s, uint32_t id) const {
    for (const auto& t : s.tenants()) {
      if (t.tenant() == id) return &t;
    }
    return nullptr;
  }

  SleepingChild child_;
  SimBackend backend_;
  quota::QuotaBook quotas_;
  std::unique_ptr<MemoryBroker> broker_;
};

TEST_F(BrokerCountersTest, AllocationsFreesAndRefusalsAreCounted) {
  absl::StatusOr<v1::AllocateResponse> a = Alloc(Self(), 4 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<v1::AllocateResponse> sharded = Alloc(Self(), 8 * kMiB, 2);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  absl::StatusOr<v1::AllocateResponse> child = Alloc(child_.Cred(), 2 * kMiB);
  ASSERT_TRUE(child.ok()) << child.status();
  // Capacity: 60 MiB on one device after 4+4+2 MiB were taken.
  v1::AllocateRequest big;
  big.set_size_bytes(62 * kMiB);
  big.mutable_placement()->add_devices("0");
  EXPECT_EQ(broker_->Allocate(Self(), big).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Other: larger than any device; a bad selector.
  EXPECT_EQ(Alloc(Self(), 1024 * kMiB).status().code(), absl::StatusCode::kInvalidArgument);
  v1::AllocateRequest bad;
  bad.set_size_bytes(kMiB);
  bad.mutable_placement()->add_devices("7");
  EXPECT_EQ(broker_->Allocate(Self(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Quota.
  tenants::Quota q;
  q.total_bytes = 13 * kMiB;
  quotas_.SetQuota(getuid(), q);
  EXPECT_EQ(Alloc(Self(), 2 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);

  v1::GetStatsResponse s = Stats();
  EXPECT_EQ(s.counters().allocations(), 4u);  // 1 + 2 shards + the child's
  EXPECT_EQ(s.counters().frees(), 0u);
  EXPECT_EQ(s.counters().refused_capacity(), 1u);
  EXPECT_EQ(s.counters().refused_quota(), 1u);
  EXPECT_EQ(s.counters().refused_other(), 2u);
  EXPECT_EQ(s.counters().refused_fragmentation(), 0u);
  const v1::TenantStats* mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->peak_bytes(), 14 * kMiB);
  EXPECT_EQ(mine->waiting_requests(), 0u);

  // Frees: one by Free, the child's by its session ending.
  ASSERT_TRUE(Free(a->allocations(0).id()).ok());
  child_.Kill();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Stats().counters().frees() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  s = Stats();
  EXPECT_EQ(s.counters().frees(), 2u);
  // The peak stays where it was.
  mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->used_bytes(), 8 * kMiB);
  EXPECT_EQ(mine->peak_bytes(), 14 * kMiB);
}

TEST_F(BrokerCountersTest, AWaitingRequestIsShownForItsTenantAndCountedOnce) {
  tenants::Quota q;
  q.total_bytes = 4 * kMiB;
  quotas_.SetQuota(getuid(), q);
  absl::StatusOr<v1::AllocateResponse> held = Alloc(Self(), 4 * kMiB);
  ASSERT_TRUE(held.ok()) << held.status();
  std::atomic<bool> served{false};
  std::thread waiter([&] {
    absl::StatusOr<v1::AllocateResponse> r = Alloc(Self(), 2 * kMiB, 0, 20000);
    served = r.ok();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Stats().counters().waiting_requests() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  v1::GetStatsResponse s = Stats();
  EXPECT_EQ(s.counters().waiting_requests(), 1u);
  const v1::TenantStats* mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->waiting_requests(), 1u);
  // A caller of another uid sees the daemon-wide figure, not the tenant.
  v1::GetStatsResponse other = broker_->Stats(PeerCred{getpid(), 65534, 65534});
  EXPECT_EQ(other.counters().waiting_requests(), 1u);
  EXPECT_EQ(Tenant(other, getuid()), nullptr);

  ASSERT_TRUE(Free(held->allocations(0).id()).ok());  // serves the waiter
  waiter.join();
  EXPECT_TRUE(served);
  s = Stats();
  EXPECT_EQ(s.counters().waiting_requests(), 0u);
  EXPECT_EQ(Tenant(s, getuid())->waiting_requests(), 0u);
  EXPECT_EQ(s.counters().allocations(), 2u);
  // It waited through refusals, but was served: no refusal counted.
  EXPECT_EQ(s.counters().refused_quota(), 0u);
  EXPECT_EQ(s.counters().refused_other(), 0u);
}

TEST_F(BrokerCountersTest, AWaitingTenantHoldingNothingHasARow) {
  tenants::Quota q;
  q.total_bytes = kMiB;
  quotas_.SetQuota(getuid(), q);
  std::thread waiter([&] { (void)Alloc(Self(), 2 * kMiB, 0, 300); });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Stats().counters().waiting_requests() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  v1::GetStatsResponse s = Stats();
  const v1::TenantStats* mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->waiting_requests(), 1u);
  EXPECT_EQ(mine->used_bytes(), 0u);
  waiter.join();
  s = Stats();
  EXPECT_EQ(s.counters().refused_quota(), 1u);  // timed out: refused once
  EXPECT_EQ(Tenant(s, getuid()), nullptr);
}

TEST_F(BrokerCountersTest, SessionNamesItsTenant) {
  absl::StatusOr<v1::Session> s = broker_->GetSession(Self());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->has_tenant());
  EXPECT_EQ(s->tenant(), getuid());
  EXPECT_EQ(s->tenant_name(), "uid-" + std::to_string(getuid()));
}

}  // namespace
}  // namespace gpumem
