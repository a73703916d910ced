// Fixed-seed workloads shared by allocator_bench and the pool tests. Every
// driver is a template over an allocator type A with
//   bool A::Allocate(uint64_t size, uint64_t alignment, A::Block* out);
//   void A::Free(const A::Block&);
// and a `size` member in A::Block.
#ifndef GPUMEMD_TESTS_ALLOC_TRACES_H_
#define GPUMEMD_TESTS_ALLOC_TRACES_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace gpumem {
namespace traces {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;
constexpr uint64_t kGrain = 256;      // every trace size is a multiple of this
constexpr uint64_t kAlignment = 256;  // every trace request asks for this

// Draws a block size from a trace's distribution: multiples of 256 B
// (kUniform, kLogUniform), or 2^k - 1 and 2^k + 1 with equal probability, k
// uniform in [log2(lo), log2(hi)] (kPow2PlusMinus1; lo, hi powers of two).
struct SizeDist {
  enum Kind { kUniform, kLogUniform, kPow2PlusMinus1 } kind;
  uint64_t lo, hi;  // inclusive bounds, multiples of kGrain

  uint64_t operator()(std::mt19937_64& rng) const {
    if (kind == kPow2PlusMinus1) {
      std::uniform_int_distribution<int> k(63 - __builtin_clzll(lo),
                                           63 - __builtin_clzll(hi));
      const uint64_t p = uint64_t{1} << k(rng);
      return (rng() & 1) ? p + 1 : p - 1;
    }
    if (kind == kUniform) {
      std::uniform_int_distribution<uint64_t> d(lo / kGrain, hi / kGrain);
      return d(rng) * kGrain;
    }
    std::uniform_real_distribution<double> d(std::log(double(lo)),
                                             std::log(double(hi)));
    uint64_t s = static_cast<uint64_t>(std::exp(d(rng))) / kGrain * kGrain;
    return std::min(hi, std::max(lo, s));
  }
};

struct TraceSpec {
  const char* name;
  uint64_t capacity;
  SizeDist dist;
  uint64_t target_live;       // churning blocks kept around this count
  uint64_t ops;               // timed operations at ops_scale 1
  int pinned;                 // blocks allocated first and never freed
  uint64_t pinned_size;
};

// S: small blocks. ~6,000 live, uniform 256 B .. 1 MiB, 4 GiB slab.
inline TraceSpec TraceS() {
  return {"S", 4 * kGiB, {SizeDist::kUniform, 256, 1 * kMiB}, 6000, 10000000,
          0, 0};
}
// L: LLM serving. 8 pinned blocks of 5% of the slab, then ~80 live blocks
// log-uniform 2 .. 64 MiB.
inline TraceSpec TraceL() {
  const uint64_t cap = 4 * kGiB;
  return {"L", cap, {SizeDist::kLogUniform, 2 * kMiB, 64 * kMiB}, 80, 2000000,
          8, cap / 20 / kGrain * kGrain};
}

struct TimedResult {
  std::vector<double> batch_ns_per_pair;  // one entry per 1024-op batch
  double total_seconds = 0;
  uint64_t ops = 0;
  uint64_t failures = 0;
  uint64_t live_at_end = 0;
};

constexpr int kBatch = 1024;

// Steady-state churn: allocate while below 95% of target_live, free while
// above 105%, fair coin in between; a free picks a uniformly random live
// block. Warm-up (pinned blocks, then allocating up to 95% of the target) is
// not timed.
//
// Harness: before each batch of 1024 operations the clock is stopped and the
// batch is generated into a flat op array (size to allocate, or 0 = free, and
// the slot in a fixed block table the block lives in); the live-set
// bookkeeping (random pick, swap-remove) happens there too. The timed loop
// then does nothing but replay the array: one allocator call per op plus a
// slot table access. One clock read at each end of a batch. The trace (random
// draws, alloc/free decisions, which live block is freed) is the same as
// drawing it inline. A refused allocation leaves its slot marked empty
// (size 0): a free of it within the batch is skipped, and after the batch the
// generator drops it from its live set.
template <class A>
TimedResult RunTimed(A& a, const TraceSpec& t, uint64_t ops, uint64_t seed,
                     std::vector<typename A::Block>* live_out = nullptr) {
  using Block = typename A::Block;
  std::mt19937_64 rng(seed);
  std::vector<Block> pinned;
  TimedResult r;
  for (int i = 0; i < t.pinned; ++i) {
    Block b;
    if (!a.Allocate(t.pinned_size, kAlignment, &b)) ++r.failures;
    else pinned.push_back(b);
  }
  const uint64_t low = t.target_live * 95 / 100, high = t.target_live * 105 / 100;
  // Slot table: every live churn block sits in one slot; `live` lists the
  // occupied slots in the same order the inline harness kept its blocks.
  const size_t num_slots = t.target_live * 2 + kBatch + 1;
  std::vector<Block> slots(num_slots);
  std::vector<uint32_t> live, spare;
  live.reserve(num_slots);
  spare.reserve(num_slots);
  for (size_t s = num_slots; s-- > 0;) spare.push_back(static_cast<uint32_t>(s));
  while (live.size() < low) {
    const uint32_t s = spare.back();
    if (!a.Allocate(t.dist(rng), kAlignment, &slots[s])) { ++r.failures; break; }
    spare.pop_back();
    live.push_back(s);
  }
  struct Op {
    uint64_t size;  // 0: free the block in `slot`
    uint32_t slot;
  };
  std::vector<Op> batch_ops(kBatch);
  Op* const op = batch_ops.data();
  Block* const slot = slots.data();
  const uint64_t batches = (ops + kBatch - 1) / kBatch;
  r.batch_ns_per_pair.reserve(batches);
  for (uint64_t batch = 0; batch < batches; ++batch) {
    for (int i = 0; i < kBatch; ++i) {
      const uint64_t size = t.dist(rng);
      const uint64_t rnd = rng();
      const uint64_t n = live.size();
      const bool alloc = n < low || (n <= high && (rnd >> 63));
      if (alloc || n == 0) {
        const uint32_t s = spare.back();
        spare.pop_back();
        live.push_back(s);
        op[i] = Op{size, s};
      } else {
        const uint64_t idx = ((rnd & 0xFFFFFFFFu) * n) >> 32;
        const uint32_t s = live[idx];
        live[idx] = live.back();
        live.pop_back();
        spare.push_back(s);
        op[i] = Op{0, s};
      }
    }
    uint64_t failures = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) {
      Block& b = slot[op[i].slot];
      if (op[i].size != 0) {
        if (!a.Allocate(op[i].size, kAlignment, &b)) {
          b.size = 0;
          ++failures;
        }
      } else if (b.size != 0) {
        a.Free(b);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    r.total_seconds += ns * 1e-9;
    r.batch_ns_per_pair.push_back(ns / kBatch * 2);  // 2 ops per pair
    r.failures += failures;
    if (failures != 0) {
      // Refused blocks never became live: drop them from the live set.
      for (size_t j = 0; j < live.size();) {
        if (slot[live[j]].size == 0) {
          spare.push_back(live[j]);
          live[j] = live.back();
          live.pop_back();
        } else {
          ++j;
        }
      }
    }
  }
  r.ops = batches * kBatch;
  r.live_at_end = live.size() + pinned.size();
  if (live_out) {
    live_out->clear();
    for (uint32_t s : live) live_out->push_back(slot[s]);
    live_out->insert(live_out->end(), pinned.begin(), pinned.end());
  }
  return r;
}

// Growing random workload: pinned blocks first, then each step frees a
// uniformly random live block with probability 0.4 and otherwise allocates a
// block from the trace's distribution, until the first refused allocation.
// Two readings of "requested live bytes / capacity when a request first
// cannot be served" are returned:
//   live:         bytes of the blocks live at that moment / capacity;
//   with_request: the same plus the refused request's size, i.e. the demand
//                 that could not be met.
// They differ by one request (for L up to 64 MiB = 0.016 of the slab). The
// issue's reference figure for a std::map best-fit on L (0.973) is only
// reproduced by the second reading (see allocator_bench).
struct Utilization {
  double live = 0;
  double with_request = 0;
};

template <class A>
Utilization UtilizationAtFirstFailure(A& a, const TraceSpec& t, uint64_t seed) {
  using Block = typename A::Block;
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution free_coin(0.4);
  std::vector<Block> live;
  uint64_t live_bytes = 0;
  auto at_failure = [&](uint64_t refused) {
    Utilization u;
    u.live = double(live_bytes) / t.capacity;
    u.with_request = double(live_bytes + refused) / t.capacity;
    return u;
  };
  for (int i = 0; i < t.pinned; ++i) {
    Block b;
    if (!a.Allocate(t.pinned_size, kAlignment, &b)) return at_failure(t.pinned_size);
    live_bytes += b.size;  // pinned: never put in `live`, never freed
  }
  for (;;) {
    if (!live.empty() && free_coin(rng)) {
      std::uniform_int_distribution<size_t> pick(0, live.size() - 1);
      const size_t idx = pick(rng);
      live_bytes -= live[idx].size;
      a.Free(live[idx]);
      live[idx] = live.back();
      live.pop_back();
    } else {
      Block b;
      const uint64_t size = t.dist(rng);
      if (!a.Allocate(size, kAlignment, &b)) return at_failure(size);
      live_bytes += size;
      live.push_back(b);
    }
  }
}

// F: fragmenting. Fill the slab exactly with blocks of 256 B .. 16 KiB
// (uniform multiples of 256; the last block takes the remainder), free every
// other block (even indices), then climb a staircase: level k = 1, 2, ...
// asks for max(1, holes / 64) blocks of k * 256 B each, until the first
// refusal. (With 64 levels the staircase asks, in expectation, for exactly
// the freed bytes.) `on_request(size, ok)` sees every staircase request.
struct FResult {
  double utilization = 0;   // requested live bytes / capacity at refusal
  double utilization_with_request = 0;  // plus the refused request
  uint64_t fill_blocks = 0;
  uint64_t holes = 0;
  uint64_t staircase_requests = 0;
  uint64_t failing_size = 0;
  uint64_t live_blocks = 0;
  bool fill_failed = false;
};

struct NoHook {
  void operator()(uint64_t, bool) const {}
};

// `grain` and the alignments default to the trace's 256 B; tests also run odd
// grains (sizes that are not bin boundaries) and larger staircase alignments.
template <class A, class Hook = NoHook>
FResult RunFTrace(A& a, uint64_t capacity, uint64_t seed, Hook on_request = Hook(),
                  std::vector<typename A::Block>* live_out = nullptr,
                  uint64_t grain = kGrain, uint64_t fill_alignment = kAlignment,
                  uint64_t alignment = kAlignment) {
  using Block = typename A::Block;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> units(1, 64);
  auto dist = [&](std::mt19937_64& g) { return units(g) * grain; };
  std::vector<Block> blocks;
  FResult r;
  uint64_t remaining = capacity;
  while (remaining > 0) {
    const uint64_t size = std::min(dist(rng), remaining);
    Block b;
    if (!a.Allocate(size, fill_alignment, &b)) { r.fill_failed = true; return r; }
    blocks.push_back(b);
    remaining -= size;
  }
  r.fill_blocks = blocks.size();
  uint64_t live_bytes = capacity;
  std::vector<Block> live;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 == 0) {
      a.Free(blocks[i]);
      live_bytes -= blocks[i].size;
      ++r.holes;
    } else {
      live.push_back(blocks[i]);
    }
  }
  const uint64_t per_level = std::max<uint64_t>(1, r.holes / 64);
  for (uint64_t k = 1;; ++k) {
    const uint64_t size = k * grain;
    for (uint64_t j = 0; j < per_level; ++j) {
      Block b;
      const bool ok = a.Allocate(size, alignment, &b);
      ++r.staircase_requests;
      on_request(size, ok);
      if (!ok) {
        r.utilization = double(live_bytes) / capacity;
        r.utilization_with_request = double(live_bytes + size) / capacity;
        r.failing_size = size;
        r.live_blocks = live.size();
        if (live_out) *live_out = live;
        return r;
      }
      live_bytes += size;
      live.push_back(b);
    }
  }
}

// Long churn with random lifetimes and a rising offered load ("ramp"
// traces C and P). Every step allocates one block (size from `dist`,
// alignment `alignment`) with a lifetime drawn log-uniformly from
// [min_lifetime, max_lifetime] steps and stretched by the step's load factor,
// then frees every block whose lifetime has run out. The load factor is
// chosen so that the offered live bytes (mean size x mean lifetime, Little's
// law) go linearly from load_from to load_to times the capacity over the
// run: past 1.0 the slab cannot hold the offer and requests are refused. A
// refused block is dropped (its scheduled free is skipped). Mixed lifetimes
// pin long-lived blocks between short-lived ones, which is what fragments.
struct RampSpec {
  const char* name;
  uint64_t capacity;
  SizeDist dist;
  uint64_t alignment;
  uint64_t min_lifetime, max_lifetime;  // steps, before the load factor
  double load_from, load_to;
  uint64_t steps;  // allocations per seed at ops_scale 1
  int seeds;
};

// C: long churn. Log-uniform 256 B .. 16 MiB (mean ~1.5 MiB, ~2,800 live
// blocks at load 1.0), 4 GiB slab, 4 seeds x 3M steps (~24M operations).
inline RampSpec TraceC() {
  return {"C", 4 * kGiB, {SizeDist::kLogUniform, 256, 16 * kMiB}, kAlignment,
          16, 65536, 0.6, 1.2, 3000000, 4};
}
// P: sizes 2^k - 1 and 2^k + 1 (k = 8 .. 20), alignment 1, 1 GiB slab (~6,600
// live blocks at load 1.0), 4 seeds x 1M steps. A size just above a power of
// two sits just above a bin boundary, the hardest case for a segregated fit.
inline RampSpec TraceP() {
  return {"P", 1 * kGiB, {SizeDist::kPow2PlusMinus1, 256, 1 * kMiB}, 1,
          16, 65536, 0.6, 1.2, 1000000, 4};
}

struct RampResult {
  std::vector<double> batch_ns_per_pair;  // one entry per batch of ~1024 ops
  double total_seconds = 0;
  uint64_t ops = 0;
  uint64_t refusals = 0;
  bool refused = false;
  double util_at_first_refusal = 1;              // live bytes / capacity
  double util_with_request_at_first_refusal = 1;  // plus the refused request
};

// Same harness as RunTimed: each batch (one step's free ops are never split
// from it, so a batch has 1024 or slightly more ops) is generated first, then
// replayed under the clock. Deterministic for a seed, whatever the allocator
// (refusals only change which scheduled frees are skipped).
template <class A>
RampResult RunRamp(A& a, const RampSpec& t, uint64_t steps, uint64_t seed) {
  using Block = typename A::Block;
  RampResult r;
  // Means of the size and base lifetime distributions, sampled (fixed seed).
  std::mt19937_64 mean_rng(7);
  const double lt_lo = std::log(double(t.min_lifetime));
  const double lt_hi = std::log(double(t.max_lifetime));
  std::uniform_real_distribution<double> log_lifetime(lt_lo, lt_hi);
  double mean_size = 0, mean_lifetime = 0;
  constexpr int kSamples = 200000;
  for (int i = 0; i < kSamples; ++i) {
    mean_size += double(t.dist(mean_rng)) / kSamples;
    mean_lifetime += std::exp(log_lifetime(mean_rng)) / kSamples;
  }
  const double stretch_per_load = double(t.capacity) / (mean_size * mean_lifetime);

  std::mt19937_64 rng(seed);
  struct Death {
    uint64_t step;
    uint32_t slot;
    bool operator>(const Death& o) const { return step > o.step; }
  };
  std::vector<Death> deaths;  // min-heap on step
  std::vector<Block> slots;
  std::vector<uint32_t> spare;
  struct Op {
    uint64_t size;  // 0: free the block in `slot`
    uint32_t slot;
  };
  std::vector<Op> ops;
  uint64_t step = 0;
  while (step < steps) {
    ops.clear();
    while (ops.size() < size_t(kBatch) && step < steps) {
      const double load =
          t.load_from + (t.load_to - t.load_from) * double(step) / double(steps);
      const uint64_t size = t.dist(rng);
      const uint64_t life = 1 + static_cast<uint64_t>(
          std::exp(log_lifetime(rng)) * load * stretch_per_load);
      uint32_t s;
      if (spare.empty()) {
        s = static_cast<uint32_t>(slots.size());
        slots.emplace_back();
      } else {
        s = spare.back();
        spare.pop_back();
      }
      ops.push_back(Op{size, s});
      deaths.push_back(Death{step + life, s});
      std::push_heap(deaths.begin(), deaths.end(), std::greater<Death>());
      ++step;
      while (!deaths.empty() && deaths.front().step <= step) {
        ops.push_back(Op{0, deaths.front().slot});
        spare.push_back(deaths.front().slot);
        std::pop_heap(deaths.begin(), deaths.end(), std::greater<Death>());
        deaths.pop_back();
      }
    }
    Block* const slot = slots.data();
    const Op* const op = ops.data();
    const size_t n = ops.size();
    uint64_t refusals = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      Block& b = slot[op[i].slot];
      if (op[i].size != 0) {
        if (__builtin_expect(!a.Allocate(op[i].size, t.alignment, &b), 0)) {
          if (refusals++ == 0 && !r.refused) {
            r.refused = true;
            r.util_at_first_refusal = double(a.used_bytes()) / t.capacity;
            r.util_with_request_at_first_refusal =
                double(a.used_bytes() + op[i].size) / t.capacity;
          }
          b.size = 0;
        }
      } else if (b.size != 0) {
        a.Free(b);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    r.total_seconds += ns * 1e-9;
    r.batch_ns_per_pair.push_back(ns / double(n) * 2);
    r.ops += n;
    r.refusals += refusals;
  }
  // Free what is still live, so the allocator ends empty.
  for (const Death& d : deaths) {
    if (slots[d.slot].size != 0) a.Free(slots[d.slot]);
  }
  return r;
}

}  // namespace traces
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_ALLOC_TRACES_H_
