// What a tenant pins, through the core (server/core/memory_broker.h) over the
// sim backend with a QuotaBook, as the attacker tried it:
//  - 1 MiB quota, 256-byte blocks at a huge alignment: refused by name above
//    --max_alignment; at the largest allowed one, the tenant pins at most its
//    quota plus one granule per device, refused as quota ("footprint") past
//    it, and GetStats reports that footprint, per tenant and per device;
//  - a device's free_bytes is what another tenant then really gets (it gets
//    all of it);
//  - four tenants holding 256 bytes each pin 2 MiB slabs, not the slab size.
#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/quota/quota_book.h"
#include "tests/core/sleeping_child.h"
#include "tests/core/stats_of.h"

namespace gpumem {
namespace {

using ::gpumem::testing::SleepingChild;
using ::gpumem::v1::AllocateRequest;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kGran = 4096;
constexpr uid_t kAttacker = 4301;  // each uid is its own tenant (tenant id = uid)
constexpr uid_t kVictim = 4302;

AllocateRequest Request(uint64_t size, uint64_t alignment = 0) {
  AllocateRequest r;
  r.set_size_bytes(size);
  r.set_alignment(alignment);
  return r;
}

class FootprintQuotaTest : public ::testing::Test {
 protected:
  FootprintQuotaTest() : backend_({4 * kGiB, 4 * kGiB}), quotas_(2) {
    tenants::Quota q;
    q.total_bytes = kMiB;
    quotas_.SetQuota(kAttacker, q);
    BrokerOptions o;
    o.pool.slab_size = kGiB;
    o.pool.granularity = kGran;
    o.quotas = &quotas_;
    o.reclaim_wait = absl::ZeroDuration();
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
    EXPECT_TRUE(broker_->Start().ok());
  }
  ~FootprintQuotaTest() override { broker_.reset(); }

  const v1::TenantStats* TenantOf(const v1::GetStatsResponse& s, uint32_t tenant) {
    for (const auto& t : s.tenants()) {
      if (t.tenant() == tenant) return &t;
    }
    return nullptr;
  }

  SimBackend backend_;
  quota::QuotaBook quotas_;  // outlives the broker
  std::unique_ptr<MemoryBroker> broker_;
  SleepingChild attacker_, victim_;
};

TEST_F(FootprintQuotaTest, AlignmentPastTheMaximumIsRefusedByName) {
  auto r = broker_->AllocateAndWait(attacker_.Cred(kAttacker, kAttacker), Request(256, kGiB));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--max_alignment")) << r.status();
  EXPECT_EQ(broker_->live_allocations(), 0u);
}

TEST_F(FootprintQuotaTest, TinyAlignedBlocksPinAtMostTheQuota) {
  const PeerCred attacker = attacker_.Cred(kAttacker, kAttacker);
  int served = 0;
  absl::Status last;
  for (int i = 0; i < 64; ++i) {
    auto r = broker_->AllocateAndWait(attacker, Request(256, 2 * kMiB));
    if (r.ok()) {
      ++served;
    } else {
      last = r.status();
    }
  }
  EXPECT_GE(served, 1);
  ASSERT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  EXPECT_TRUE(absl::StrContains(last.message(), "quota")) << last;
  EXPECT_TRUE(absl::StrContains(last.message(), "footprint")) << last;

  const v1::GetStatsResponse s = StatsOf(*broker_, PeerCred{getpid(), 0, 0});
  const v1::TenantStats* t = TenantOf(s, kAttacker);
  ASSERT_NE(t, nullptr);
  EXPECT_LE(t->footprint_bytes(), kMiB + kGran);
  EXPECT_EQ(t->used_bytes(), static_cast<uint64_t>(served) * 256);
  uint64_t per_device = 0, pooled = 0, free_bytes = 0;
  for (const auto& d : t->devices()) per_device += d.footprint_bytes();
  for (const auto& d : s.devices()) {
    pooled += d.pooled_bytes();
    free_bytes += d.free_bytes();
  }
  EXPECT_EQ(per_device, t->footprint_bytes());
  EXPECT_EQ(pooled, t->footprint_bytes());
  EXPECT_EQ(free_bytes, 8 * kGiB - t->footprint_bytes());

  // Another tenant gets what free_bytes says: all of both devices but that.
  const PeerCred victim = victim_.Cred(kVictim, kVictim);
  for (const auto& d : s.devices()) {
    AllocateRequest r = Request(d.free_bytes());
    r.mutable_placement()->add_devices(std::to_string(d.index()));
    auto got = broker_->AllocateAndWait(victim, r);
    EXPECT_TRUE(got.ok()) << "device " << d.index() << ": " << got.status();
  }
}

TEST_F(FootprintQuotaTest, SmallHoldsOfManyTenantsPinSmallSlabs) {
  std::vector<std::unique_ptr<SleepingChild>> procs;
  for (uid_t uid = 5001; uid <= 5004; ++uid) {
    procs.push_back(std::make_unique<SleepingChild>());
    AllocateRequest r = Request(256);
    r.mutable_placement()->add_devices("0");
    ASSERT_TRUE(broker_->AllocateAndWait(procs.back()->Cred(uid, uid), r).ok());
  }
  const v1::GetStatsResponse s = StatsOf(*broker_, PeerCred{getpid(), 0, 0});
  EXPECT_EQ(s.devices(0).pooled_bytes(), 4 * 2 * kMiB);
  EXPECT_EQ(s.devices(0).free_bytes(), 4 * kGiB - 8 * kMiB);
}

}  // namespace
}  // namespace gpumem
