// LatencyRecorder<A>: an adaptor that times every single Allocate call of the
// allocator it wraps (steady_clock before and after) into a histogram, so
// that allocator_bench can print the maximum and the p99.9 of single calls
// (stalls), and counts the minor page faults taken while it records.
//
// Invariants: the histogram has 1 ns buckets up to kExactNs and counts
// anything slower in one overflow bucket; the maximum is exact either way.
// The histogram is allocated and touched when the recorder is built, so
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
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = a_.Allocate(size, alignment, out);
    const auto t1 = std::chrono::steady_clock::now();
    hist_.Add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    return ok;
  }
  void Free(const Block& b) { a_.Free(b); }
  uint64_t used_bytes() const { return a_.used_bytes(); }
  uint64_t capacity() const { return a_.capacity(); }

  A& inner() { return a_; }
  const LatencyHistogram& histogram() const { return hist_; }

 private:
  A a_;
  LatencyHistogram hist_;
};

}  // namespace gpumem

#endif  // GPUMEMD_TESTS_POOL_LATENCY_RECORDER_H_
