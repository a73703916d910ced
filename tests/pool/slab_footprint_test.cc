// Tests of what a tenant pins ("a quota bounds the footprint"):
// SlabPool's per-tenant slab sizing (a small tenant gets small slabs that grow
// with its use), the FootprintBook budget (server/quota/footprint_book.h) that
// keeps a tenant's slab bytes within its quota plus one granule per device,
// even with blocks aligned to make every one take a slab of its own and with
// carves racing on two devices, and the device's free_bytes, which is what
// another tenant could really get.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/pool/slab_pool.h"
#include "server/quota/footprint_book.h"

namespace gpumem {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kGran = 4096;

PoolOptions Options(uint64_t slab_size = kGiB, uint64_t min_slab = 2 * kMiB) {
  PoolOptions o;
  o.slab_size = slab_size;
  o.min_slab_size = min_slab;
  o.granularity = kGran;
  o.empty_release_after = absl::Seconds(60);
  return o;
}

tenants::Quota TotalQuota(uint64_t bytes) {
  tenants::Quota q;
  q.total_bytes = bytes;
  return q;
}

uint64_t SlabSize(const SlabPool& pool, uint64_t slab_id) {
  for (const SlabStats& s : pool.Slabs()) {
    if (s.slab_id == slab_id) return s.size;
  }
  return 0;
}

uint64_t Footprint(const SlabPool& pool, uint32_t tenant) {
  auto t = pool.TenantStats();
  auto it = t.find(tenant);
  return it == t.end() ? 0 : it->second.footprint_bytes();
}

TEST(SlabFootprintTest, SmallTenantGetsASmallSlabThatGrowsWithItsUse) {
  SimBackend backend({4 * kGiB});
  SlabPool pool(&backend, 0, Options());
  // A 256-byte block: a 2 MiB slab, not a 1 GiB one.
  CarveResult a = pool.Carve(256, 256, /*tenant=*/1);
  ASSERT_EQ(a.kind, CarveResult::Kind::kBlock) << a.error;
  EXPECT_EQ(SlabSize(pool, a.block.slab_id), 2 * kMiB);
  EXPECT_EQ(Footprint(pool, 1), 2 * kMiB);
  // Blocks that do not fit get slabs as large as the tenant's slabs
  // together (a power of two), so the footprint at most doubles what it
  // fills: 2, 2, 4, 8, ... MiB.
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 6; ++i) {
    CarveResult b = pool.Carve(2 * kMiB, 256, 1);
    ASSERT_EQ(b.kind, CarveResult::Kind::kBlock) << b.error;
    if (b.block.new_slab) sizes.push_back(SlabSize(pool, b.block.slab_id));
  }
  ASSERT_GE(sizes.size(), 3u);
  EXPECT_EQ(sizes[0], 2 * kMiB);
  EXPECT_EQ(sizes[1], 4 * kMiB);
  EXPECT_EQ(sizes[2], 8 * kMiB);
  auto t = pool.TenantStats()[1];
  EXPECT_LE(t.slab_bytes, 2 * (t.used_bytes + 2 * kMiB));
  // Another tenant starts small again.
  CarveResult c = pool.Carve(256, 256, 2);
  ASSERT_EQ(c.kind, CarveResult::Kind::kBlock);
  EXPECT_EQ(SlabSize(pool, c.block.slab_id), 2 * kMiB);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabFootprintTest, GrowthStopsAtTheSlabSize) {
  SimBackend backend({4 * kGiB});
  SlabPool pool(&backend, 0, Options(/*slab_size=*/16 * kMiB));
  for (int i = 0; i < 8; ++i) {
    CarveResult b = pool.Carve(12 * kMiB, 256, 1);
    ASSERT_EQ(b.kind, CarveResult::Kind::kBlock) << b.error;
    EXPECT_LE(SlabSize(pool, b.block.slab_id), 16 * kMiB);
  }
}

TEST(SlabFootprintTest, FourTenantsOfTinyHoldsDoNotFillADevice) {
  // The case without the alignment trick: 4 uids holding 256 bytes
  // each pinned a 1 GiB slab apiece and filled a 4 GiB device.
  SimBackend backend({4 * kGiB});
  SlabPool pool(&backend, 0, Options());
  for (uint32_t tenant = 1; tenant <= 4; ++tenant) {
    ASSERT_EQ(pool.Carve(256, 256, tenant).kind, CarveResult::Kind::kBlock);
  }
  EXPECT_EQ(pool.Stats().pooled_bytes, 4 * 2 * kMiB);
  EXPECT_EQ(pool.Stats().free_bytes, 4 * kGiB - 8 * kMiB);
  CarveResult big = pool.Carve(3 * kGiB, 256, 5);
  EXPECT_EQ(big.kind, CarveResult::Kind::kBlock) << big.refusal.message;
}

TEST(SlabFootprintTest, QuotaBoundsSlabsEvenWithHugeAlignment) {
  // The attack: a 1 MiB quota, 256-byte blocks at an alignment as
  // large as a slab, so each would land at offset 0 of a fresh slab.
  SimBackend backend({4 * kGiB, 4 * kGiB});
  quota::FootprintBook book(2);
  book.SetLimits(7, TotalQuota(kMiB));
  SlabPool pool0(&backend, 0, Options());
  SlabPool pool1(&backend, 1, Options());
  pool0.SetBudget(&book);
  pool1.SetBudget(&book);
  int blocks = 0;
  std::optional<::gpumem::Refusal> refused;
  for (int i = 0; i < 64; ++i) {
    SlabPool& pool = i % 2 == 0 ? pool0 : pool1;
    CarveResult r = pool.Carve(256, kGiB, 7);
    if (r.kind == CarveResult::Kind::kBlock) {
      ++blocks;
    } else {
      ASSERT_EQ(r.kind, CarveResult::Kind::kRefused) << r.error;
      refused = r.refusal;
    }
  }
  // Each block took a slab of its own (halving what the quota left), never
  // more than the quota allows.
  EXPECT_GE(blocks, 1);
  EXPECT_LE(blocks, static_cast<int>((kMiB + kGran) / kGran));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, RefusalReason::kQuota);
  EXPECT_THAT(refused->message, HasSubstr("footprint"));
  EXPECT_THAT(refused->message, HasSubstr("total_bytes"));
  // What it pins: within its quota plus one granule (on all devices).
  const uint64_t pinned = Footprint(pool0, 7) + Footprint(pool1, 7);
  EXPECT_LE(pinned, kMiB + kGran);
  EXPECT_EQ(book.Footprint(7), pinned);
  EXPECT_EQ(pool0.Stats().pooled_bytes + pool1.Stats().pooled_bytes, pinned);
  // Everyone else still sees (and gets) the rest of both devices.
  EXPECT_GE(pool0.Stats().free_bytes + pool1.Stats().free_bytes, 8 * kGiB - kMiB - kGran);
  EXPECT_EQ(pool1.Carve(3 * kGiB, 256, 8).kind, CarveResult::Kind::kBlock);
}

TEST(SlabFootprintTest, PerDeviceQuotaBoundsThatDevice) {
  SimBackend backend({4 * kGiB, 4 * kGiB});
  quota::FootprintBook book(2);
  tenants::Quota q;
  q.device_bytes = {16 * kMiB, std::nullopt};
  book.SetLimits(3, q);
  SlabPool pool0(&backend, 0, Options());
  SlabPool pool1(&backend, 1, Options());
  pool0.SetBudget(&book);
  pool1.SetBudget(&book);
  uint64_t used = 0;
  for (int i = 0; i < 64; ++i) {
    CarveResult r = pool0.Carve(kMiB, 256, 3);
    if (r.kind != CarveResult::Kind::kBlock) {
      EXPECT_EQ(r.refusal.reason, RefusalReason::kQuota) << r.refusal.message;
      EXPECT_THAT(r.refusal.message, HasSubstr("device 0"));
      break;
    }
    used += kMiB;
  }
  EXPECT_LE(Footprint(pool0, 3), 16 * kMiB + kGran);
  // The last slab is cut down to the room the quota leaves, so the tenant
  // can still use (about) all of its quota.
  EXPECT_GE(used, 15 * kMiB);
  // Device 1 has no limit.
  EXPECT_EQ(pool1.Carve(64 * kMiB, 256, 3).kind, CarveResult::Kind::kBlock);
}

TEST(SlabFootprintTest, OwnEmptySlabsGoBackToMakeRoomUnderTheBudget) {
  SimBackend backend({4 * kGiB});
  quota::FootprintBook book(1);
  book.SetLimits(4, TotalQuota(8 * kMiB));
  SlabPool pool(&backend, 0, Options(/*slab_size=*/kGiB, /*min_slab=*/kMiB));
  pool.SetBudget(&book);
  std::vector<PoolBlock> small;
  for (int i = 0; i < 6; ++i) {
    CarveResult r = pool.Carve(kMiB, 256, 4);
    ASSERT_EQ(r.kind, CarveResult::Kind::kBlock) << r.refusal.message;
    small.push_back(r.block);
  }
  for (const PoolBlock& b : small) pool.Release(b);  // empty slabs, kept for reuse
  EXPECT_GT(Footprint(pool, 4), 0u);
  // One 7 MiB block fits in no empty slab: they go back to make its room.
  CarveResult big = pool.Carve(7 * kMiB, 256, 4);
  ASSERT_EQ(big.kind, CarveResult::Kind::kBlock) << big.refusal.message;
  EXPECT_LE(Footprint(pool, 4), 8 * kMiB + kGran);
  // A block its empty 8 MiB slab cannot hold: TryCarve (no backend work)
  // says giving that slab back is needed, instead of refusing.
  pool.Release(big.block);
  CarveResult again = pool.TryCarve(8 * kMiB + kGran, 256, 4, backend.handle_kinds().front());
  EXPECT_EQ(again.kind, CarveResult::Kind::kNeedsBackendWork);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabFootprintTest, ReleasedSlabsGiveTheBudgetBackAndRetainedOnesKeepIt) {
  SimBackend backend({4 * kGiB});
  quota::FootprintBook book(1);
  book.SetLimits(5, TotalQuota(64 * kMiB));
  PoolOptions o = Options();
  o.empty_release_after = absl::ZeroDuration();
  SlabPool pool(&backend, 0, o);
  pool.SetBudget(&book);
  CarveResult a = pool.Carve(3 * kMiB, 256, 5);
  ASSERT_EQ(a.kind, CarveResult::Kind::kBlock);
  const uint64_t slab = SlabSize(pool, a.block.slab_id);
  EXPECT_EQ(book.Footprint(5), slab);
  // A session was given the handle: the released slab is retained and still
  // pinned by the tenant.
  absl::StatusOr<SlabPool::Export> ex = pool.ExportSlab(a.block.slab_id, 5, /*session=*/11);
  ASSERT_TRUE(ex.ok()) << ex.status();
  close(ex->fd);
  pool.Release(a.block);
  pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(1));
  EXPECT_EQ(pool.TenantRetained(5), slab);
  EXPECT_EQ(book.Footprint(5), slab);
  EXPECT_EQ(Footprint(pool, 5), slab);
  pool.ForgetSession(11);
  EXPECT_EQ(book.Footprint(5), 0u);
  EXPECT_EQ(Footprint(pool, 5), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabFootprintTest, AdoptedSlabsCountWhateverTheLimit) {
  SimBackend backend({4 * kGiB});
  quota::FootprintBook book(1);
  book.SetLimits(6, TotalQuota(kMiB));
  SlabPool pool(&backend, 0, Options());
  pool.SetBudget(&book);
  absl::StatusOr<std::unique_ptr<Slab>> slab =
      backend.CreateSlab(0, 64 * kMiB, backend.handle_kinds().front());
  ASSERT_TRUE(slab.ok());
  SlabFacts f;
  f.slab_id = 900001;
  f.size = 64 * kMiB;
  f.tenant = 6;
  f.kind = backend.handle_kinds().front();
  ASSERT_TRUE(pool.AdoptSlab(f, *std::move(slab)).ok());
  EXPECT_EQ(book.Footprint(6), 64 * kMiB);
  // Over its quota now: no new slab, but its own slab still serves it.
  EXPECT_EQ(pool.Carve(kMiB, 256, 6).kind, CarveResult::Kind::kBlock);
  CarveResult big = pool.Carve(128 * kMiB, 256, 6);
  EXPECT_EQ(big.kind, CarveResult::Kind::kRefused);
  EXPECT_EQ(big.refusal.reason, RefusalReason::kQuota);
}

TEST(SlabFootprintTest, ConcurrentCarvesOnTwoDevicesNeverPassTheQuota) {
  SimBackend backend({4 * kGiB, 4 * kGiB});
  quota::FootprintBook book(2);
  constexpr uint64_t kQuota = 40 * kMiB;
  book.SetLimits(1, TotalQuota(kQuota));
  SlabPool pool0(&backend, 0, Options(/*slab_size=*/8 * kMiB, /*min_slab=*/kMiB));
  SlabPool pool1(&backend, 1, Options(/*slab_size=*/8 * kMiB, /*min_slab=*/kMiB));
  pool0.SetBudget(&book);
  pool1.SetBudget(&book);
  std::vector<std::thread> threads;
  std::atomic<uint64_t> most{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<std::pair<SlabPool*, PoolBlock>> held;
      for (int i = 0; i < 400; ++i) {
        SlabPool* pool = (rng() & 1) ? &pool0 : &pool1;
        if (!held.empty() && rng() % 3 == 0) {
          const size_t k = rng() % held.size();
          held[k].first->Release(held[k].second);
          held.erase(held.begin() + k);
          continue;
        }
        CarveResult r = pool->Carve(1 + rng() % (3 * kMiB), uint64_t{1} << (rng() % 22), 1);
        if (r.kind == CarveResult::Kind::kBlock) held.emplace_back(pool, r.block);
        uint64_t seen = book.Footprint(1), prev = most.load();
        while (seen > prev && !most.compare_exchange_weak(prev, seen)) {
        }
      }
      for (auto& [pool, b] : held) pool->Release(b);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), kQuota + kGran);
  EXPECT_EQ(book.Footprint(1), Footprint(pool0, 1) + Footprint(pool1, 1));
  EXPECT_TRUE(pool0.Validate().ok()) << pool0.Validate();
  EXPECT_TRUE(pool1.Validate().ok()) << pool1.Validate();
}

TEST(SlabFootprintTest, DeviceFreeBytesIsWhatAnotherTenantCanGet) {
  SimBackend backend({kGiB});
  SlabPool pool(&backend, 0, Options(/*slab_size=*/256 * kMiB, /*min_slab=*/256 * kMiB));
  CarveResult a = pool.Carve(kMiB, 256, 1);
  ASSERT_EQ(a.kind, CarveResult::Kind::kBlock);
  // Tenant 1's slab has 255 MiB free, which only tenant 1 can carve.
  EXPECT_EQ(pool.Stats().free_bytes, kGiB - 256 * kMiB);
  CarveResult b = pool.Carve(kGiB - 256 * kMiB, 256, 2);
  EXPECT_EQ(b.kind, CarveResult::Kind::kBlock) << b.refusal.message;
  EXPECT_EQ(pool.Stats().free_bytes, 0u);
  EXPECT_EQ(pool.Carve(kKiB, 256, 3).kind, CarveResult::Kind::kRefused);
}

}  // namespace
}  // namespace gpumem
