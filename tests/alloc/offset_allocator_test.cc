// Edge cases of gpumem::OffsetAllocator, the bounded best-of-K search's
// choices, node storage growth (in place within the reservation, batched
// page population, mremap past it), and the F trace no-refusal test.
#include "common/alloc/offset_allocator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/alloc/traces.h"

namespace gpumem {
namespace {

using Block = OffsetAllocator::Block;
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

void ExpectValid(const OffsetAllocator& a) {
  const absl::Status st = a.Validate();
  EXPECT_TRUE(st.ok()) << st;
}

TEST(OffsetAllocator, FreshSlabIsOneFreeRange) {
  OffsetAllocator a(1000);
  EXPECT_EQ(a.capacity(), 1000u);
  EXPECT_EQ(a.free_bytes(), 1000u);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free(), 1000u);
  EXPECT_EQ(a.live_blocks(), 0u);
  EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, 1000}}));
  ExpectValid(a);
}

TEST(OffsetAllocator, ZeroCapacityRefusesEverything) {
  OffsetAllocator a(0);
  Block b;
  EXPECT_FALSE(a.Allocate(1, 1, &b));
  EXPECT_EQ(a.largest_free(), 0u);
  ExpectValid(a);
}

TEST(OffsetAllocator, InvalidArgumentsAreRefused) {
  OffsetAllocator a(1 << 20);
  Block b;
  EXPECT_FALSE(a.Allocate(0, 1, &b));
  EXPECT_FALSE(a.Allocate(16, 0, &b));
  EXPECT_FALSE(a.Allocate(16, 3, &b));
  EXPECT_FALSE(a.Allocate(16, 48, &b));
  EXPECT_FALSE(a.Allocate((1 << 20) + 1, 1, &b));
  EXPECT_EQ(a.live_blocks(), 0u);
  ExpectValid(a);
}

TEST(OffsetAllocator, SizeOne) {
  OffsetAllocator one(1);
  Block b;
  ASSERT_TRUE(one.Allocate(1, 1, &b));
  EXPECT_EQ(b.offset, 0u);
  EXPECT_EQ(one.free_bytes(), 0u);
  Block c;
  EXPECT_FALSE(one.Allocate(1, 1, &c));
  ExpectValid(one);
  one.Free(b);
  EXPECT_EQ(one.largest_free(), 1u);
  ExpectValid(one);

  // Fill a slab byte by byte, then free in a random order.
  OffsetAllocator a(777);
  std::vector<Block> blocks(777);
  for (uint64_t i = 0; i < 777; ++i) {
    ASSERT_TRUE(a.Allocate(1, 1, &blocks[i]));
    EXPECT_EQ(blocks[i].offset, i);
  }
  EXPECT_FALSE(a.Allocate(1, 1, &c));
  EXPECT_EQ(a.free_ranges(), 0u);
  ExpectValid(a);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937_64(3));
  for (const Block& x : blocks) a.Free(x);
  EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, 777}}));
  ExpectValid(a);
}

TEST(OffsetAllocator, WholeSlab) {
  for (uint64_t cap : {1ull, 4096ull, 4097ull, 64ull << 20, 512ull << 30, 1ull << 50,
                       ~0ull}) {
    OffsetAllocator a(cap);
    Block b, c;
    if (cap != ~0ull) {
      EXPECT_FALSE(a.Allocate(cap + 1, 1, &c));
    }
    ASSERT_TRUE(a.Allocate(cap, uint64_t{1} << (63 - __builtin_clzll(cap)), &b)) << cap;
    EXPECT_EQ(b.offset, 0u);
    EXPECT_EQ(a.free_bytes(), 0u);
    EXPECT_EQ(a.largest_free(), 0u);
    EXPECT_FALSE(a.Allocate(1, 1, &c));
    ExpectValid(a);
    a.Free(b);
    EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, cap}}));
    ExpectValid(a);
  }
}

// A free range of exactly `hole` bytes, between live blocks: requests just
// below, at and above bin boundaries must be served iff they fit.
// Run with the own-bin probe off too, so the exact fallback alone must find
// the hole.
TEST(OffsetAllocator, SizesAroundBinBoundaries) {
  for (int probes : {0, 1, OffsetAllocator::kDefaultOwnBinProbes})
  for (uint32_t bin = 1; bin < OffsetAllocator::BinIndex(~0ull >> 2); ++bin) {
    const uint64_t lb = OffsetAllocator::BinLowerBound(bin);
    ASSERT_EQ(OffsetAllocator::BinIndex(lb), bin);
    ASSERT_EQ(OffsetAllocator::BinIndex(lb - 1), bin - 1);
    for (uint64_t hole : {lb - 1, lb, lb + 1}) {
      if (hole == 0) continue;
      // [guard 1][hole][guard 1]
      OffsetAllocator a(hole + 2);
      a.set_own_bin_probes(probes);
      Block g1, h, g2;
      ASSERT_TRUE(a.Allocate(1, 1, &g1));
      ASSERT_TRUE(a.Allocate(hole, 1, &h));
      ASSERT_TRUE(a.Allocate(1, 1, &g2));
      a.Free(h);
      for (uint64_t ask : {hole - 1, hole, hole + 1}) {
        if (ask == 0) continue;
        Block b;
        const bool ok = a.Allocate(ask, 1, &b);
        EXPECT_EQ(ok, ask <= hole) << "hole " << hole << " ask " << ask;
        if (ok) {
          EXPECT_EQ(b.offset, 1u);
          a.Free(b);
        }
        ExpectValid(a);
      }
      // Aligned variant: the hole starts at offset 1, so alignment 2 needs
      // one byte of padding.
      Block b;
      const bool ok = a.Allocate(hole - 1 == 0 ? 1 : hole - 1, 2, &b);
      EXPECT_EQ(ok, hole >= 2) << "hole " << hole;
      if (ok) {
        EXPECT_EQ(b.offset, 2u);
        ExpectValid(a);
        a.Free(b);
      }
      EXPECT_EQ(a.FreeRangeList(), (Ranges{{1, hole}}));
      ExpectValid(a);
    }
  }
}

TEST(OffsetAllocator, BinMappingIsMonotonic) {
  uint64_t prev = 0;
  for (uint64_t s = 1; s < 100000; ++s) {
    const uint32_t b = OffsetAllocator::BinIndex(s);
    ASSERT_GE(b, prev);
    ASSERT_LE(OffsetAllocator::BinLowerBound(b), s);
    ASSERT_GT(OffsetAllocator::BinLowerBound(b + 1), s);
    prev = b;
  }
  EXPECT_LT(OffsetAllocator::BinIndex(~0ull), 64u << OffsetAllocator::kMantissaBits);
}

TEST(OffsetAllocator, AlignmentEqualToSlabSize) {
  for (int e : {0, 1, 12, 26, 39, 50, 63}) {
    const uint64_t cap = uint64_t{1} << e;
    OffsetAllocator a(cap);
    Block b, c;
    ASSERT_TRUE(a.Allocate(1, cap, &b));
    EXPECT_EQ(b.offset, 0u);
    // The only offset aligned to `cap` is taken.
    EXPECT_FALSE(a.Allocate(1, cap, &c));
    ExpectValid(a);
    a.Free(b);
    ASSERT_TRUE(a.Allocate(cap, cap, &b));
    a.Free(b);
    ExpectValid(a);
  }
  // Slab slightly larger than a power of two: the aligned offset 2^e exists
  // even when offset 0 is taken; it must be found behind the padding.
  for (int e : {4, 20, 40, 62}) {
    const uint64_t p = uint64_t{1} << e;
    OffsetAllocator a(p + 5);
    Block z, b, c;
    ASSERT_TRUE(a.Allocate(1, 1, &z));
    ASSERT_TRUE(a.Allocate(5, p, &b)) << e;
    EXPECT_EQ(b.offset, p);
    EXPECT_FALSE(a.Allocate(1, p, &c));
    EXPECT_FALSE(a.Allocate(6, p, &c));
    EXPECT_EQ(a.FreeRangeList(), (Ranges{{1, p - 1}}));
    ExpectValid(a);
    a.Free(z);
    a.Free(b);
    EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, p + 5}}));
    ExpectValid(a);
  }
  // Alignment 2^63 inside the largest possible slab.
  OffsetAllocator big(~0ull);
  Block z, b;
  ASSERT_TRUE(big.Allocate(3, 1, &z));
  ASSERT_TRUE(big.Allocate(1ull << 62, 1ull << 63, &b));
  EXPECT_EQ(b.offset, 1ull << 63);
  ExpectValid(big);
}

TEST(OffsetAllocator, HugeCapacities) {
  for (uint64_t cap : {512ull << 30, 1ull << 50}) {
    OffsetAllocator a(cap);
    std::vector<Block> live;
    uint64_t sum = 0;
    // GPU-like: 2 MiB aligned blocks of many sizes, plus a few giant ones.
    for (uint64_t s : {1ull, 255ull, 2ull << 20, 3ull << 30, 100ull << 30,
                       (1ull << 38) + 7, 12345678901ull}) {
      Block b;
      if (s > a.free_bytes()) continue;
      ASSERT_TRUE(a.Allocate(s, 2 << 20, &b)) << s;
      EXPECT_EQ(b.offset % (2 << 20), 0u);
      EXPECT_LE(b.offset + b.size, cap);
      live.push_back(b);
      sum += s;
    }
    EXPECT_EQ(a.used_bytes(), sum);
    ExpectValid(a);
    Block rest;
    ASSERT_TRUE(a.Allocate(a.largest_free(), 1, &rest));
    live.push_back(rest);
    ExpectValid(a);
    for (size_t i = 0; i < live.size(); i += 2) a.Free(live[i]);
    for (size_t i = 1; i < live.size(); i += 2) a.Free(live[i]);
    EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, cap}}));
    ExpectValid(a);
  }
}

// Every permutation of freeing 6 blocks (720 orders), in a slab filled
// exactly and in one with gaps; ranges checked against a map model after
// every free.
// The band summary is cleared lazily (see the header): a band whose bins all
// emptied keeps its bit until a search passes it. Searches and largest_free()
// must look past such a band.
TEST(OffsetAllocator, EmptiedBandsAreSkipped) {
  constexpr uint64_t kMiB = 1 << 20;
  OffsetAllocator a(1024 * kMiB);
  Block b4, b1, b64, d, rest;
  ASSERT_TRUE(a.Allocate(4 * kMiB, 1, &b4));
  ASSERT_TRUE(a.Allocate(1 * kMiB, 1, &b1));
  ASSERT_TRUE(a.Allocate(64 * kMiB, 1, &b64));
  ASSERT_TRUE(a.Allocate(1 * kMiB, 1, &d));
  ASSERT_TRUE(a.Allocate(954 * kMiB, 1, &rest));
  EXPECT_EQ(a.free_bytes(), 0u);
  a.Free(b4);
  a.Free(b64);
  EXPECT_EQ(a.largest_free(), 64 * kMiB);
  // Empties the [4, 8) MiB band.
  Block x;
  ASSERT_TRUE(a.Allocate(4 * kMiB, 1, &x));
  EXPECT_EQ(x.offset, 0u);
  ExpectValid(a);
  // Nothing in [2, 4) MiB; the search passes the emptied band and carves the
  // 64 MiB range.
  Block y;
  ASSERT_TRUE(a.Allocate(3 * kMiB, 1, &y));
  EXPECT_EQ(y.offset, 5 * kMiB);
  EXPECT_EQ(a.largest_free(), 61 * kMiB);
  ExpectValid(a);
  // Empties the top band: nothing is free, then only 1 MiB is.
  Block z;
  ASSERT_TRUE(a.Allocate(61 * kMiB, 1, &z));
  EXPECT_EQ(a.largest_free(), 0u);
  EXPECT_FALSE(a.Allocate(1, 1, &x));
  a.Free(d);
  EXPECT_EQ(a.largest_free(), 1 * kMiB);
  Block w;
  EXPECT_FALSE(a.Allocate(1 * kMiB + 1, 1, &w));
  ASSERT_TRUE(a.Allocate(1 * kMiB, 1, &w));
  EXPECT_EQ(w.offset, 69 * kMiB);
  ExpectValid(a);
}

TEST(OffsetAllocator, FreeInEveryOrder) {
  for (bool gaps : {false, true}) {
    std::vector<int> order(6);
    std::iota(order.begin(), order.end(), 0);
    const uint64_t sizes[6] = {1, 100, 4096, 7, 65536, 3};
    do {
      const uint64_t cap = 69803 + (gaps ? 600 : 0);
      OffsetAllocator a(cap);
      std::vector<Block> blocks(6);
      std::vector<Block> spacers;
      for (int i = 0; i < 6; ++i) {
        ASSERT_TRUE(a.Allocate(sizes[i], 1, &blocks[i]));
        if (gaps) {
          Block s;
          ASSERT_TRUE(a.Allocate(100, 1, &s));
          spacers.push_back(s);
        }
      }
      for (size_t i = 0; i < spacers.size(); i += 2) a.Free(spacers[i]);
      std::map<uint64_t, uint64_t> model;
      for (const auto& r : a.FreeRangeList()) model[r.first] = r.second;
      for (int i : order) {
        a.Free(blocks[i]);
        uint64_t off = blocks[i].offset, len = blocks[i].size;
        auto next = model.find(off + len);
        if (next != model.end()) { len += next->second; model.erase(next); }
        auto it = model.lower_bound(off);
        if (it != model.begin() && std::prev(it)->first + std::prev(it)->second == off) {
          --it;
          it->second += len;
        } else {
          model[off] = len;
        }
        ASSERT_EQ(a.FreeRangeList(), Ranges(model.begin(), model.end()));
        ASSERT_TRUE(a.Validate().ok()) << a.Validate();
      }
      for (size_t i = 1; i < spacers.size(); i += 2) a.Free(spacers[i]);
      ASSERT_EQ(a.FreeRangeList(), (Ranges{{0, cap}}));
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

TEST(OffsetAllocator, HandlesAreReusedWithoutGrowth) {
  OffsetAllocator a(1 << 30);
  std::vector<Block> live(1000);
  std::mt19937_64 rng(1);
  for (auto& b : live) ASSERT_TRUE(a.Allocate(1 + rng() % 100000, 64, &b));
  // Warm: one round of churn reaches the peak number of ranges.
  for (int round = 0; round < 3; ++round) {
    for (auto& b : live) {
      a.Free(b);
      ASSERT_TRUE(a.Allocate(1 + rng() % 100000, 64, &b));
    }
  }
  const uint64_t held = a.metadata_bytes();
  for (int round = 0; round < 20; ++round) {
    for (auto& b : live) {
      a.Free(b);
      ASSERT_TRUE(a.Allocate(1 + rng() % 100000, 64, &b));
    }
  }
  EXPECT_EQ(a.metadata_bytes(), held);
  ExpectValid(a);
}

// Lays out `n` holes of `hole` bytes, each between two live spacers, in a
// slab that keeps one big free range at its end, and frees the holes in
// address order (so the bin's head, the last freed, is the highest hole).
// Returns the holes' offsets, lowest first.
std::vector<uint64_t> MakeHoles(OffsetAllocator& a, int n, uint64_t hole) {
  std::vector<Block> holes(n);
  std::vector<uint64_t> offsets;
  Block spacer;
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(a.Allocate(4096, 1, &spacer));
    EXPECT_TRUE(a.Allocate(hole, 1, &holes[i]));
  }
  EXPECT_TRUE(a.Allocate(4096, 1, &spacer));
  for (const Block& h : holes) {
    a.Free(h);
    offsets.push_back(h.offset);
  }
  return offsets;
}

// Step 1: among equal holes of the own bin the lowest address wins (the
// pre-probe search took the most recently freed one).
TEST(OffsetAllocatorSearch, LowestAddressAmongEqualHoles) {
  OffsetAllocator a(64 << 20);
  ASSERT_EQ(a.own_bin_probes(), OffsetAllocator::kDefaultOwnBinProbes);
  const std::vector<uint64_t> holes = MakeHoles(a, 3, 1 << 20);
  Block b;
  ASSERT_TRUE(a.Allocate(1 << 20, 1, &b));
  EXPECT_EQ(b.offset, holes[0]);
  ASSERT_TRUE(a.Allocate(1 << 20, 1, &b));
  EXPECT_EQ(b.offset, holes[1]);
  ExpectValid(a);
}

// Step 1: a hole of exactly 2^20 + 1 bytes sits in the bin that starts at
// 2^20, below the request rounded up to a bin; the search reuses it instead
// of cutting the big free range. With probes off (K = 0) the old search
// takes the first range of a bin >= the rounded-up size: the big range.
TEST(OffsetAllocatorSearch, OwnBinHoleAboveBinStartIsReused) {
  for (int k : {0, 1, 4}) {
    OffsetAllocator a(64 << 20);
    a.set_own_bin_probes(k);
    const uint64_t size = (1 << 20) + 1;
    const std::vector<uint64_t> holes = MakeHoles(a, 1, size);
    Block b;
    ASSERT_TRUE(a.Allocate(size, 1, &b));
    if (k == 0) {
      EXPECT_NE(b.offset, holes[0]) << "K=0 is expected to skip the hole";
    } else {
      EXPECT_EQ(b.offset, holes[0]) << "K=" << k;
    }
    ExpectValid(a);
  }
}

// Step 2: with the own bin empty, the block comes from the first non-empty
// bin above it (within a bin, < 1/64, of the smallest fitting hole), not
// from the big free range at the slab's end; of that bin's first K ranges
// the smallest.
TEST(OffsetAllocatorSearch, GoodFitIsTheSmallestOfTheFirstK) {
  OffsetAllocator a(64 << 20);
  // Holes in bin [2^20 + 2^14, 2^20 + 2^15) and one in a bin far above.
  const uint64_t base = (1 << 20) + (1 << 14);
  const uint64_t sizes[4] = {base + 768, base, 3 << 20, base + 256};
  std::vector<Block> holes(4);
  Block spacer;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a.Allocate(4096, 1, &spacer));
    ASSERT_TRUE(a.Allocate(sizes[i], 1, &holes[i]));
  }
  ASSERT_TRUE(a.Allocate(4096, 1, &spacer));
  for (const Block& h : holes) a.Free(h);
  Block b;
  ASSERT_TRUE(a.Allocate((1 << 20) + 1, 1, &b));  // own bin is empty
  // The bin's list, head first: base + 256, base, base + 768 (K = 3).
  EXPECT_EQ(b.offset, holes[1].offset);
  ExpectValid(a);
}

// Node storage grows by remapping (nothing is copied): blocks allocated
// before many doublings stay valid and can be freed by handle; metadata is
// proportional to the peak number of ranges, not to the mapping.
TEST(OffsetAllocatorStorage, GrowsThroughManyDoublings) {
  OffsetAllocator a(uint64_t{1} << 40);
  std::vector<Block> blocks(120000);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(a.Allocate(1 + i % 1000, 1 + (i % 3) * 63 + (i % 3 == 2), &blocks[i]))
        << i;
  }
  ExpectValid(a);
  const uint64_t ranges = a.live_blocks() + a.free_ranges();
  EXPECT_LE(a.metadata_bytes(), 34 * ranges + 64 * 1024);
  for (size_t i = 0; i < blocks.size(); i += 2) a.Free(blocks[i]);
  ExpectValid(a);
  for (size_t i = 1; i < blocks.size(); i += 2) a.Free(blocks[i]);
  ExpectValid(a);
  EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, uint64_t{1} << 40}}));
}

// Allocates n blocks of 256 B-aligned sizes 256..4351 B (a fill of a 1 GiB
// slab that grows node storage to ~n ranges).
std::vector<Block> FillWith256Aligned(OffsetAllocator* a, size_t n) {
  std::vector<Block> blocks(n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(a->Allocate(256 + i % 4096, 256, &blocks[i])) << i;
  }
  return blocks;
}

// With a PagePopulator (as SlabPool builds it) the allocating thread never
// faults node pages in itself; the populator does, and everything the
// allocator wrote survives: Validate holds, every block frees.
TEST(OffsetAllocatorStorage, PopulatorFaultsNodePagesInAhead) {
  OffsetAllocator a(uint64_t{1} << 30, /*reserve_slots=*/0, PagePopulator::Shared());
  const std::vector<Block> blocks = FillWith256Aligned(&a, 200000);
  ExpectValid(a);
  const OffsetAllocator::ColdPathCounts c = a.cold_path_counts();
  // Faulting-in is counted by the thread that did it: none by this one.
  EXPECT_EQ(c.storage.populate_batches, 0u);
  EXPECT_EQ(c.storage.pages_populated, 0u);
  EXPECT_EQ(c.storage.remaps, 0u);
  EXPECT_GT(c.storage.requests, 0u);
  EXPECT_LT(c.storage.requests, 100u);
  // ... and the populator's thread did: at least half the node pages of
  // the ~200,000 slots (it may still be working on the rest).
  const uint64_t want_pages = 200000 * 32 / 4096 / 2;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (a.cold_path_counts().storage.background_pages < want_pages &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(a.cold_path_counts().storage.background_pages, want_pages)
      << "the populator did not fault node pages in within 60 s";
  for (size_t i = 0; i < blocks.size(); i += 2) a.Free(blocks[i]);
  ExpectValid(a);
  for (size_t i = 1; i < blocks.size(); i += 2) a.Free(blocks[i]);
  ExpectValid(a);
  EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, uint64_t{1} << 30}}));
}

// Within its reservation node storage grows in place (no mremap) and faults
// its pages in ahead, in batches: far fewer batches than pages, so that few
// Allocate calls pay for fresh memory (allocator_bench measures the time).
TEST(OffsetAllocatorStorage, GrowsInPlaceAndPopulatesInBatches) {
  OffsetAllocator a(uint64_t{1} << 30);
  const std::vector<Block> blocks = FillWith256Aligned(&a, 200000);
  ExpectValid(a);
  const OffsetAllocator::ColdPathCounts c = a.cold_path_counts();
  EXPECT_EQ(c.storage.remaps, 0u);
  EXPECT_GT(c.storage.grows, 0u);
  const uint64_t slots = a.live_blocks() + a.free_ranges();
  const uint64_t batch_slots = OffsetAllocator::kPopulateBatchBytes / 32;
  // Batches grow to full size after a few dozen slots' worth of pages; then
  // one per batch_slots new slots.
  EXPECT_LE(c.storage.populate_batches, slots / batch_slots + 16);
  EXPECT_GE(c.storage.pages_populated, slots * 32 / 4096);
  EXPECT_LE(a.metadata_bytes(),
            33 * slots + 2 * OffsetAllocator::kPopulateBatchBytes + 64 * 1024);
  for (const Block& b : blocks) a.Free(b);
  ExpectValid(a);
  EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, uint64_t{1} << 30}}));
}

// Past the reserved address space node storage still grows (mremap moves the
// arrays); handles stay valid and every invariant holds.
TEST(OffsetAllocatorStorage, GrowsPastItsReservation) {
  OffsetAllocator a(uint64_t{1} << 40, /*reserve_slots=*/256);
  std::vector<Block> blocks(50000);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(a.Allocate(1 + i % 1000, 1 + (i % 2) * 63, &blocks[i])) << i;
    if (i % 9973 == 0) ExpectValid(a);
  }
  ExpectValid(a);
  EXPECT_GT(a.cold_path_counts().storage.remaps, 0u);
  for (size_t i = 0; i < blocks.size(); i += 2) a.Free(blocks[i]);
  ExpectValid(a);
  for (size_t i = 1; i < blocks.size(); i += 2) a.Free(blocks[i]);
  ExpectValid(a);
  EXPECT_EQ(a.FreeRangeList(), (Ranges{{0, uint64_t{1} << 40}}));
}

TEST(OffsetAllocatorDeathTest, FreeWithWrongHandleAborts) {
  OffsetAllocator a(4096);
  Block b;
  ASSERT_TRUE(a.Allocate(100, 1, &b));
  Block wrong = b;
  wrong.offset += 1;
  EXPECT_DEATH(a.Free(wrong), "do not match");
  a.Free(b);
  EXPECT_DEATH(a.Free(b), "not live");
}

// Requirement: the allocator never refuses while a fitting hole exists. On
// the F trace every staircase request is compared with an exact scan of the
// free ranges, and the first refusal must be a true one.
// Also run with probes off (K = 0), with K = 1, and with the default K.
// Variants: the trace as specified (256 B grain and alignment); an odd grain
// (257 B, alignment 1) whose sizes mostly are not bin boundaries, so rounding
// up to the next bin would skip fitting holes; and 256 B grain with 4 KiB
// alignment, where holes need padding.
struct FVariant {
  uint64_t grain, fill_alignment, alignment;
};

TEST(OffsetAllocatorFTrace, NoRefusalWhileAFittingHoleExists) {
  for (FVariant v : {FVariant{256, 256, 256}, FVariant{257, 1, 1}, FVariant{256, 256, 4096}})
  for (int probes : {0, 1, OffsetAllocator::kDefaultOwnBinProbes})
  for (uint64_t seed : {1, 2}) {
    const uint64_t cap = 64ull << 20;
    OffsetAllocator a(cap);
    a.set_own_bin_probes(probes);
    uint64_t checked = 0;
    auto hook = [&](uint64_t size, bool ok) {
      ++checked;
      if (ok) return;
      // Exact scan: no free range can hold `size` at 256 B alignment.
      for (const auto& [off, len] : a.FreeRangeList()) {
        const uint64_t pad = (0 - off) & (v.alignment - 1);
        EXPECT_FALSE(pad <= len && size <= len - pad)
            << "refused " << size << " B although [" << off << ", +" << len
            << ") is free";
      }
      EXPECT_LT(a.largest_free(), size);
    };
    const traces::FResult r =
        traces::RunFTrace(a, cap, seed, hook, nullptr, v.grain, v.fill_alignment,
                          v.alignment);
    ASSERT_FALSE(r.fill_failed);
    EXPECT_GT(r.holes, 1000u);
    EXPECT_EQ(checked, r.staircase_requests);
    if (v.alignment <= v.grain) {
      EXPECT_GE(r.utilization, 0.74)
          << "seed " << seed << " probes " << probes << " grain " << v.grain;
    }
    ExpectValid(a);
    // The refused size exceeds every remaining hole.
    EXPECT_LT(a.largest_free(), r.failing_size);
  }
}

// AllocateAt takes exactly the range asked for when it lies in one free
// range, and nothing otherwise; blocks restored that way free and coalesce
// like any other, and the allocator stays valid. Against a model: a random
// set of non-overlapping blocks (some adjacent, some at the slab's ends),
// restored in increasing order and then in a random order, plus ranges that
// overlap them.
TEST(OffsetAllocatorRestore, AllocateAtTakesExactlyTheRangeAsked) {
  std::mt19937_64 rng(20261201);
  for (int round = 0; round < 200; ++round) {
    const uint64_t capacity = 1 + rng() % (1 << 20);
    std::vector<std::pair<uint64_t, uint64_t>> blocks;  // (offset, size)
    uint64_t at = 0;
    while (at < capacity) {
      at += (rng() % 3 == 0) ? 0 : rng() % 4096;  // adjacent a third of the time
      if (at >= capacity) break;
      const uint64_t size = 1 + rng() % std::min<uint64_t>(8192, capacity - at);
      blocks.emplace_back(at, size);
      at += size;
    }
    const bool in_order = round % 2 == 0;
    std::vector<std::pair<uint64_t, uint64_t>> order = blocks;
    if (!in_order) std::shuffle(order.begin(), order.end(), rng);
    OffsetAllocator a(capacity);
    std::vector<OffsetAllocator::Block> taken;
    uint64_t used = 0;
    for (const auto& [offset, size] : order) {
      OffsetAllocator::Block b;
      ASSERT_TRUE(a.AllocateAt(offset, size, &b)) << offset << "+" << size;
      EXPECT_EQ(b.offset, offset);
      EXPECT_EQ(b.size, size);
      taken.push_back(b);
      used += size;
      // The same range, or one overlapping it by a byte, cannot be taken again.
      OffsetAllocator::Block x;
      EXPECT_FALSE(a.AllocateAt(offset, size, &x));
      EXPECT_FALSE(a.AllocateAt(offset + size - 1, 1, &x));
      if (offset > 0) EXPECT_FALSE(a.AllocateAt(offset - 1, 2, &x));
    }
    ASSERT_TRUE(a.Validate().ok()) << a.Validate();
    EXPECT_EQ(a.used_bytes(), used);
    EXPECT_EQ(a.live_blocks(), blocks.size());
    // Outside the slab, or empty: refused.
    OffsetAllocator::Block x;
    EXPECT_FALSE(a.AllocateAt(capacity, 1, &x));
    EXPECT_FALSE(a.AllocateAt(0, 0, &x));
    EXPECT_FALSE(a.AllocateAt(capacity - 1, 2, &x));
    // What is left free is exactly the gaps.
    std::vector<std::pair<uint64_t, uint64_t>> gaps;
    uint64_t end = 0;
    for (const auto& [offset, size] : blocks) {
      if (offset > end) gaps.emplace_back(end, offset - end);
      end = offset + size;
    }
    if (end < capacity) gaps.emplace_back(end, capacity - end);
    EXPECT_EQ(a.FreeRangeList(), gaps);
    // Freed in a random order they coalesce back into one range.
    std::shuffle(taken.begin(), taken.end(), rng);
    for (const OffsetAllocator::Block& b : taken) a.Free(b);
    ASSERT_TRUE(a.Validate().ok()) << a.Validate();
    EXPECT_EQ(a.FreeRangeList(),
              (std::vector<std::pair<uint64_t, uint64_t>>{{0, capacity}}));
  }
}

}  // namespace
}  // namespace gpumem
