// Tests of SlabPool (server/pool/slab_pool.h) over the memfd-backed SimBackend:
// tenant isolation and scrubbing, dedicated slabs, idle release and the
// reservation, capacity / fragmentation refusals, statistics, and a
// randomized sequence checked against a model after every step.
#include "server/pool/slab_pool.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"

namespace gpumem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDevice = 256 * kMiB;
constexpr uint64_t kSlab = 16 * kMiB;
constexpr uint64_t kGran = 4096;

PoolOptions Options(absl::Duration release_after = absl::Seconds(10),
                    double reserve = 0.0) {
  PoolOptions o;
  o.slab_size = kSlab;
  o.granularity = kGran;
  o.empty_release_after = release_after;
  o.reserve_fraction = reserve;
  return o;
}

uint64_t RoundUp(uint64_t v, uint64_t g) { return (v + g - 1) / g * g; }

// A shared mapping of a slab, through a fresh fd from ExportSlabFd.
class Mapping {
 public:
  Mapping(const SlabPool& pool, uint64_t slab_id, uint64_t size) : size_(size) {
    absl::StatusOr<int> fd = pool.ExportSlabFd(slab_id);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return;
    struct stat st;
    EXPECT_EQ(fstat(*fd, &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    close(*fd);
    EXPECT_NE(p, MAP_FAILED);
    if (p != MAP_FAILED) base_ = static_cast<unsigned char*>(p);
  }
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, size_);
  }
  unsigned char* data() const { return base_; }
  bool ok() const { return base_ != nullptr; }

 private:
  uint64_t size_;
  unsigned char* base_ = nullptr;
};

bool AllZero(const unsigned char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// A copy of one slab's figures, or nullopt.
std::optional<SlabStats> FindSlab(const std::vector<SlabStats>& slabs, uint64_t id) {
  for (const SlabStats& s : slabs) {
    if (s.slab_id == id) return s;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Tenants

TEST(SlabPoolTest, TenantsNeverShareASlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = pool.Carve(kMiB, kGran, /*tenant=*/1);
  absl::StatusOr<PoolBlock> b = pool.Carve(kMiB, kGran, /*tenant=*/2);
  absl::StatusOr<PoolBlock> a2 = pool.Carve(kMiB, kGran, /*tenant=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_NE(a->slab_id, b->slab_id);
  // Tenant 1's second block shares tenant 1's slab (it has room).
  EXPECT_EQ(a2->slab_id, a->slab_id);
  EXPECT_EQ(*pool.SlabTenant(a->slab_id), 1u);
  EXPECT_EQ(*pool.SlabTenant(b->slab_id), 2u);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ManyTenantsEachBlockInOwnSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint32_t, PoolBlock>> live;
  for (int i = 0; i < 300; ++i) {
    const uint32_t tenant = 1 + rng() % 5;
    const uint64_t size = 1 + rng() % (2 * kMiB);
    absl::StatusOr<PoolBlock> b = pool.Carve(size, 256, tenant);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    } else {
      live.emplace_back(tenant, *b);
    }
    if (!live.empty() && rng() % 3 == 0) {
      size_t k = rng() % live.size();
      pool.Release(live[k].second);
      live.erase(live.begin() + k);
    }
    std::map<uint64_t, std::set<uint32_t>> owners;
    for (const auto& [t, blk] : live) {
      owners[blk.slab_id].insert(t);
      EXPECT_EQ(*pool.SlabTenant(blk.slab_id), t);
    }
    for (const auto& [slab, tenants] : owners) {
      EXPECT_EQ(tenants.size(), 1u) << "slab " << slab << " shared by tenants";
    }
    ASSERT_TRUE(pool.Validate().ok()) << pool.Validate();
  }
}

TEST(SlabPoolTest, EmptySlabIsScrubbedBeforeItChangesTenant) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = pool.Carve(kMiB, kGran, /*tenant=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t slab = a->slab_id;
  ASSERT_EQ(a->slab_size, kSlab);
  {
    Mapping m(pool, slab, kSlab);
    ASSERT_TRUE(m.ok());
    // Tenant 1 writes its block and (through the whole-slab mapping every
    // importer gets) the rest of the slab.
    memset(m.data(), 0xAB, kSlab);
  }
  pool.Release(*a);
  // The only slab is tenant 1's, now empty: tenant 2 gets it, scrubbed.
  absl::StatusOr<PoolBlock> b = pool.Carve(2 * kMiB, kGran, /*tenant=*/2);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->slab_id, slab) << "expected the empty slab to be handed over";
  EXPECT_EQ(*pool.SlabTenant(slab), 2u);
  EXPECT_EQ(pool.Stats().slab_count, 1u);
  Mapping m(pool, slab, kSlab);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(AllZero(m.data() + b->offset, b->size)) << "block not scrubbed";
  EXPECT_TRUE(AllZero(m.data(), kSlab)) << "slab not scrubbed";
}

TEST(SlabPoolTest, ScrubIsSeenByAMappingMadeBeforeTheHandover) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = pool.Carve(4 * kMiB, kGran, 1);
  ASSERT_TRUE(a.ok());
  Mapping old_map(pool, a->slab_id, kSlab);  // tenant 1 keeps its mapping
  ASSERT_TRUE(old_map.ok());
  memset(old_map.data() + a->offset, 0x5C, a->size);
  pool.Release(*a);
  absl::StatusOr<PoolBlock> b = pool.Carve(4 * kMiB, kGran, 2);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->slab_id, a->slab_id);
  EXPECT_TRUE(AllZero(old_map.data(), kSlab));
}

// ---------------------------------------------------------------------------
// Dedicated slabs

TEST(SlabPoolTest, LargeBlockGetsDedicatedSlabOfRoundedSize) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  const uint64_t size = 20 * kMiB + 1;
  absl::StatusOr<PoolBlock> b = pool.Carve(size, 256, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->slab_size, RoundUp(size, kGran));
  EXPECT_EQ(b->offset, 0u);
  EXPECT_EQ(b->size, size);
  EXPECT_EQ(backend.SlabBytes(0), RoundUp(size, kGran));
  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 1u);
  EXPECT_TRUE(slabs[0].dedicated);
  EXPECT_EQ(slabs[0].size, RoundUp(size, kGran));

  // The dedicated slab's slack is never used for another block.
  absl::StatusOr<PoolBlock> small = pool.Carve(100, 1, 1);
  ASSERT_TRUE(small.ok());
  EXPECT_NE(small->slab_id, b->slab_id);

  pool.Release(*b);
  EXPECT_EQ(pool.ExportSlabFd(b->slab_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(backend.SlabBytes(0), kSlab);  // only the small block's slab left
  EXPECT_EQ(pool.Stats().slab_count, 1u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ExactSlabSizeIsNotDedicated) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> b = pool.Carve(kSlab, 256, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->slab_size, kSlab);
  ASSERT_EQ(pool.Slabs().size(), 1u);
  EXPECT_FALSE(pool.Slabs()[0].dedicated);
  pool.Release(*b);
  EXPECT_EQ(pool.Stats().slab_count, 1u);  // standard slab stays, empty
}

// A slab's offset 0 is aligned to any power of two, so a large alignment
// must not make a dedicated slab larger than the rounded size.
TEST(SlabPoolTest, DedicatedSlabIsExactlyRoundedSizeEvenWithLargeAlignment) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> b = pool.Carve(20 * kMiB, 64 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->offset % (64 * kMiB), 0u);
  EXPECT_EQ(b->slab_size, 20 * kMiB);
  EXPECT_EQ(backend.SlabBytes(0), 20 * kMiB);
}

// Same for a standard slab: on an empty device a fresh slab serves any
// alignment at offset 0.
TEST(SlabPoolTest, AlignmentLargerThanSlabServedByAFreshSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> b = pool.Carve(kMiB, 32 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->offset % (32 * kMiB), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// size + alignment - 1 wraps around 2^64; the refusal must leave no slab.
TEST(SlabPoolTest, OverflowingSizePlusAlignmentIsRefusedCleanly) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  const uint64_t align = uint64_t{1} << 63;
  for (uint64_t size : {align + 4096, align + 1, align, UINT64_MAX}) {
    absl::StatusOr<PoolBlock> b = pool.Carve(size, align, 1);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted)
        << size << ": " << b.status();
    EXPECT_THAT(b.status().message(), HasSubstr("capacity"));
    EXPECT_TRUE(pool.Validate().ok()) << "size " << size << ": " << pool.Validate();
    EXPECT_EQ(pool.Stats().slab_count, 0u) << "size " << size;
    EXPECT_EQ(backend.SlabBytes(0), 0u) << "size " << size;
  }
}

// ---------------------------------------------------------------------------
// Idle release and reservation

TEST(SlabPoolTest, ReleaseIdleSlabsHonoursEmptyReleaseAfter) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> full = pool.Carve(kSlab, 1, 1);  // fills slab A
  absl::StatusOr<PoolBlock> other = pool.Carve(kMiB, 1, 1);  // slab B
  ASSERT_TRUE(full.ok() && other.ok());
  ASSERT_NE(full->slab_id, other->slab_id);

  const absl::Time before_release = absl::Now();
  pool.Release(*full);
  // Not empty for `after` yet.
  EXPECT_EQ(pool.ReleaseIdleSlabs(before_release), 0);
  EXPECT_EQ(pool.ReleaseIdleSlabs(before_release + after - absl::Milliseconds(1)), 0);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  // Empty for at least `after`: released; slab B (live block) is kept.
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_EQ(pool.Stats().slab_count, 1u);
  EXPECT_EQ(pool.ExportSlabFd(full->slab_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(pool.ExportSlabFd(other->slab_id).ok());
  EXPECT_EQ(backend.SlabBytes(0), kSlab);
  // Far in the future a slab with a live block is still kept.
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(1000)), 0);

  pool.Release(*other);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after - absl::Seconds(1)), 0);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ReuseResetsTheEmptyClock) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = pool.Carve(kMiB, 1, 1);
  ASSERT_TRUE(a.ok());
  pool.Release(*a);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<PoolBlock> b = pool.Carve(kMiB, 1, 1);  // same slab, in use
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->slab_id, a->slab_id);
  EXPECT_EQ(pool.ReleaseIdleSlabs(t0 + absl::Hours(1)), 0);
  pool.Release(*b);
  const absl::Time t1 = absl::Now();
  EXPECT_EQ(pool.ReleaseIdleSlabs(t1 + after - absl::Milliseconds(100)), 0);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
}

TEST(SlabPoolTest, ReserveTakesTheFractionAndIsNeverReleasedWhenIdle) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Seconds(1), /*reserve=*/0.25));
  ASSERT_TRUE(pool.Reserve().ok());
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);
  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 4u);
  for (const SlabStats& s : slabs) {
    EXPECT_TRUE(s.reserved);
    EXPECT_FALSE(s.dedicated);
    EXPECT_EQ(s.size, kSlab);
    EXPECT_EQ(s.live_blocks, 0u);
  }
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.pooled_bytes, kDevice / 4);
  EXPECT_EQ(st.unpooled_bytes, kDevice - kDevice / 4);
  EXPECT_EQ(st.used_bytes, 0u);

  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(24)), 0);
  EXPECT_EQ(pool.Stats().slab_count, 4u);

  // A block comes from the reservation (no new slab), and after it is freed
  // the slab is still reserved and still kept.
  absl::StatusOr<PoolBlock> b = pool.Carve(kMiB, 256, 7);
  ASSERT_TRUE(b.ok()) << b.status();
  std::optional<SlabStats> s = FindSlab(pool.Slabs(), b->slab_id);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->reserved);
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);
  pool.Release(*b);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(24)), 0);
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ReserveRoundsToWholeSlabsAndCapsAtTheDevice) {
  {
    SimBackend backend({kDevice});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 0.1));
    ASSERT_TRUE(pool.Reserve().ok());
    const uint64_t target = static_cast<uint64_t>(0.1 * kDevice);
    EXPECT_GE(backend.SlabBytes(0), target);
    EXPECT_LT(backend.SlabBytes(0), target + kSlab);
  }
  {
    SimBackend backend({kDevice});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 1.0));
    ASSERT_TRUE(pool.Reserve().ok());
    EXPECT_EQ(backend.SlabBytes(0), kDevice);
    EXPECT_EQ(pool.Stats().slab_count, kDevice / kSlab);
  }
  {
    // Fraction > 1 and an uneven device: the device, in granularity units.
    const uint64_t dev = 40 * kMiB + 3 * kGran + 17;
    SimBackend backend({dev});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 5.0));
    ASSERT_TRUE(pool.Reserve().ok());
    EXPECT_EQ(backend.SlabBytes(0), dev - dev % kGran);
    EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
  }
  {
    SimBackend backend({kDevice});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 0.0));
    ASSERT_TRUE(pool.Reserve().ok());
    EXPECT_EQ(backend.SlabBytes(0), 0u);
  }
}

// ---------------------------------------------------------------------------
// Capacity and refusals

TEST(SlabPoolTest, PooledBytesNeverExceedTheDevice) {
  const uint64_t dev = 100 * kMiB + 8192;
  SimBackend backend({dev});
  SlabPool pool(&backend, 0, Options());
  std::vector<PoolBlock> blocks;
  for (;;) {
    absl::StatusOr<PoolBlock> b = pool.Carve(kMiB, 1, 1);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
      break;
    }
    blocks.push_back(*b);
    ASSERT_LE(backend.SlabBytes(0), dev);
    ASSERT_LE(blocks.size(), 200u);
  }
  EXPECT_EQ(blocks.size(), 100u);
  EXPECT_EQ(backend.SlabBytes(0), dev);  // the last slab is cut to the rest
  EXPECT_EQ(pool.Stats().pooled_bytes, dev);
  EXPECT_EQ(pool.Stats().unpooled_bytes, 0u);
  // 8192 bytes are left in the last slab.
  absl::StatusOr<PoolBlock> tail = pool.Carve(8192, 1, 1);
  ASSERT_TRUE(tail.ok()) << tail.status();
  absl::StatusOr<PoolBlock> none = pool.Carve(1, 1, 1);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("capacity"));
  EXPECT_EQ(pool.free_bytes(), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, RefusalSaysCapacityWhenFreeBytesAreShort) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> big = pool.Carve(kDevice - kMiB, 1, 1);
  ASSERT_TRUE(big.ok()) << big.status();
  absl::StatusOr<PoolBlock> b = pool.Carve(2 * kMiB, 1, 1);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("capacity"));
  EXPECT_THAT(b.status().message(), Not(HasSubstr("fragmentation")));
  // Too big for the device at all.
  absl::StatusOr<PoolBlock> c = pool.Carve(kDevice + 1, 1, 2);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("capacity"));
  absl::StatusOr<PoolBlock> d = pool.Carve(UINT64_MAX, 1, 2);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(d.status().message(), HasSubstr("capacity"));
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, RefusalSaysFragmentationWhenNoRangeHoldsTheBlock) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  // 16 slabs, each holding two 8 MiB blocks; free the second of each.
  std::vector<PoolBlock> keep, drop;
  for (int i = 0; i < 32; ++i) {
    absl::StatusOr<PoolBlock> b = pool.Carve(8 * kMiB, kGran, 1);
    ASSERT_TRUE(b.ok()) << i << ": " << b.status();
    (i % 2 == 0 ? keep : drop).push_back(*b);
  }
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  for (const PoolBlock& b : drop) pool.Release(b);
  std::set<uint64_t> slabs;
  for (const PoolBlock& b : keep) slabs.insert(b.slab_id);
  ASSERT_EQ(slabs.size(), 16u);

  PoolStats st = pool.Stats();
  EXPECT_EQ(st.pooled_free_bytes, 128 * kMiB);
  EXPECT_EQ(st.largest_pooled_free, 8 * kMiB);
  EXPECT_DOUBLE_EQ(st.fragmentation, 1.0 - 8.0 / 128.0);
  EXPECT_EQ(pool.free_bytes(), 128 * kMiB);
  EXPECT_EQ(pool.largest_carvable(), 8 * kMiB);

  for (uint64_t size : {8 * kMiB + 1, 9 * kMiB, 16 * kMiB, 64 * kMiB, 128 * kMiB}) {
    absl::StatusOr<PoolBlock> b = pool.Carve(size, 1, 1);
    ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << size;
    EXPECT_THAT(b.status().message(), HasSubstr("fragmentation")) << size;
  }
  absl::StatusOr<PoolBlock> b = pool.Carve(128 * kMiB + 1, 1, 1);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("capacity"));
  // 8 MiB still fits.
  absl::StatusOr<PoolBlock> fits = pool.Carve(8 * kMiB, 1, 1);
  EXPECT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, AlignmentCanCauseFragmentationRefusal) {
  SimBackend backend({kSlab});  // a device of exactly one slab
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = pool.Carve(kGran, 1, 1);  // [0, 4 KiB)
  ASSERT_TRUE(a.ok());
  // 8 MiB at 8 MiB alignment fits at 8 MiB; a second cannot (only
  // [4 KiB, 8 MiB) is left).
  absl::StatusOr<PoolBlock> b = pool.Carve(8 * kMiB, 8 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->offset, 8 * kMiB);
  absl::StatusOr<PoolBlock> c = pool.Carve(4 * kMiB, 8 * kMiB, 1);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("fragmentation"));
  absl::StatusOr<PoolBlock> d = pool.Carve(4 * kMiB, 4 * kMiB, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->offset, 4 * kMiB);
}

TEST(SlabPoolTest, EmptySlabsAreReleasedToMakeADedicatedSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  std::vector<PoolBlock> blocks;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<PoolBlock> b = pool.Carve(kSlab, 1, 1 + i % 3);
    ASSERT_TRUE(b.ok()) << b.status();
    blocks.push_back(*b);
  }
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  // Keep one, free the rest: 240 MiB sit in empty slabs.
  for (size_t i = 1; i < blocks.size(); ++i) pool.Release(blocks[i]);
  EXPECT_EQ(pool.Stats().slab_count, 16u);
  EXPECT_EQ(pool.largest_carvable(), kDevice - kSlab);

  absl::StatusOr<PoolBlock> big = pool.Carve(kDevice - kSlab, 1, 9);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->slab_size, kDevice - kSlab);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  EXPECT_EQ(backend.SlabBytes(0), kDevice);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
  pool.Release(*big);
  pool.Release(blocks[0]);
  EXPECT_EQ(backend.SlabBytes(0), kSlab);  // the standard slab, empty
}

TEST(SlabPoolTest, EmptyReservedSlabsAreReleasedForADedicatedSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Hours(1), 1.0));
  ASSERT_TRUE(pool.Reserve().ok());
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  absl::StatusOr<PoolBlock> big = pool.Carve(100 * kMiB, 1, 3);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_LE(backend.SlabBytes(0), kDevice);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// ---------------------------------------------------------------------------
// Statistics

TEST(SlabPoolTest, StatsMatchHandComputedFigures) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.total_bytes, kDevice);
  EXPECT_EQ(st.pooled_bytes, 0u);
  EXPECT_EQ(st.unpooled_bytes, kDevice);
  EXPECT_EQ(st.slab_count, 0u);
  EXPECT_EQ(st.fragmentation, 0.0);
  EXPECT_EQ(pool.free_bytes(), kDevice);
  EXPECT_EQ(pool.largest_carvable(), kDevice);

  absl::StatusOr<PoolBlock> a1 = pool.Carve(1 * kMiB, kGran, 1);  // slab 1 [0,1)
  absl::StatusOr<PoolBlock> a3 = pool.Carve(3 * kMiB, kGran, 1);  // slab 1 [1,4)
  absl::StatusOr<PoolBlock> b2 = pool.Carve(2 * kMiB, kGran, 2);  // slab 2 [0,2)
  ASSERT_TRUE(a1.ok() && a3.ok() && b2.ok());
  ASSERT_EQ(a1->slab_id, a3->slab_id);
  EXPECT_EQ(a1->offset, 0u);
  EXPECT_EQ(a3->offset, 1 * kMiB);

  st = pool.Stats();
  EXPECT_EQ(st.pooled_bytes, 32 * kMiB);
  EXPECT_EQ(st.used_bytes, 6 * kMiB);
  EXPECT_EQ(st.pooled_free_bytes, 26 * kMiB);
  EXPECT_EQ(st.largest_pooled_free, 14 * kMiB);
  EXPECT_EQ(st.unpooled_bytes, kDevice - 32 * kMiB);
  EXPECT_EQ(st.live_blocks, 3u);
  EXPECT_EQ(st.slab_count, 2u);
  EXPECT_DOUBLE_EQ(st.fragmentation, 1.0 - 14.0 / 26.0);
  EXPECT_EQ(pool.free_bytes(), kDevice - 6 * kMiB);
  EXPECT_EQ(pool.largest_carvable(), kDevice - 32 * kMiB);

  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 2u);
  std::optional<SlabStats> s1 = FindSlab(slabs, a1->slab_id);
  std::optional<SlabStats> s2 = FindSlab(slabs, b2->slab_id);
  ASSERT_TRUE(s1.has_value() && s2.has_value());
  EXPECT_EQ(s1->tenant, 1u);
  EXPECT_EQ(s1->size, kSlab);
  EXPECT_EQ(s1->used_bytes, 4 * kMiB);
  EXPECT_EQ(s1->free_bytes, 12 * kMiB);
  EXPECT_EQ(s1->largest_free, 12 * kMiB);
  EXPECT_EQ(s1->live_blocks, 2u);
  EXPECT_EQ(s2->tenant, 2u);
  EXPECT_EQ(s2->used_bytes, 2 * kMiB);
  EXPECT_EQ(s2->free_bytes, 14 * kMiB);
  EXPECT_EQ(s2->largest_free, 14 * kMiB);
  EXPECT_EQ(s2->live_blocks, 1u);

  // A hole at the start of slab 1: 13 MiB free, largest still 12 MiB there.
  pool.Release(*a1);
  st = pool.Stats();
  EXPECT_EQ(st.used_bytes, 5 * kMiB);
  EXPECT_EQ(st.pooled_free_bytes, 27 * kMiB);
  EXPECT_EQ(st.largest_pooled_free, 14 * kMiB);
  EXPECT_EQ(st.live_blocks, 2u);
  EXPECT_DOUBLE_EQ(st.fragmentation, 1.0 - 14.0 / 27.0);
  s1 = FindSlab(pool.Slabs(), a3->slab_id);
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(s1->free_bytes, 13 * kMiB);
  EXPECT_EQ(s1->largest_free, 12 * kMiB);

  // used counts the asked size, not alignment padding.
  absl::StatusOr<PoolBlock> odd = pool.Carve(1000, kGran, 2);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(pool.Stats().used_bytes, 5 * kMiB + 1000);
  EXPECT_EQ(pool.Stats().pooled_free_bytes, 27 * kMiB - 1000);

  // Slab 2 becomes empty, slab 1 keeps a3: an empty slab counts towards a
  // new slab in largest_carvable.
  pool.Release(*b2);
  pool.Release(*odd);
  EXPECT_EQ(pool.largest_carvable(), kDevice - 16 * kMiB);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  EXPECT_EQ(pool.Stats().used_bytes, 3 * kMiB);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// ---------------------------------------------------------------------------
// Arguments and alignment

TEST(SlabPoolTest, InvalidArguments) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  EXPECT_EQ(pool.Carve(0, 256, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (uint64_t align : {uint64_t{0}, uint64_t{3}, uint64_t{6}, uint64_t{4097},
                         uint64_t{3} << 20, UINT64_MAX}) {
    EXPECT_EQ(pool.Carve(kMiB, align, 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << align;
  }
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_EQ(pool.ExportSlabFd(123456789).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.SlabTenant(123456789).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SlabPoolTest, AlignmentIsHonoured) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  std::vector<PoolBlock> blocks;
  for (int shift = 0; shift <= 22; ++shift) {
    const uint64_t align = uint64_t{1} << shift;
    for (uint64_t size : {uint64_t{1}, uint64_t{1000}, uint64_t{4097}}) {
      absl::StatusOr<PoolBlock> b = pool.Carve(size, align, 1);
      ASSERT_TRUE(b.ok()) << align << " " << b.status();
      EXPECT_EQ(b->offset % align, 0u) << "alignment " << align;
      EXPECT_LE(b->offset + b->size, b->slab_size);
      blocks.push_back(*b);
    }
  }
  // A dedicated block is at offset 0, aligned to anything.
  absl::StatusOr<PoolBlock> d = pool.Carve(17 * kMiB, 1 * kMiB, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->offset % kMiB, 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// ---------------------------------------------------------------------------
// Randomized sequence against a model

TEST(SlabPoolTest, RandomizedSequenceKeepsInvariants) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Seconds(5)));
  std::mt19937_64 rng(0x5eed);
  struct Live {
    uint32_t tenant;
    uint64_t alignment;
    PoolBlock block;
  };
  std::vector<Live> live;
  std::map<uint32_t, uint64_t> used_by_tenant;
  uint64_t used = 0;
  int refusals = 0, carves = 0;
  auto pick_size = [&]() -> uint64_t {
    switch (rng() % 10) {
      case 0: return 1 + rng() % 64;
      case 1: case 2: case 3: return 1 + rng() % (64 * kKiB);
      case 4: case 5: case 6: return 1 + rng() % (2 * kMiB);
      case 7: case 8: return 1 + rng() % kSlab;
      default: return kSlab + 1 + rng() % (40 * kMiB);  // dedicated
    }
  };
  for (int step = 0; step < 4000; ++step) {
    const int op = rng() % 100;
    if (op < 55) {
      const uint32_t tenant = 1 + rng() % 4;
      const uint64_t size = pick_size();
      const uint64_t align = uint64_t{1} << (rng() % 21);
      // Oracle: with alignment <= granularity, a block is always served when
      // unpooled capacity plus empty slabs can hold a new slab for it.
      uint64_t fresh = kDevice - backend.SlabBytes(0);
      for (const SlabStats& s : pool.Slabs()) {
        if (s.live_blocks == 0) fresh += s.size;
      }
      const bool must_fit = align <= kGran && fresh >= RoundUp(size, kGran);
      const uint64_t free_before = pool.free_bytes();
      absl::StatusOr<PoolBlock> b = pool.Carve(size, align, tenant);
      if (b.ok()) {
        ++carves;
        EXPECT_EQ(b->size, size);
        EXPECT_EQ(b->offset % align, 0u);
        EXPECT_LE(b->offset + b->size, b->slab_size);
        EXPECT_EQ(*pool.SlabTenant(b->slab_id), tenant);
        if (size > kSlab) {
          EXPECT_EQ(b->offset, 0u);
          EXPECT_GE(b->slab_size, RoundUp(size, kGran));
        }
        live.push_back({tenant, align, *b});
        used_by_tenant[tenant] += size;
        used += size;
      } else {
        ++refusals;
        ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted)
            << b.status();
        EXPECT_FALSE(must_fit) << "step " << step << ": refused " << size
                               << " with " << fresh << " fresh bytes: "
                               << b.status();
        const bool says_capacity =
            absl::StrContains(b.status().message(), "capacity");
        const bool says_frag =
            absl::StrContains(b.status().message(), "fragmentation");
        EXPECT_NE(says_capacity, says_frag) << b.status();
        // Releasing empty slabs moves bytes from pooled-free to unpooled, so
        // free_bytes() is the same before and after the refusal.
        EXPECT_EQ(says_capacity, free_before < size) << b.status();
      }
    } else if (op < 95) {
      if (live.empty()) continue;
      const size_t k = rng() % live.size();
      pool.Release(live[k].block);
      used_by_tenant[live[k].tenant] -= live[k].block.size;
      used -= live[k].block.size;
      live[k] = live.back();
      live.pop_back();
    } else {
      pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(rng() % 10));
    }

    absl::Status v = pool.Validate();
    ASSERT_TRUE(v.ok()) << "step " << step << ": " << v;
    PoolStats st = pool.Stats();
    ASSERT_EQ(st.used_bytes, used) << "step " << step;
    ASSERT_EQ(st.live_blocks, live.size()) << "step " << step;
    ASSERT_LE(st.pooled_bytes, kDevice);
    ASSERT_EQ(st.pooled_bytes, backend.SlabBytes(0));
    ASSERT_EQ(st.pooled_bytes + st.unpooled_bytes, kDevice);
    // Per-tenant usage from the slabs equals the model; each slab with live
    // blocks belongs to the tenant of those blocks.
    std::map<uint32_t, uint64_t> by_tenant;
    std::map<uint64_t, uint32_t> slab_tenant;
    for (const SlabStats& s : pool.Slabs()) {
      by_tenant[s.tenant] += s.used_bytes;
      slab_tenant[s.slab_id] = s.tenant;
      ASSERT_EQ(s.used_bytes == 0, s.live_blocks == 0);
      ASSERT_LE(s.free_bytes + s.used_bytes, s.size);
      ASSERT_LE(s.largest_free, s.free_bytes);
    }
    for (const Live& l : live) {
      ASSERT_EQ(slab_tenant.at(l.block.slab_id), l.tenant) << "step " << step;
    }
    for (uint32_t t = 0; t <= 4; ++t) {
      ASSERT_EQ(by_tenant[t], used_by_tenant[t]) << "tenant " << t << " step " << step;
    }
    if (step % 250 == 0) {
      // No two live blocks overlap.
      std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
      for (const Live& l : live) {
        ranges[l.block.slab_id].push_back({l.block.offset, l.block.size});
      }
      for (auto& [slab, r] : ranges) {
        std::sort(r.begin(), r.end());
        for (size_t i = 1; i < r.size(); ++i) {
          ASSERT_LE(r[i - 1].first + r[i - 1].second, r[i].first);
        }
      }
    }
  }
  EXPECT_GT(carves, 1000);
  EXPECT_GT(refusals, 0);  // the sequence does reach the device's limits
  for (const Live& l : live) pool.Release(l.block);
  EXPECT_EQ(pool.Stats().used_bytes, 0u);
  EXPECT_EQ(pool.Stats().live_blocks, 0u);
  const int slab_count = static_cast<int>(pool.Stats().slab_count);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(5)), slab_count);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, DestroyingThePoolReturnsEverySlab) {
  SimBackend backend({kDevice, kDevice});
  {
    SlabPool pool(&backend, 1, Options());
    ASSERT_TRUE(pool.Carve(kMiB, 1, 1).ok());
    ASSERT_TRUE(pool.Carve(30 * kMiB, 1, 2).ok());
    EXPECT_EQ(backend.SlabBytes(1), kSlab + 30 * kMiB);
    EXPECT_EQ(backend.SlabBytes(0), 0u);
    EXPECT_EQ(pool.device(), 1u);
  }
  EXPECT_EQ(backend.SlabBytes(1), 0u);
}

}  // namespace
}  // namespace gpumem
