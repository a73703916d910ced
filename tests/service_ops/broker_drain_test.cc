// MemoryBroker's drain state (what SIGTERM turns on): Allocate answers
// UNAVAILABLE "gpumemd is stopping"; Free, GetStats and GetSession keep
// working; WaitUntilNoAllocations reports whether the last allocation went,
// also when it goes from another thread while the wait is on. And the
// reloadable pool setting reaches the pools.
#include <unistd.h>

#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "tests/core/stats_of.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

class BrokerDrainTest : public ::testing::Test {
 protected:
  BrokerDrainTest() : backend_({256 * kMiB, 256 * kMiB}, {}) {
    BrokerOptions options;
    options.pool.slab_size = 16 * kMiB;
    options.pool.granularity = 4096;
    options.maintenance_interval = absl::Milliseconds(20);
    broker_ = std::make_unique<MemoryBroker>(&backend_, options);
    EXPECT_TRUE(broker_->Start().ok());
    me_.pid = getpid();
    me_.uid = getuid();
    me_.gid = getgid();
  }

  absl::StatusOr<v1::AllocateResponse> Allocate(uint64_t bytes) {
    v1::AllocateRequest req;
    req.set_size_bytes(bytes);
    return broker_->AllocateAndWait(me_, req);
  }

  SimBackend backend_;
  std::unique_ptr<MemoryBroker> broker_;
  PeerCred me_;
};

TEST_F(BrokerDrainTest, DrainingRefusesAllocateOnlyAndWaitsForTheLastFree) {
  absl::StatusOr<v1::AllocateResponse> a = Allocate(kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(broker_->live_allocations(), 1u);
  EXPECT_FALSE(broker_->WaitUntilNoAllocations(absl::Milliseconds(10)));

  broker_->BeginDrain();
  absl::StatusOr<v1::AllocateResponse> refused = Allocate(kMiB);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("gpumemd is stopping"), std::string::npos);
  EXPECT_TRUE(broker_->GetSession(me_).ok());
  EXPECT_EQ(StatsOf(*broker_, me_).devices(0).allocation_count() +
                StatsOf(*broker_, me_).devices(1).allocation_count(), 1u);

  // The last Free, from another thread, ends a wait that is already on.
  const uint64_t id = a->allocations(0).id();
  std::thread freer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    v1::FreeRequest f;
    f.set_id(id);
    EXPECT_TRUE(broker_->Free(me_, f).ok());
  });
  EXPECT_TRUE(broker_->WaitUntilNoAllocations(absl::Seconds(60)));
  freer.join();
  EXPECT_EQ(broker_->live_allocations(), 0u);
  broker_->BeginDrain();  // idempotent
  EXPECT_EQ(Allocate(kMiB).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(BrokerDrainTest, ReloadedEmptySlabReleaseReachesThePools) {
  broker_->SetEmptySlabRelease(absl::Hours(1));
  absl::StatusOr<v1::AllocateResponse> a = Allocate(kMiB);
  ASSERT_TRUE(a.ok());
  v1::FreeRequest f;
  f.set_id(a->allocations(0).id());
  ASSERT_TRUE(broker_->Free(me_, f).ok());
  const uint32_t device = a->allocations(0).device_index();
  absl::SleepFor(absl::Milliseconds(200));  // 10 maintenance passes
  EXPECT_EQ(StatsOf(*broker_, me_).devices(device).slab_count(), 1u);

  broker_->SetEmptySlabRelease(absl::ZeroDuration());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (StatsOf(*broker_, me_).devices(device).slab_count() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(StatsOf(*broker_, me_).devices(device).slab_count(), 0u);
}

}  // namespace
}  // namespace gpumem
