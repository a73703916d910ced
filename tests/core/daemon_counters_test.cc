// GetStats' DaemonCounters and per-tenant peak / waiting figures: the
// DaemonCounters class alone (server/core/daemon_counters.h), and all of
// them through a MemoryBroker over SimBackend with a QuotaBook: allocations
// per shard, frees by Free and by a session ending, each refused request
// counted once under its reason (drain refusals too), the tenant's peak
// from committed allocations only (a refused request, even one that placed
// a shard first, never raises it), a waiting request shown for its tenant
// while it waits (a waiting tenant holding nothing has a row), and the
// session's tenant in GetSession.
#include "server/core/daemon_counters.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/core/sleeping_child.h"
#include "common/refusal_payload.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/quota/quota_book.h"
#include "server/service/stats_proto.h"

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

TEST(DaemonCounters, CountsTotalsAndRefusalsByTheSharedRule) {
  DaemonCounters c;
  c.Allocated(3);
  c.Allocated(1);
  c.Returned(2);
  c.Refused(Refused({v1::DeviceRefusal::REASON_CAPACITY}));
  c.Refused(Refused({v1::DeviceRefusal::REASON_FRAGMENTATION, v1::DeviceRefusal::REASON_EXCLUDED,
                     v1::DeviceRefusal::REASON_EXCLUDED}));
  c.Refused(Refused({v1::DeviceRefusal::REASON_QUOTA}));
  c.Refused(Refused({v1::DeviceRefusal::REASON_QUOTA, v1::DeviceRefusal::REASON_CAPACITY,
                     v1::DeviceRefusal::REASON_QUOTA}));
  c.Refused(Refused({v1::DeviceRefusal::REASON_EXCLUDED}));  // no reason of the three
  c.Refused(absl::UnavailableError("stopping"));
  absl::SleepFor(absl::Milliseconds(20));
  const CounterView v = c.View();
  EXPECT_EQ(v.allocations, 4u);
  EXPECT_EQ(v.frees, 2u);
  EXPECT_EQ(v.refused_capacity, 1u);
  EXPECT_EQ(v.refused_fragmentation, 1u);
  EXPECT_EQ(v.refused_quota, 2u);
  EXPECT_EQ(v.refused_other, 2u);
  EXPECT_EQ(v.waiting_requests, 0u);  // admission's figure, filled by the broker
  EXPECT_GE(v.uptime_seconds, 0.02);
  EXPECT_LT(v.uptime_seconds, 60);
}

TEST(DaemonCounters, ConcurrentRecordsAllCount) {
  DaemonCounters c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < 10000; ++i) {
        c.Allocated(1);
        c.Returned(1);
        c.Refused(absl::InvalidArgumentError("x"));
      }
    });
  }
  for (auto& th : threads) th.join();
  const CounterView v = c.View();
  EXPECT_EQ(v.allocations, 40000u);
  EXPECT_EQ(v.frees, 40000u);
  EXPECT_EQ(v.refused_other, 40000u);
}

using testing::SleepingChild;

class BrokerCountersTest : public ::testing::Test {
 protected:
  BrokerCountersTest() : backend_({64 * kMiB, 64 * kMiB}), quotas_(2) {}

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

  MemoryBroker::AllocateAnswer Alloc(const PeerCred& c, uint64_t size, uint32_t shards = 0,
                                     uint32_t wait_ms = 0) {
    v1::AllocateRequest r;
    r.set_size_bytes(size);
    r.set_shard_count(shards);
    r.set_wait_ms(wait_ms);
    return broker_->AllocateAndWait(c, r);
  }
  absl::Status Free(uint64_t id) {
    v1::FreeRequest r;
    r.set_id(id);
    return broker_->Free(Self(), r).status();
  }
  // What an administrator's GetStats shows (counters included).
  v1::GetStatsResponse Stats() const {
    return RenderStats(broker_->Stats(PeerCred{getpid(), 0, 0}));
  }
  static const v1::TenantStats* Tenant(const v1::GetStatsResponse& s, uint32_t id) {
    for (const auto& t : s.tenants()) {
      if (t.tenant() == id) return &t;
    }
    return nullptr;
  }
  // Polls Stats() until `done` holds (at most 10 s).
  v1::GetStatsResponse StatsWhen(const std::function<bool(const v1::GetStatsResponse&)>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    v1::GetStatsResponse s = Stats();
    while (!done(s) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
      s = Stats();
    }
    return s;
  }
  void SetTotalQuota(uint64_t bytes) {
    tenants::Quota q;
    q.total_bytes = bytes;
    quotas_.SetQuota(getuid(), q);
    broker_->QuotasChanged();
  }

  SleepingChild child_;
  SimBackend backend_;
  quota::QuotaBook quotas_;
  std::unique_ptr<MemoryBroker> broker_;
};

TEST_F(BrokerCountersTest, AllocationsFreesAndRefusalsAreCounted) {
  MemoryBroker::AllocateAnswer a = Alloc(Self(), 4 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  MemoryBroker::AllocateAnswer sharded = Alloc(Self(), 8 * kMiB, 2);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  MemoryBroker::AllocateAnswer child = Alloc(child_.Cred(), 2 * kMiB);
  ASSERT_TRUE(child.ok()) << child.status();
  // Capacity: 62 MiB on a 64 MiB device after 4+4+2 MiB were taken.
  v1::AllocateRequest big;
  big.set_size_bytes(62 * kMiB);
  big.mutable_placement()->add_devices("0");
  EXPECT_EQ(broker_->AllocateAndWait(Self(), big).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Other: larger than any device; a device that does not exist.
  EXPECT_EQ(Alloc(Self(), 1024 * kMiB).status().code(), absl::StatusCode::kInvalidArgument);
  v1::AllocateRequest bad;
  bad.set_size_bytes(kMiB);
  bad.mutable_placement()->add_devices("7");
  EXPECT_EQ(broker_->AllocateAndWait(Self(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Quota.
  SetTotalQuota(13 * kMiB);
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
  s = StatsWhen([](const v1::GetStatsResponse& s) { return s.counters().frees() >= 2; });
  EXPECT_EQ(s.counters().frees(), 2u);
  // The peak stays where it was.
  mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->used_bytes(), 8 * kMiB);
  EXPECT_EQ(mine->peak_bytes(), 14 * kMiB);
}

TEST_F(BrokerCountersTest, ARefusedRequestNeverRaisesThePeak) {
  SetTotalQuota(10 * kMiB);
  MemoryBroker::AllocateAnswer held = Alloc(Self(), 4 * kMiB);
  ASSERT_TRUE(held.ok()) << held.status();
  // Two shards of 4 MiB: the first is charged and carved (8 <= 10), the
  // second is refused by the quota (12 > 10), and the first goes back.
  MemoryBroker::AllocateAnswer sharded = Alloc(Self(), 8 * kMiB, 2);
  EXPECT_EQ(sharded.status().code(), absl::StatusCode::kResourceExhausted) << sharded.status();
  EXPECT_EQ(quotas_.Holdings(getuid()).total_bytes, 4 * kMiB);
  EXPECT_EQ(quotas_.Holdings(getuid()).pending_bytes, 0u);
  v1::GetStatsResponse s = Stats();
  const v1::TenantStats* mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->peak_bytes(), 4 * kMiB);
  EXPECT_EQ(s.counters().refused_quota(), 1u);
  EXPECT_EQ(s.counters().allocations(), 1u);
  // Served later, it counts.
  SetTotalQuota(12 * kMiB);
  sharded = Alloc(Self(), 8 * kMiB, 2);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  s = Stats();
  EXPECT_EQ(Tenant(s, getuid())->peak_bytes(), 12 * kMiB);
  EXPECT_EQ(s.counters().allocations(), 3u);
}

TEST_F(BrokerCountersTest, RefusalsWhileDrainingAreCounted) {
  broker_->BeginDrain();
  EXPECT_EQ(Alloc(Self(), kMiB).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Stats().counters().refused_other(), 1u);
}

TEST_F(BrokerCountersTest, AWaitingRequestIsShownForItsTenantAndCountedOnce) {
  SetTotalQuota(4 * kMiB);
  MemoryBroker::AllocateAnswer held = Alloc(Self(), 4 * kMiB);
  ASSERT_TRUE(held.ok()) << held.status();
  std::atomic<bool> served{false};
  std::thread waiter([&] {
    MemoryBroker::AllocateAnswer r = Alloc(Self(), 2 * kMiB, 0, 20000);
    served = r.ok();
  });
  v1::GetStatsResponse s =
      StatsWhen([](const v1::GetStatsResponse& s) { return s.counters().waiting_requests() > 0; });
  EXPECT_EQ(s.counters().waiting_requests(), 1u);
  const v1::TenantStats* mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->waiting_requests(), 1u);
  // A caller of another uid sees the daemon-wide figure, not the tenant.
  v1::GetStatsResponse other = RenderStats(broker_->Stats(PeerCred{getpid(), 65534, 65534}));
  EXPECT_EQ(other.counters().waiting_requests(), 1u);
  EXPECT_EQ(Tenant(other, getuid()), nullptr);

  ASSERT_TRUE(Free(held->allocations(0).id()).ok());  // serves the waiter
  waiter.join();
  EXPECT_TRUE(served);
  // Admission counts a request out of its tenant's figure once its answer
  // is delivered (the daemon-wide figure once it is taken from the queue).
  s = StatsWhen([](const v1::GetStatsResponse& s) {
    const v1::TenantStats* t = Tenant(s, getuid());
    return s.counters().waiting_requests() == 0 && t != nullptr && t->waiting_requests() == 0;
  });
  EXPECT_EQ(s.counters().waiting_requests(), 0u);
  ASSERT_NE(Tenant(s, getuid()), nullptr);
  EXPECT_EQ(Tenant(s, getuid())->waiting_requests(), 0u);
  EXPECT_EQ(s.counters().allocations(), 2u);
  // It waited through refusals, but was served: no refusal counted.
  EXPECT_EQ(s.counters().refused_quota(), 0u);
  EXPECT_EQ(s.counters().refused_other(), 0u);
}

TEST_F(BrokerCountersTest, AWaitingTenantHoldingNothingHasARow) {
  SetTotalQuota(kMiB);
  std::thread waiter([&] { (void)Alloc(Self(), 2 * kMiB, 0, 300); });
  v1::GetStatsResponse s =
      StatsWhen([](const v1::GetStatsResponse& s) { return s.counters().waiting_requests() > 0; });
  const v1::TenantStats* mine = Tenant(s, getuid());
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->waiting_requests(), 1u);
  EXPECT_EQ(mine->used_bytes(), 0u);
  waiter.join();
  s = StatsWhen([](const v1::GetStatsResponse& s) {
    return s.counters().waiting_requests() == 0 && Tenant(s, getuid()) == nullptr;
  });
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
