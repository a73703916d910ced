// Randomized property test of gpumem::OffsetAllocator against a reference
// model (std::map of free ranges offset -> size).
//
// Every step checks cheaply: a returned block lies wholly inside one of the
// model's free ranges (so it is inside the slab and overlaps no live block),
// respects its alignment; a refusal happens exactly when no model range can
// hold the request; counters (free/used bytes, live blocks, number of free
// ranges, largest free range) agree with the model. Every kFullCheckEvery
// steps and at the end: Validate() and the allocator's free ranges equal the
// model's, with no two adjacent (full coalescing).
//
// Workloads: random sizes/alignments on tiny, medium and huge slabs; the S
// trace's distribution; and short, small-slab versions of the benchmark's
// ramp traces C (long churn, random lifetimes, load past the slab) and P
// (2^k +- 1 sizes), driven by traces::RunRamp through a checking adaptor.
// Each runs with the search's K (own_bin_probes) at 0, 1, the default and 8.
//
// Op counts: about 1.5 million operations in total (a few seconds at -O2).
// Builds with a sanitizer run a quarter; POOL_TEST_SCALE=<factor> overrides
// (e.g. 4 for a longer soak).
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "common/alloc/offset_allocator.h"
#include "tests/alloc/traces.h"

namespace gpumem {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kDefaultScale = 0.0625;
#else
constexpr double kDefaultScale = 0.25;
#endif

double Scale() {
  const char* s = std::getenv("POOL_TEST_SCALE");
  return s ? std::atof(s) : kDefaultScale;
}

constexpr int kFullCheckEvery = 64;

class Model {
 public:
  explicit Model(uint64_t capacity) : capacity_(capacity), free_bytes_(capacity) {
    if (capacity > 0) Add(0, capacity);
  }

  static bool Fits(uint64_t off, uint64_t len, uint64_t size, uint64_t align) {
    const uint64_t pad = (0 - off) & (align - 1);
    return pad <= len && size <= len - pad;
  }
  bool CanFit(uint64_t size, uint64_t align) const {
    if (largest() < size) return false;
    if (align == 1) return true;
    for (const auto& [off, len] : ranges_) {
      if (len >= size && Fits(off, len, size, align)) return true;
    }
    return false;
  }
  // Removes [off, off+size) from the free ranges; false if it is not wholly
  // inside one free range.
  bool Take(uint64_t off, uint64_t size) {
    auto it = ranges_.upper_bound(off);
    if (it == ranges_.begin()) return false;
    --it;
    const uint64_t r_off = it->first, r_len = it->second;
    if (off - r_off > r_len || size > r_len - (off - r_off)) return false;
    Remove(it);
    if (off > r_off) Add(r_off, off - r_off);
    const uint64_t end = off + size, r_end = r_off + r_len;
    if (r_end > end) Add(end, r_end - end);
    free_bytes_ -= size;
    return true;
  }
  void Give(uint64_t off, uint64_t size) {
    uint64_t start = off, len = size;
    auto next = ranges_.lower_bound(off);
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        start = prev->first;
        len += prev->second;
        Remove(prev);
      }
    }
    next = ranges_.find(off + size);
    if (next != ranges_.end()) {
      len += next->second;
      Remove(next);
    }
    Add(start, len);
    free_bytes_ += size;
  }
  uint64_t largest() const { return sizes_.empty() ? 0 : *sizes_.rbegin(); }
  uint64_t free_bytes() const { return free_bytes_; }
  const std::map<uint64_t, uint64_t>& ranges() const { return ranges_; }

 private:
  void Add(uint64_t off, uint64_t len) {
    ranges_.emplace(off, len);
    sizes_.insert(len);
  }
  void Remove(std::map<uint64_t, uint64_t>::iterator it) {
    sizes_.erase(sizes_.find(it->second));
    ranges_.erase(it);
  }
  uint64_t capacity_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> ranges_;
  std::multiset<uint64_t> sizes_;
};

// Drives an allocator and the model side by side.
class Harness {
 public:
  // `populator`: node pages faulted in ahead by PagePopulator's thread, as
  // in the daemon (SlabPool), or by the calling thread.
  Harness(uint64_t capacity, int probes, bool populator = true)
      : a_(capacity, /*reserve_slots=*/0, populator ? PagePopulator::Shared() : nullptr),
        m_(capacity),
        cap_(capacity) {
    a_.set_own_bin_probes(probes);
  }

  // Returns whether the allocator served the request.
  bool Alloc(uint64_t size, uint64_t align) {
    OffsetAllocator::Block b;
    const bool ok = a_.Allocate(size, align, &b);
    if (ok) {
      EXPECT_EQ(b.size, size);
      EXPECT_EQ(b.offset % align, 0u) << "size " << size << " align " << align;
      EXPECT_LE(b.offset, cap_);
      EXPECT_LE(size, cap_ - b.offset);
      EXPECT_TRUE(m_.Take(b.offset, size))
          << "block [" << b.offset << ", +" << size
          << ") overlaps a live block or leaves the slab";
      live_.push_back(b);
      used_ += size;
    } else {
      EXPECT_FALSE(m_.CanFit(size, align))
          << "refused size " << size << " align " << align
          << " although a free range can hold it";
    }
    ++ops_;
    CheapCheck();
    return ok;
  }
  void FreeAt(size_t idx) {
    const OffsetAllocator::Block b = live_[idx];
    live_[idx] = live_.back();
    live_.pop_back();
    a_.Free(b);
    m_.Give(b.offset, b.size);
    used_ -= b.size;
    ++ops_;
    CheapCheck();
  }
  void CheapCheck() {
    ASSERT_EQ(a_.free_bytes(), m_.free_bytes());
    ASSERT_EQ(a_.used_bytes(), used_);
    ASSERT_EQ(a_.used_bytes() + a_.free_bytes(), cap_);
    ASSERT_EQ(a_.live_blocks(), live_.size());
    ASSERT_EQ(a_.free_ranges(), m_.ranges().size());
    if (ops_ % kFullCheckEvery == 0) FullCheck();
  }
  void FullCheck() {
    ASSERT_EQ(a_.largest_free(), m_.largest());
    const absl::Status st = a_.Validate();
    ASSERT_TRUE(st.ok()) << st;
    const auto got = a_.FreeRangeList();
    const std::vector<std::pair<uint64_t, uint64_t>> want(m_.ranges().begin(),
                                                          m_.ranges().end());
    ASSERT_EQ(got, want);
    for (size_t i = 1; i < got.size(); ++i) {
      ASSERT_LT(got[i - 1].first + got[i - 1].second, got[i].first)
          << "adjacent free ranges (not coalesced)";
    }
  }
  void FreeAll(std::mt19937_64& rng) {
    while (!live_.empty()) {
      FreeAt(std::uniform_int_distribution<size_t>(0, live_.size() - 1)(rng));
    }
    FullCheck();
    ASSERT_EQ(a_.free_ranges(), cap_ ? 1u : 0u);
    ASSERT_EQ(a_.largest_free(), cap_);
  }

  OffsetAllocator& a() { return a_; }
  std::vector<OffsetAllocator::Block>& live() { return live_; }
  uint64_t ops() const { return ops_; }

 private:
  OffsetAllocator a_;
  Model m_;
  uint64_t cap_;
  uint64_t used_ = 0;
  uint64_t ops_ = 0;
  std::vector<OffsetAllocator::Block> live_;
};

uint64_t Log2Floor(uint64_t v) { return 63 - __builtin_clzll(v); }

struct Config {
  uint64_t capacity;
  uint64_t ops;
  uint64_t seed;
};

// The search's K by seed: the default, 0 (good-fit head and the exact
// fallback only), 1, and 8.
int ProbesFor(uint64_t seed) {
  static constexpr int kProbes[4] = {OffsetAllocator::kDefaultOwnBinProbes, 0, 1, 8};
  return kProbes[seed % 4];
}

// Sizes: a mix of tiny sizes, log-uniform sizes, sizes next to bin
// boundaries, and occasionally huge ones; alignments: mostly 1 or small,
// sometimes any power of two up to the slab size.
void RunRandom(const Config& c) {
  std::mt19937_64 rng(c.seed);
  Harness h(c.capacity, ProbesFor(c.seed), /*populator=*/(c.seed / 4) % 2 == 0);
  const uint64_t cap_log = Log2Floor(c.capacity);
  auto log_uniform = [&](uint64_t max_log) {
    const uint64_t e = std::uniform_int_distribution<uint64_t>(0, max_log)(rng);
    const uint64_t lo = uint64_t{1} << e;
    const uint64_t hi = e >= 63 ? ~uint64_t{0} : (lo << 1) - 1;
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  auto size = [&]() -> uint64_t {
    uint64_t s;
    switch (rng() % 8) {
      case 0: s = 1 + rng() % 64; break;
      case 1: {
        const uint64_t lb = OffsetAllocator::BinLowerBound(
            OffsetAllocator::BinIndex(log_uniform(cap_log)));
        s = lb + (rng() % 3) - 1;
        break;
      }
      case 2: s = log_uniform(cap_log); break;
      default: s = log_uniform(cap_log > 6 ? cap_log - 6 : 0); break;
    }
    return std::min(std::max<uint64_t>(s, 1), c.capacity);
  };
  auto align = [&]() -> uint64_t {
    switch (rng() % 8) {
      case 0: case 1: case 2: return 1;
      case 3: return uint64_t{1} << (rng() % std::min<uint64_t>(cap_log + 1, 9));
      case 4: return uint64_t{1} << (rng() % (cap_log + 1));
      default: return uint64_t{1} << (rng() % std::min<uint64_t>(cap_log + 1, 13));
    }
  };
  // Alternate filling and draining phases so the slab sees both full and
  // empty states.
  double p_free = 0.3;
  for (uint64_t i = 0; i < c.ops; ++i) {
    if (i % 3000 == 0) p_free = (p_free < 0.5) ? 0.65 : 0.3;
    if (!h.live().empty() && std::bernoulli_distribution(p_free)(rng)) {
      h.FreeAt(std::uniform_int_distribution<size_t>(0, h.live().size() - 1)(rng));
    } else {
      h.Alloc(size(), align());
    }
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasFailure()) {
      FAIL() << "failed at op " << i << " (capacity " << c.capacity << ", seed "
             << c.seed << ")";
    }
  }
  h.FullCheck();
  h.FreeAll(rng);
}

uint64_t Ops(uint64_t n) { return std::max<uint64_t>(1000, uint64_t(n * Scale())); }

TEST(OffsetAllocatorProperty, TinySlabs) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (uint64_t cap : {1ull, 2ull, 3ull, 7ull, 64ull, 100ull, 4096ull, 5000ull}) {
      RunRandom({cap, Ops(20000), seed * 1000 + cap});
      if (HasFailure()) return;
    }
  }
}

TEST(OffsetAllocatorProperty, MediumSlabs) {
  uint64_t seed = 7;
  for (uint64_t cap : {1ull << 20, (1ull << 24) + 12345, 64ull << 20}) {
    RunRandom({cap, Ops(500000), seed++});
    if (HasFailure()) return;
  }
}

TEST(OffsetAllocatorProperty, HugeSlabs) {
  uint64_t seed = 99;
  for (uint64_t cap : {512ull << 30, 1ull << 50, (1ull << 63) + 3, ~0ull}) {
    RunRandom({cap, Ops(200000), seed++});
    if (HasFailure()) return;
  }
}

// The bench's S-like workload (256 B multiples, 256 B alignment), checked.
TEST(OffsetAllocatorProperty, SlabWorkloadS) {
  std::mt19937_64 rng(5);
  const traces::TraceSpec t = traces::TraceS();
  Harness h(256ull << 20, OffsetAllocator::kDefaultOwnBinProbes);  // small: fills, refuses
  for (uint64_t i = 0; i < Ops(500000); ++i) {
    if (!h.live().empty() && std::bernoulli_distribution(0.4)(rng)) {
      h.FreeAt(std::uniform_int_distribution<size_t>(0, h.live().size() - 1)(rng));
    } else {
      h.Alloc(t.dist(rng), traces::kAlignment);
    }
    if (HasFailure()) FAIL() << "at op " << i;
  }
  h.FreeAll(rng);
}

// Adapts the model-checking Harness to the traces' driver interface
// (Allocate / Free by block / used_bytes), so traces::RunRamp can drive it.
class CheckedAllocator {
 public:
  using Block = OffsetAllocator::Block;
  CheckedAllocator(uint64_t capacity, int probes) : h_(capacity, probes) {}

  bool Allocate(uint64_t size, uint64_t alignment, Block* out) {
    if (!h_.Alloc(size, alignment)) return false;
    *out = h_.live().back();
    index_[out->handle] = h_.live().size() - 1;
    return true;
  }
  void Free(const Block& b) {
    const size_t idx = index_.at(b.handle);
    index_.erase(b.handle);
    const bool moved = idx + 1 != h_.live().size();
    h_.FreeAt(idx);  // moves the last live block into idx
    if (moved) index_[h_.live()[idx].handle] = idx;
  }
  uint64_t used_bytes() const { return h_.a().used_bytes(); }
  Harness& harness() { return h_; }

 private:
  mutable Harness h_;
  std::map<uint32_t, size_t> index_;  // handle -> position in h_.live()
};

// Small-slab versions of the ramp traces: 64 MiB (C) and 16 MiB (P) slabs
// and sizes scaled down so that ~400-1,800 blocks are live at load 1.0, with the offered
// load rising from 0.6 to 1.2 of the slab (so it refuses, and every refusal
// is checked against the model).
void RunCheckedRamp(traces::RampSpec t, uint64_t steps, uint64_t seed) {
  for (int probes : {OffsetAllocator::kDefaultOwnBinProbes, 0, 1, 8}) {
    CheckedAllocator a(t.capacity, probes);
    const traces::RampResult r = traces::RunRamp(a, t, steps, seed);
    EXPECT_GT(r.refusals, 0u) << t.name << ": the ramp should pass the slab";
    a.harness().FullCheck();
    EXPECT_EQ(a.harness().a().live_blocks(), 0u);
    if (::testing::Test::HasFailure()) {
      FAIL() << t.name << " probes " << probes << " seed " << seed;
    }
  }
}

TEST(OffsetAllocatorProperty, RampC) {
  traces::RampSpec t = traces::TraceC();
  t.capacity = 64ull << 20;
  t.dist = {traces::SizeDist::kLogUniform, 256, 256 * traces::kKiB};
  t.min_lifetime = 4;
  t.max_lifetime = 2048;
  RunCheckedRamp(t, std::max<uint64_t>(20000, Ops(80000)), 11);
}

TEST(OffsetAllocatorProperty, RampP) {
  traces::RampSpec t = traces::TraceP();
  t.capacity = 16ull << 20;
  t.dist = {traces::SizeDist::kPow2PlusMinus1, 64, 256 * traces::kKiB};
  t.min_lifetime = 4;
  t.max_lifetime = 2048;
  RunCheckedRamp(t, std::max<uint64_t>(20000, Ops(80000)), 12);
}

}  // namespace
}  // namespace gpumem
