// LatencyRecorder<A>: an adaptor that times every single Allocate call of the
// allocator it wraps (steady_clock before and after) into histograms, so
// that allocator_bench can print the maximum and the p99.9 of single calls
// (stalls). Around every call (outside the timed interval) it also reads
// the thread's minor page faults and involuntary context switches
// (getrusage) and, where the allocator has them, its cold-path counters
// (OffsetAllocator::cold_path_counts()), and
//   * files the call's time in `all` and, if the call took no page fault and
//     was not preempted, in `clean`: the allocator's own latency, without
//     the kernel's cost of first touching fresh memory and without time the
//     thread spent descheduled on a loaded machine;
//   * blames every call slower than 2 us and 10 us on one cause, the first
//     that applies: kPreempted (an involuntary context switch: the wait
//     dwarfs whatever else the call did), kGrowth (the allocator extended
//     or populated its node storage in the call, or posted that work to its
//     PagePopulator, the page faults of that included), kFault (a page fault anyway), kExact (the allocator ran its
//     exact fallback search), kUnexplained (none of these: an interrupt,
//     the hypervisor, a cache or TLB storm; compare allocator_bench's
//     "environment" line, stalls of an empty interval);
//   * keeps the call numbers and causes of the calls over 10 us that were
//     not preempted, so that a second recorder can replay the same trace
//     against a fresh allocator and time those calls again (Recheck): a
//     call slow for the allocator's own work is slow again; one that hit a
//     stall of the machine is not.
//
// Invariants: each histogram has 1 ns buckets up to kExactNs and counts
// anything slower in one overflow bucket; the maximum is exact either way.
// The histograms are allocated and touched when the recorder is built, so
// recording itself takes no page faults. Each recorded value includes the
// cost of one clock read (allocator_bench prints it as "timer floor").
// Free and used_bytes() pass straight through. Drivers in traces.h take a
// LatencyRecorder<A> wherever they take an A.
#ifndef GPUMEMD_TESTS_ALLOC_LATENCY_RECORDER_H_
#define GPUMEMD_TESTS_ALLOC_LATENCY_RECORDER_H_

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpumem {

// Minor page faults of this process so far (getrusage).
inline uint64_t MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_minflt);
}

// Minor page faults and involuntary context switches of this thread so far.
inline void ThreadFaultsAndPreemptions(uint64_t* faults, uint64_t* preempted) {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  *faults = static_cast<uint64_t>(u.ru_minflt);
  *preempted = static_cast<uint64_t>(u.ru_nivcsw);
}

// What an allocator's cold paths have done so far: node storage growth and
// exact fallback searches. Zero for an allocator without cold_path_counts().
struct ColdPathSnapshot {
  uint64_t growth = 0;
  uint64_t exact = 0;
};
template <class A, class = void>
struct HasColdPathCounts : std::false_type {};
template <class A>
struct HasColdPathCounts<
    A, std::void_t<decltype(std::declval<const A&>().cold_path_counts())>>
    : std::true_type {};
template <class A>
ColdPathSnapshot ColdPathsOf(const A& a) {
  ColdPathSnapshot s;
  if constexpr (HasColdPathCounts<A>::value) {
    const auto& c = a.cold_path_counts();
    s.growth = c.storage.grows + c.storage.populate_batches + c.storage.requests;
    s.exact = c.exact_searches;
  }
  return s;
}

class LatencyHistogram {
 public:
  static constexpr uint64_t kExactNs = 1 << 17;  // 131 us

  LatencyHistogram() : counts_(kExactNs + 1, 0) {}

  void Add(uint64_t ns) {
    ++counts_[std::min(ns, kExactNs)];
    max_ = std::max(max_, ns);
    ++n_;
  }
  uint64_t count() const { return n_; }
  uint64_t max() const { return max_; }
  // Smallest recorded value v such that at least q of the calls took <= v ns
  // (kExactNs means "at least that").
  uint64_t Quantile(double q) const {
    if (n_ == 0) return 0;
    const uint64_t want = static_cast<uint64_t>(q * double(n_) + 0.5);
    uint64_t seen = 0;
    for (uint64_t v = 0; v <= kExactNs; ++v) {
      seen += counts_[v];
      if (seen >= want && seen > 0) return v;
    }
    return kExactNs;
  }
  // Calls that took longer than `ns` (ns < kExactNs).
  uint64_t CountAbove(uint64_t ns) const {
    uint64_t above = 0;
    for (uint64_t v = ns + 1; v <= kExactNs; ++v) above += counts_[v];
    return above;
  }

 private:
  std::vector<uint64_t> counts_;
  uint64_t max_ = 0;
  uint64_t n_ = 0;
};

// Why a slow call was slow (see the header comment); the first that applies.
enum SlowCause { kPreempted, kGrowth, kFault, kExact, kUnexplained, kNumCauses };
inline const char* SlowCauseName(int c) {
  static const char* const kNames[] = {"preempted", "growth", "fault", "exact",
                                       "unexplained"};
  return kNames[c];
}

// Slow calls by cause, over one threshold.
struct SlowCalls {
  uint64_t threshold_ns = 0;
  uint64_t by_cause[kNumCauses] = {};
  uint64_t max_ns[kNumCauses] = {};
  uint64_t total() const {
    uint64_t t = 0;
    for (uint64_t n : by_cause) t += n;
    return t;
  }
};

template <class A>
class LatencyRecorder {
 public:
  using Block = typename A::Block;

  explicit LatencyRecorder(uint64_t capacity) : a_(capacity) {
    slow_[0].threshold_ns = 2000;
    slow_[1].threshold_ns = 10000;
  }

  // A call over 10 us that was not preempted: its number (0-based, in call
  // order), what it was blamed on, and its time.
  struct SlowCall {
    uint64_t call;
    SlowCause cause;
    uint64_t ns;
  };
  // Times again, in this recorder's run, the calls `calls` (in call order),
  // e.g. another recorder's slow_calls() on the same trace.
  void Recheck(std::vector<SlowCall> calls) {
    recheck_ = std::move(calls);
    recheck_ns_.clear();
  }

  bool Allocate(uint64_t size, uint64_t alignment, Block* out) {
    const uint64_t call = calls_++;
    uint64_t f0, p0, f1, p1;
    const ColdPathSnapshot c0 = ColdPathsOf(a_);
    ThreadFaultsAndPreemptions(&f0, &p0);
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = a_.Allocate(size, alignment, out);
    const auto t1 = std::chrono::steady_clock::now();
    ThreadFaultsAndPreemptions(&f1, &p1);
    const ColdPathSnapshot c1 = ColdPathsOf(a_);
    const uint64_t ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    all_.Add(ns);
    if (f1 != f0) {
      ++faulted_calls_;
      faults_ += f1 - f0;
    } else if (p1 != p0) {
      ++preempted_calls_;
    } else {
      clean_.Add(ns);
    }
    if (ns > slow_[0].threshold_ns) {
      const SlowCause cause = p1 != p0               ? kPreempted
                              : c1.growth != c0.growth ? kGrowth
                              : f1 != f0             ? kFault
                              : c1.exact != c0.exact ? kExact
                                                     : kUnexplained;
      for (SlowCalls& s : slow_) {
        if (ns > s.threshold_ns) {
          ++s.by_cause[cause];
          s.max_ns[cause] = std::max(s.max_ns[cause], ns);
        }
      }
      if (cause != kPreempted && ns > slow_[1].threshold_ns) {
        slow_calls_.push_back(SlowCall{call, cause, ns});
      }
    }
    if (recheck_ns_.size() < recheck_.size() &&
        recheck_[recheck_ns_.size()].call == call) {
      recheck_ns_.push_back(ns);
    }
    return ok;
  }
  void Free(const Block& b) { a_.Free(b); }
  uint64_t used_bytes() const { return a_.used_bytes(); }
  uint64_t capacity() const { return a_.capacity(); }

  A& inner() { return a_; }
  const LatencyHistogram& all() const { return all_; }
  const LatencyHistogram& clean() const { return clean_; }
  uint64_t faulted_calls() const { return faulted_calls_; }
  uint64_t faults() const { return faults_; }  // taken inside Allocate
  uint64_t preempted_calls() const { return preempted_calls_; }
  // Calls over 2 us ([0]) and over 10 us ([1]), by cause.
  const SlowCalls& slow(int i) const { return slow_[i]; }
  // The calls over 10 us that were not preempted.
  const std::vector<SlowCall>& slow_calls() const { return slow_calls_; }
  // The calls Recheck asked for, and their times in this run, in order (as
  // many as were made).
  const std::vector<SlowCall>& rechecked() const { return recheck_; }
  const std::vector<uint64_t>& recheck_ns() const { return recheck_ns_; }

 private:
  A a_;
  LatencyHistogram all_, clean_;
  uint64_t faulted_calls_ = 0, faults_ = 0, preempted_calls_ = 0;
  SlowCalls slow_[2];
  uint64_t calls_ = 0;
  std::vector<SlowCall> slow_calls_, recheck_;
  std::vector<uint64_t> recheck_ns_;
};

}  // namespace gpumem

#endif  // GPUMEMD_TESTS_ALLOC_LATENCY_RECORDER_H_
