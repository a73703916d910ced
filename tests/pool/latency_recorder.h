// LatencyRecorder<A>: an adaptor that times every single Allocate call of the
// allocator it wraps (steady_clock before and after) into histograms, so
// that allocator_bench can print the maximum and the p99.9 of single calls
// (stalls). Around every call (outside the timed interval) it also reads
// the thread's minor page faults and involuntary context switches
// (getrusage), and files the call's time in `all` and, if the call took no
// page fault and was not preempted, in `clean`: the allocator's own
// latency, without the kernel's cost of first touching fresh memory (~15 us
// a fault on the development VMs) and without time the thread spent
// descheduled on a loaded machine. Calls that faulted are counted.
//
// Invariants: each histogram has 1 ns buckets up to kExactNs and counts
// anything slower in one overflow bucket; the maximum is exact either way.
// The histograms are allocated and touched when the recorder is built, so
// recording itself takes no page faults. Each recorded value includes the
// cost of one clock read (allocator_bench prints it as "timer floor").
// Free and used_bytes() pass straight through. Drivers in traces.h take a
// LatencyRecorder<A> wherever they take an A.
#ifndef GPUMEMD_TESTS_POOL_LATENCY_RECORDER_H_
#define GPUMEMD_TESTS_POOL_LATENCY_RECORDER_H_

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
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

template <class A>
class LatencyRecorder {
 public:
  using Block = typename A::Block;

  explicit LatencyRecorder(uint64_t capacity) : a_(capacity) {}

  bool Allocate(uint64_t size, uint64_t alignment, Block* out) {
    uint64_t f0, p0, f1, p1;
    ThreadFaultsAndPreemptions(&f0, &p0);
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = a_.Allocate(size, alignment, out);
    const auto t1 = std::chrono::steady_clock::now();
    ThreadFaultsAndPreemptions(&f1, &p1);
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

 private:
  A a_;
  LatencyHistogram all_, clean_;
  uint64_t faulted_calls_ = 0, faults_ = 0, preempted_calls_ = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_TESTS_POOL_LATENCY_RECORDER_H_
