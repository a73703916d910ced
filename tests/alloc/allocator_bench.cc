// allocator_bench: replays the fixed-seed traces of tests/alloc/traces.h
// against gpumem::OffsetAllocator and, in the same run, against the std::map
// best-fit baseline (the bar for placement quality), and prints per trace:
//   * ns per allocate+free pair, median and p99 over batches of 1024 ops
//     (batch time / 512), and ops/s over the timed run. Each batch is
//     generated into a flat op array before its clock starts, so the timed
//     loop does only allocator calls (traces::RunTimed, traces::RunRamp);
//     both allocators run the same harness on the same trace;
//   * refusals over the whole timed run, and utilisation at first failure in
//     two readings: "util@fail" = bytes of the live blocks / capacity when a
//     request is first refused; "util+req" = the same plus the refused
//     request (the demand that could not be met). S, L: the growing random
//     workload, mean and min over --util_seeds seeds. F: the staircase. C, P
//     (the ramp traces: random lifetimes, offered load rising from 0.6 to 1.2
//     times the slab): the first refusal of each seed's timed run, mean and
//     min over the trace's seeds; refusals are summed over the seeds.
//   * single Allocate calls: p99.9 and maximum in ns, from a second run of
//     the same trace (first seed) with a clock read around every Allocate
//     (LatencyRecorder; the values include one clock read, printed as the
//     "timer floor"), over all calls ("all") and over the calls that took
//     no page fault and were not preempted ("a"), with the counts of calls
//     that faulted / were preempted (getrusage of the thread around each
//     call). Every call over 2 us and over 10 us is blamed on one cause, the
//     first that applies: preemption, node storage growth (OffsetAllocator's
//     cold-path counters moved: in the calling thread, storage made larger,
//     pages populated or work posted to the PagePopulator, page faults of
//     that included), another page fault, the exact
//     fallback search, or none of these ("unexplained"); the column
//     ">10us p/g/f/x/u" counts them, and the lines under the table give the
//     slowest of each. A third run of the same trace times the calls over
//     10 us again (the traces and the allocator are deterministic, so it is
//     the same call on the same state, except that the background
//     populator's progress may differ): the lines under the table count how
//     many were slow again. No maximum is made from the faster of two
//     timings (with a background populator they need not be the same call
//     on the same state): "all max" is the maximum over every call. The
//     "environment" line gives the stalls of an empty clock interval (no
//     fault, no preemption) over 2 million tries, the machine's own share.
//     How page faults are measured around: with --prefault (the default)
//     the process first grows malloc's heap by --prefault_mib, touches it
//     and keeps it (no trimming, no mmap for blocks below 32 MiB), so the
//     baseline's heap growth takes no page fault; OffsetAllocator's node
//     storage is its own mapping, faulted in ahead by the PagePopulator's
//     thread as in the daemon (--background_populate, the default; with
//     --nobackground_populate by the calling thread, 32 KiB at a time), and
//     the calls that pay for any of it themselves are blamed on growth or
//     faults, which the "all" columns include; --noprefault shows the
//     baseline cold too;
//   * host metadata bytes per live block: "held" = everything the allocator
//     holds (resident node storage incl. the batch populated ahead, neighbour
//     flags, bin tables, the object) / live blocks; "in use" = bytes of nodes
//     describing a live block or a free range / live blocks;
//   * a "harness floor" row (S, L): the same timed harness driving an
//     allocator that does nothing (a bump counter), i.e. what the harness
//     itself costs per pair; the allocators' rows include this cost. All
//     three are compiled into the loop (none is called out of line).
// Usage: allocator_bench [--json] [--ops_scale=1] [--util_seeds=10]
//                        [--traces=S,L,F,C,P] [--noprefault]
//                        [--nobackground_populate]
//
// TUNING HISTORY of OffsetAllocator (figures from this benchmark; the
// allocator's header describes only what it does now):
//   * Hot path inline (offset_allocator_inl.h): S 40.2 -> 38.7 ns per pair,
//     L 34.5 -> 32.6 (no call, no register save/restore per operation).
//   * Band summary bits cleared lazily (by the search that finds a band
//     empty) and stale bin-head back links: every Allocate and Free used to
//     rewrite the summary with a value depending on a node just loaded, and
//     the next call's search waited for it; S 43.8 -> 43.0, L 38.0 -> 36.5
//     (median of 7 interleaved runs). Lazy per-band bitmaps were measured
//     too and were much slower (S +9 ns, L +15 ns): bins empty often, and a
//     search landing on an empty bin pays a misprediction.
//   * Neighbour flags (one byte per node slot, read by handle in Free)
//     instead of a bitmap of free slots read after the node: S 43.0 -> 41.8,
//     L 36.5 -> 35.9.
//   * 6 mantissa bits (64 bins per power of two, one bitmap word per band):
//     with 5, a one-range own-bin probe was worth its cost; with 6 the good
//     fit alone matched it on S and beat it on L, ~1 ns per pair faster.
//   * Branch-free bin-list updates (cmov via AddrUnlessNone, scratch targets
//     for absent neighbours): "did the bin empty?" is a coin flip on random
//     workloads and mispredicted more than computing both outcomes cost.
//     "Is this range its bin's head?" and Free's "is the neighbour free?"
//     stay branches: as selects they measured slower.
//   * Counters updated together are kept apart in the object: adjacent ones
//     invited GCC's SLP vectoriser into a slower SSE sequence.
//   Issue 15 (long churn, stalls). Figures at --ops_scale=0.3 (0.5 where
//   said) on the 2-vCPU development VM while it was loaded (load average
//   8-20); ratios and refusal counts are from one run each:
//   * Node storage. Before: one std::vector grown by 1/8 and copied (78
//     copies to reach 520,000 blocks; single Allocate calls up to 85 ms).
//     Tried: fixed chunks of 512 slots behind a chunk table (one more
//     dependent load per node access): S 38.2 -> 46.5 ns per pair, L 32.1
//     -> 37.8, P 42 -> 53 with the old search. Chosen: two arrays in
//     mremap-grown mappings (MappedBuffer; doubling moves page tables, not
//     bytes, and touches no new page): S 39.6, L 33.2, the vector's speed.
//   * Search, step 1 (best of the own bin's first K ranges; refusals on C /
//     P, best fit 29,587 / 5,708): K=0 (the old search) 34,253 / 14,794
//     (P util@fail 0.868 vs 0.981); K=1 34,010 / 6,165; K=2 32,089 / 5,767;
//     K=3 31,349 / 5,751; K=4 30,424 / 5,674 (with best-of-K in step 2
//     too). Each K costs S ~4-5 ns per pair. Unbounded K in steps 1 and 2
//     made the same choice as the std::map best fit on every call of C
//     (checked call by call) and its refusals equal, 29,587.
//   * Ties: the lowest address among equal sizes. Taking the first exact
//     fit (the most recently freed range) instead: C 33,044 refusals vs
//     30,424 at K=4; at ops_scale 0.5 55,926 vs best fit 50,468 (1.11x),
//     5-6 ns per pair faster. Rejected.
//   * Step 2 taking the bin's head instead of the best of its first K: L
//     util@fail 0.944 (min 0.834) instead of best fit's 0.9627 (0.9484),
//     which best of 2, 3 or 4 match; speed within the noise. Best of K.
//   * K = 3 (both steps) vs 4, ops_scale 0.5, same runs as best fit: P
//     59.6 vs 63.2 ns per pair (best fit 601 / 569: ratio 0.099 / 0.111);
//     refusals C 51,977 vs 51,357 (best fit 50,468), P 10,500 vs 10,386
//     (10,456); util@fail C 0.8805 vs 0.9005 (0.8852). K = 3 is the default.
//   * The inline assembly (AddrUnlessNone's cmp + cmov) re-measured against
//     the plain ternary it falls back to off x86-64 (GCC makes that a
//     branch), two interleaved runs each: S 53.5 / 53.8 vs 58.1 / 58.5 ns
//     per pair, L 34.6 / 34.6 vs 35.1 / 35.1, P 53.8 / 56.0 vs 56.5 / 57.0.
//     It stays.
//   Issue 15, second round (stalls, and margin on P). Full scale, one run
//   per figure unless said, the 2-vCPU development VM (a Firecracker guest)
//   with other builds running; speed figures are medians of 3-4 runs
//   interleaved with the version compared against:
//   * Where slow calls come from (the cause attribution and rerun check
//     above were added for this). Unexplained calls over 10 us were never
//     slow again when rerun (rerun times 50-800 ns, both allocators), and
//     the environment line shows empty intervals stalling as long (10-25 of
//     2 million over 10 us, up to 40-134 us): the 41-102 us "clean" maxima
//     of the first round are the machine. The exact fallback never took
//     over 2 us when rerun. The rest were page faults and node storage
//     growth.
//   * Page faults. On this VM a trap on a fresh page costs ~1.4 us (up to
//     ~15-35 us when the host has to back the page, which the bench sees as
//     growth calls slow again on the rerun), and MADV_POPULATE_WRITE costs
//     about the same per page (1.3-1.4 us at 4-256 pages), so batching does
//     not make pages cheaper; it makes fewer calls pay. Per-page faults: F
//     had 4,099 faulting calls of ~770,000 (0.5%), all-call p99.9 2.1-2.8
//     us. Batches of 64 KiB: 262 faulting calls, p99.9 0.3-0.5 us, but a
//     batch took 25-35 us and up to 300 us when the host backed the pages
//     slowly; 32 KiB: ~515 calls (0.07%, still under 0.1%), p99.9 ~0.3
//     us, batches 12-25 us, worst 200-380 us (reproducible on the rerun).
//     32 KiB kept. Smaller batches would put the populating calls inside
//     p99.9.
//   * Node storage growth. Doubling a mapping in place with mprotect costs
//     more the larger the doubled part (1.3 us at 4 KiB, 16 us at 64 MiB);
//     a fixed 32 KiB step costs ~1.3 us at any size, so storage grows by
//     the populate batch inside an address range reserved up front (no
//     mremap, data never moves below 4M ranges).
//   * Speed on P (best-fit ratio 0.094-0.096 at the start of the round).
//     Kept, same placement: the default K=3 probe unrolled at compile time
//     (P 0.0945 -> 0.0913, C 0.0806 -> 0.0775), one inlined Take for steps
//     1 and 2 instead of two (P -> 0.0899, C -> 0.0769, S 0.0683 ->
//     0.0671). Measured and dropped: walking the own and the good-fit bin
//     side by side (two independent load chains; P 54 -> 59 ns per pair);
//     branch-free choice among the probed ranges (no gain); a per-bin cache
//     of the first three ranges so their nodes load in parallel (52 -> 55:
//     the probe is bound by instructions and mispredictions, not by the
//     load chain); a sentinel node instead of the end-of-list test (P 0.0913
//     -> 0.0943); Take's padding path out of line (P 0.0909 -> 0.0933, code
//     layout); one re-binning in Free for all cases (no gain); inserting a
//     freed range second when the head lies lower (refusals C 106,518 vs
//     107,855, but +7 ns per pair). Placement trades measured and dropped
//     (refusals / util@fail, best fit C 103,415 / 0.8827, P 22,134 /
//     0.9791): K=2 in both steps, P 0.087 but C 111,152 / 0.8442; K=2 in
//     step 1 only, P 0.090, C 110,133 / 0.8808, S util 0.9752 vs 0.9760;
//     K=2 in step 2 only, C 108,069 / 0.8876, P 22,210, ~1 ns; stopping
//     step 1 at an exact fit after 1 or 2 probes, C 114,913 / 110,487.
//   Issue 15, third round (no call over 100 us). Two runs each of
//   --nobackground_populate (round 2's in-call batches) and the default,
//   interleaved, full scale, the same VM, quieter (load average ~1):
//   * Populating in the calling thread cannot meet the bound on this VM: a
//     32 KiB batch is 12-25 us and up to 380 us when the host backs the
//     pages slowly, and smaller batches put the populating calls inside
//     p99.9 (round 2). Node pages are now faulted in by a PagePopulator
//     thread, ahead of the allocator by a quarter of what it has handed out
//     (NodeStorage). F: calls over 10 us blamed on growth 515, 513 -> 27,
//     23; all-call max 369, 93 -> 44, 31 us; "own max" (a column since
//     removed) 61, 59 -> 28, 21 us; p99.9 471, 341 -> 370, 251 ns. C own
//     max 61, 56 -> 27, 25 us.
//   * What is left on the request path is posting to the populator: a
//     futex wake of its idle thread, 5-30 us on this VM (a test program:
//     condition-variable notify after a 5 ms sleep, p50 4.6 us, p90 12.9,
//     max 20; an eventfd write max 55 us). With 32 KiB to 1 MiB ahead,
//     L's one 4 GiB slab of 89 blocks held 867 B per live block (64 KiB
//     populated ahead); a page to 1 MiB holds 315 B (round 2: 223), and F
//     still has 23-27 posting calls over 10 us.
//   * Speed and placement unchanged (the hot path is the same code): best-
//     fit ratios S 0.064-0.066, L 0.075-0.076, C 0.077, P 0.090-0.091.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/alloc/offset_allocator.h"
#include "tests/alloc/best_fit_baseline.h"
#include "tests/alloc/latency_recorder.h"
#include "tests/alloc/traces.h"

ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(double, ops_scale, 1.0,
          "scale the timed op counts (and the F slab) for smoke runs");
ABSL_FLAG(int, util_seeds, 10, "seeds averaged for utilisation at failure (S, L)");
ABSL_FLAG(uint64_t, seed, 42, "base seed of every trace");
ABSL_FLAG(bool, skip_baseline, false, "profiling: run only OffsetAllocator");
ABSL_FLAG(int, probes, -1, "tuning: OffsetAllocator own-bin probes (-1: default)");
ABSL_FLAG(std::string, traces, "S,L,F,C,P", "traces to run, comma separated");
ABSL_FLAG(bool, prefault, true,
          "grow and touch malloc's heap first, so metadata growth takes no "
          "page faults (see the header)");
ABSL_FLAG(int, prefault_mib, 512, "heap bytes --prefault touches, MiB");
ABSL_FLAG(bool, background_populate, true,
          "OffsetAllocator's node pages are faulted in ahead by a PagePopulator "
          "thread, as in the daemon (false: in the calling thread)");

namespace gpumem {
namespace {

struct Row {
  std::string trace, allocator;
  bool timed = false;
  double median_ns = 0, p99_ns = 0, ops_per_s = 0;
  uint64_t ops = 0, failures = 0;
  bool has_util = true;
  double util_mean = 0, util_min = 0;
  double util_req_mean = 0, util_req_min = 0;
  bool has_latency = false;
  uint64_t alloc_calls = 0, alloc_p999_ns = 0, alloc_max_ns = 0;
  uint64_t alloc_over_2us = 0, faults = 0;
  uint64_t all_p999_ns = 0, all_max_ns = 0, faulted_calls = 0, preempted_calls = 0;
  SlowCalls slow2, slow10;  // calls over 2 us / 10 us by cause
  // Calls over 10 us (not preempted) timed again on a rerun, by cause: how
  // many, how many were over 10 us again, the slowest rerun time.
  uint64_t rechecked[kNumCauses] = {}, recheck_slow[kNumCauses] = {},
           recheck_max_ns[kNumCauses] = {};
  double meta_held = 0, meta_in_use = 0;
  bool has_in_use = false;
  bool has_meta = true;
  uint64_t live = 0;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// OffsetAllocator as the daemon's SlabPool builds it: node pages faulted in
// ahead by the shared PagePopulator (--background_populate), or in the
// calling thread (--nobackground_populate).
class OffsetAllocatorUnderTest : public OffsetAllocator {
 public:
  explicit OffsetAllocatorUnderTest(uint64_t capacity)
      : OffsetAllocator(capacity, /*reserve_slots=*/0,
                        absl::GetFlag(FLAGS_background_populate) ? PagePopulator::Shared()
                                                                 : nullptr) {}
};

void FillMeta(const OffsetAllocator& a, uint64_t live, Row* row) {
  row->meta_held = live ? double(a.metadata_bytes()) / live : 0;
  row->meta_in_use = live ? double(a.nodes_in_use_bytes()) / live : 0;
  row->has_in_use = true;
}
void FillMeta(const BestFitBaseline& a, uint64_t live, Row* row) {
  row->meta_held = live ? double(a.metadata_bytes()) / live : 0;
}

void SetProbes(OffsetAllocator* a) {
  if (absl::GetFlag(FLAGS_probes) >= 0) a->set_own_bin_probes(absl::GetFlag(FLAGS_probes));
}
void SetProbes(BestFitBaseline*) {}
template <class A>
void SetProbes(LatencyRecorder<A>* r) { SetProbes(&r->inner()); }

// Does no bookkeeping at all: the harness floor. Inline, like the other two
// (OffsetAllocator's hot path is in offset_allocator_inl.h, the baseline is
// header-only), so the floor is the timed loop's own work: the op array, the
// alloc/free decision, the block table.
class NullAllocator {
 public:
  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t handle = 0;
  };
  explicit NullAllocator(uint64_t) {}
  bool Allocate(uint64_t size, uint64_t, Block* out) {
    out->offset = next_;
    out->size = size;
    next_ += size;
    return true;
  }
  void Free(const Block& b) { freed_ += b.size; }

 private:
  uint64_t next_ = 0;
  uint64_t freed_ = 0;
};

uint64_t Scaled(uint64_t n) {
  return std::max<uint64_t>(traces::kBatch,
                            uint64_t(n * absl::GetFlag(FLAGS_ops_scale)));
}

void FillTimed(const traces::TimedResult& r, Row* row) {
  row->timed = true;
  row->median_ns = Percentile(r.batch_ns_per_pair, 0.5);
  row->p99_ns = Percentile(r.batch_ns_per_pair, 0.99);
  row->ops = r.ops;
  row->ops_per_s = r.ops / r.total_seconds;
  row->failures = r.failures;
  row->live = r.live_at_end;
}

template <class A>
void FillLatency(const LatencyRecorder<A>& rec, uint64_t faults, Row* row) {
  const LatencyHistogram& h = rec.clean();
  row->has_latency = true;
  row->alloc_calls = rec.all().count();
  row->alloc_p999_ns = h.Quantile(0.999);
  row->alloc_max_ns = h.max();
  row->alloc_over_2us = h.CountAbove(2000);
  row->all_p999_ns = rec.all().Quantile(0.999);
  row->all_max_ns = rec.all().max();
  row->faulted_calls = rec.faulted_calls();
  row->preempted_calls = rec.preempted_calls();
  row->faults = faults;
  row->slow2 = rec.slow(0);
  row->slow10 = rec.slow(1);
}

// `again` replayed a trace, timing the first run's calls over 10 us again:
// per cause, how many were timed again, how many were over 10 us again and
// the slowest rerun. These are counts beside the table; no timing of the
// first run is replaced by its rerun's.
template <class A>
void FillRecheck(const LatencyRecorder<A>& again, Row* row) {
  for (size_t i = 0; i < again.rechecked().size() && i < again.recheck_ns().size(); ++i) {
    const int c = again.rechecked()[i].cause;
    const uint64_t ns = again.recheck_ns()[i];
    ++row->rechecked[c];
    if (ns > 10000) ++row->recheck_slow[c];
    row->recheck_max_ns[c] = std::max(row->recheck_max_ns[c], ns);
  }
}

// "p/g/f/x/u": slow calls by cause (LatencyRecorder's SlowCause order).
std::string CauseCounts(const SlowCalls& s) {
  std::string out;
  for (int c = 0; c < kNumCauses; ++c) {
    if (c) out += "/";
    out += absl::StrCat(s.by_cause[c]);
  }
  return out;
}

Row RunHarnessFloor(const traces::TraceSpec& t) {
  Row row;
  row.trace = t.name;
  row.allocator = "harness floor";
  row.has_util = false;
  NullAllocator a(t.capacity);
  FillTimed(traces::RunTimed(a, t, Scaled(t.ops), absl::GetFlag(FLAGS_seed)), &row);
  return row;
}

template <class A>
Row RunChurnTrace(const traces::TraceSpec& t, const char* name) {
  Row row;
  row.trace = t.name;
  row.allocator = name;
  {
    A a(t.capacity);
    SetProbes(&a);
    FillTimed(traces::RunTimed(a, t, Scaled(t.ops), absl::GetFlag(FLAGS_seed)), &row);
    FillMeta(a, row.live, &row);
  }
  {
    LatencyRecorder<A> rec(t.capacity);
    SetProbes(&rec);
    const uint64_t f0 = MinorFaults();
    traces::RunTimed(rec, t, Scaled(t.ops), absl::GetFlag(FLAGS_seed));
    FillLatency(rec, MinorFaults() - f0, &row);
    LatencyRecorder<A> again(t.capacity);
    SetProbes(&again);
    again.Recheck(rec.slow_calls());
    traces::RunTimed(again, t, Scaled(t.ops), absl::GetFlag(FLAGS_seed));
    FillRecheck(again, &row);
  }
  const int seeds = std::max(1, absl::GetFlag(FLAGS_util_seeds));
  double sum = 0, mn = 1, sum_req = 0, mn_req = 1;
  for (int s = 0; s < seeds; ++s) {
    A a(t.capacity);
    SetProbes(&a);
    const traces::Utilization u = traces::UtilizationAtFirstFailure(
        a, t, absl::GetFlag(FLAGS_seed) + 1000 + s);
    sum += u.live;
    mn = std::min(mn, u.live);
    sum_req += u.with_request;
    mn_req = std::min(mn_req, u.with_request);
  }
  row.util_mean = sum / seeds;
  row.util_min = mn;
  row.util_req_mean = sum_req / seeds;
  row.util_req_min = mn_req;
  return row;
}

template <class A>
Row RunRampTrace(const traces::RampSpec& t, const char* name) {
  Row row;
  row.trace = t.name;
  row.allocator = name;
  row.timed = true;
  row.has_meta = false;  // the run ends empty
  const uint64_t steps = Scaled(t.steps);
  std::vector<double> batches;
  double seconds = 0, sum = 0, sum_req = 0;
  row.util_min = row.util_req_min = 1;
  for (int s = 0; s < t.seeds; ++s) {
    A a(t.capacity);
    SetProbes(&a);
    const traces::RampResult r =
        traces::RunRamp(a, t, steps, absl::GetFlag(FLAGS_seed) + 2000 + s);
    batches.insert(batches.end(), r.batch_ns_per_pair.begin(),
                   r.batch_ns_per_pair.end());
    seconds += r.total_seconds;
    row.ops += r.ops;
    row.failures += r.refusals;
    sum += r.util_at_first_refusal;
    sum_req += r.util_with_request_at_first_refusal;
    row.util_min = std::min(row.util_min, r.util_at_first_refusal);
    row.util_req_min = std::min(row.util_req_min, r.util_with_request_at_first_refusal);
  }
  row.median_ns = Percentile(batches, 0.5);
  row.p99_ns = Percentile(batches, 0.99);
  row.ops_per_s = row.ops / seconds;
  row.util_mean = sum / t.seeds;
  row.util_req_mean = sum_req / t.seeds;
  {
    LatencyRecorder<A> rec(t.capacity);
    SetProbes(&rec);
    const uint64_t f0 = MinorFaults();
    traces::RunRamp(rec, t, steps, absl::GetFlag(FLAGS_seed) + 2000);
    FillLatency(rec, MinorFaults() - f0, &row);
    LatencyRecorder<A> again(t.capacity);
    SetProbes(&again);
    again.Recheck(rec.slow_calls());
    traces::RunRamp(again, t, steps, absl::GetFlag(FLAGS_seed) + 2000);
    FillRecheck(again, &row);
  }
  return row;
}

template <class A>
Row RunF(const char* name) {
  Row row;
  row.trace = "F";
  row.allocator = name;
  const double scale = std::min(1.0, absl::GetFlag(FLAGS_ops_scale));
  uint64_t cap = uint64_t(4 * traces::kGiB * scale) / traces::kGrain * traces::kGrain;
  cap = std::max<uint64_t>(cap, 4 * traces::kMiB);
  LatencyRecorder<A> rec(cap);
  SetProbes(&rec);
  const uint64_t f0 = MinorFaults();
  traces::FResult r = traces::RunFTrace(rec, cap, absl::GetFlag(FLAGS_seed));
  FillLatency(rec, MinorFaults() - f0, &row);
  {
    LatencyRecorder<A> again(cap);
    SetProbes(&again);
    again.Recheck(rec.slow_calls());
    traces::RunFTrace(again, cap, absl::GetFlag(FLAGS_seed));
    FillRecheck(again, &row);
  }
  row.util_mean = row.util_min = r.utilization;
  row.util_req_mean = row.util_req_min = r.utilization_with_request;
  row.live = r.live_blocks;
  row.failures = r.fill_failed ? 1 : 0;
  FillMeta(rec.inner(), r.live_blocks, &row);
  return row;
}

// Empty clock intervals, timed the way LatencyRecorder times a call (with
// the same getrusage reads around each): the median is the cost of the
// clock reads in every recorded value ("timer floor"); the intervals over 2
// and 10 us, with no fault and no preemption, are what the machine itself
// (interrupts, the hypervisor) adds to calls that do nothing ("environment"),
// the yardstick for calls blamed on no cause.
struct Environment {
  uint64_t intervals = 0, timer_floor_ns = 0, over_2us = 0, over_10us = 0,
           max_ns = 0;
};
Environment MeasureEnvironment(int intervals) {
  LatencyHistogram h;
  for (int i = 0; i < intervals; ++i) {
    uint64_t f0, p0, f1, p1;
    ThreadFaultsAndPreemptions(&f0, &p0);
    const auto t0 = std::chrono::steady_clock::now();
    const auto t1 = std::chrono::steady_clock::now();
    ThreadFaultsAndPreemptions(&f1, &p1);
    if (f1 != f0 || p1 != p0) continue;
    h.Add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
  }
  Environment e;
  e.intervals = h.count();
  e.timer_floor_ns = h.Quantile(0.5);
  e.over_2us = h.CountAbove(2000);
  e.over_10us = h.CountAbove(10000);
  e.max_ns = h.max();
  return e;
}

// Grows malloc's heap by `bytes`, touches every page and keeps the memory in
// the heap (no trimming; blocks below 32 MiB from the heap, not mmap), so
// later allocations reuse resident pages.
void Prefault(uint64_t bytes) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 0x7fffffff);
  // In pieces below the mmap threshold, so they come from the heap and go
  // back to it (freed, they coalesce into one free top chunk).
  constexpr uint64_t kPiece = 8 << 20;
  std::vector<void*> pieces;
  for (uint64_t done = 0; done < bytes; done += kPiece) {
    void* p = std::malloc(kPiece);
    if (p == nullptr) break;
    std::memset(p, 1, kPiece);
    pieces.push_back(p);
  }
  for (void* p : pieces) std::free(p);
}

void PrintTable(const std::vector<Row>& rows, const Environment& env) {
  absl::PrintF("%-5s %-15s %9s %9s %10s %8s %15s %15s %7s %7s %6s %8s %9s %7s %6s %14s %8s %7s %7s\n",
               "trace", "allocator", "med ns/pr", "p99 ns/pr", "ops",
               "refused", "util@fail(min)", "util+req(min)", "a p99.9",
               "a max", "a>2us", "all p99.9", "all max", "faulted", "preemp",
               ">10us p/g/f/x/u", "meta B/l", "in-use", "live");
  for (const Row& r : rows) {
    std::string med = "-", p99 = "-", ops = "-";
    if (r.timed) {
      med = absl::StrFormat("%.1f", r.median_ns);
      p99 = absl::StrFormat("%.1f", r.p99_ns);
      ops = absl::StrFormat("%d", r.ops);
    }
    std::string util = "-", util_req = "-", meta = "-";
    if (r.has_util) {
      const bool range = r.util_min != r.util_mean || r.timed;
      util = range ? absl::StrFormat("%.4f(%.4f)", r.util_mean, r.util_min)
                   : absl::StrFormat("%.4f", r.util_mean);
      util_req = range
                     ? absl::StrFormat("%.4f(%.4f)", r.util_req_mean, r.util_req_min)
                     : absl::StrFormat("%.4f", r.util_req_mean);
      if (r.has_meta) meta = absl::StrFormat("%.1f", r.meta_held);
    }
    std::string p999 = "-", amax = "-", over = "-", all_p999 = "-", all_max = "-",
                faulted = "-", preempted = "-", causes = "-";
    if (r.has_latency) {
      p999 = absl::StrFormat("%d", r.alloc_p999_ns);
      amax = absl::StrFormat("%d", r.alloc_max_ns);
      over = absl::StrFormat("%d", r.alloc_over_2us);
      all_p999 = absl::StrFormat("%d", r.all_p999_ns);
      all_max = absl::StrFormat("%d", r.all_max_ns);
      faulted = absl::StrFormat("%d", r.faulted_calls);
      preempted = absl::StrFormat("%d", r.preempted_calls);
      causes = CauseCounts(r.slow10);
    }
    std::string in_use = r.has_in_use ? absl::StrFormat("%.1f", r.meta_in_use) : "-";
    absl::PrintF("%-5s %-15s %9s %9s %10s %8d %15s %15s %7s %7s %6s %8s %9s %7s %6s %15s %8s %7s %7d\n",
                 r.trace.c_str(), r.allocator.c_str(), med.c_str(), p99.c_str(),
                 ops.c_str(), r.failures, util.c_str(), util_req.c_str(),
                 p999.c_str(), amax.c_str(), over.c_str(), all_p999.c_str(),
                 all_max.c_str(), faulted.c_str(), preempted.c_str(), causes.c_str(),
                 meta.c_str(), in_use.c_str(), r.live);
  }
  absl::PrintF("single Allocate calls, ns (first seed): a p99.9 / a max / a>2us over "
               "calls that took no page fault and were not preempted; all p99.9 / "
               "all max over every call; "
               "faulted / preemp: calls that took a page "
               "fault / were preempted; >10us: calls over 10 us blamed on preemption / "
               "node storage growth / a page fault / the exact fallback search / "
               "nothing (unexplained), the first that applies (the slowest of each "
               "below). Each includes the timer floor (median of an empty clock "
               "interval): %d ns. prefault: %s\n",
               env.timer_floor_ns, absl::GetFlag(FLAGS_prefault) ? "on" : "off");
  for (const Row& r : rows) {
    if (!r.has_latency) continue;
    for (const SlowCalls* sc : {&r.slow2, &r.slow10}) {
      std::string line;
      for (int c = 0; c < kNumCauses; ++c) {
        if (sc->by_cause[c] == 0) continue;
        absl::StrAppend(&line, " ", SlowCauseName(c), " ", sc->by_cause[c], " (max ",
                        sc->max_ns[c] / 1000, " us)");
      }
      absl::PrintF("  %s %s calls > %d us:%s\n", r.trace, r.allocator,
                   sc->threshold_ns / 1000, line.empty() ? " none" : line);
    }
    std::string again;
    for (int c = 0; c < kNumCauses; ++c) {
      if (r.rechecked[c] == 0) continue;
      absl::StrAppend(&again, " ", SlowCauseName(c), " ", r.recheck_slow[c], " of ",
                      r.rechecked[c], " (slowest ", r.recheck_max_ns[c], " ns)");
    }
    if (!again.empty()) {
      absl::PrintF("  %s %s calls > 10 us timed again on a rerun, over 10 us again:%s\n",
                   r.trace, r.allocator, again);
    }
  }
  absl::PrintF("environment: of %d empty clock intervals (no fault, no preemption) "
               "%d took over 2 us, %d over 10 us, the longest %d ns\n",
               env.intervals, env.over_2us, env.over_10us, env.max_ns);
}

void PrintJson(const std::vector<Row>& rows, const Environment& env) {
  absl::PrintF("{\"ops_scale\": %g, \"util_seeds\": %d, \"seed\": %d, "
               "\"prefault\": %s, \"timer_floor_ns\": %d, "
               "\"environment\": {\"intervals\": %d, \"over_2us\": %d, "
               "\"over_10us\": %d, \"max_ns\": %d}, \"rows\": [\n",
               absl::GetFlag(FLAGS_ops_scale), absl::GetFlag(FLAGS_util_seeds),
               absl::GetFlag(FLAGS_seed),
               absl::GetFlag(FLAGS_prefault) ? "true" : "false", env.timer_floor_ns,
               env.intervals, env.over_2us, env.over_10us, env.max_ns);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    absl::PrintF("  {\"trace\": \"%s\", \"allocator\": \"%s\"", r.trace.c_str(),
                r.allocator.c_str());
    if (r.timed) {
      absl::PrintF(", \"median_ns_per_pair\": %.2f, \"p99_ns_per_pair\": %.2f, "
                  "\"ops_per_s\": %.0f, \"ops\": %d",
                  r.median_ns, r.p99_ns, r.ops_per_s, r.ops);
    }
    absl::PrintF(", \"failures\": %d", r.failures);
    if (r.has_util) {
      absl::PrintF(", \"util_at_first_failure\": %.5f, "
                   "\"util_at_first_failure_min\": %.5f, "
                   "\"util_at_first_failure_with_request\": %.5f, "
                   "\"util_at_first_failure_with_request_min\": %.5f",
                   r.util_mean, r.util_min, r.util_req_mean, r.util_req_min);
      if (r.has_meta) {
        absl::PrintF(", \"metadata_bytes_per_live_block\": %.2f", r.meta_held);
      }
    }
    if (r.has_latency) {
      absl::PrintF(", \"allocate_calls\": %d, \"allocate_p999_ns\": %d, "
                   "\"allocate_max_ns\": %d, \"allocate_over_2us\": %d, "
                   "\"allocate_all_p999_ns\": %d, \"allocate_all_max_ns\": %d, "
                   "\"allocate_faulted_calls\": %d, \"allocate_preempted_calls\": %d, "
                   "\"minor_faults\": %d",
                   r.alloc_calls, r.alloc_p999_ns, r.alloc_max_ns,
                   r.alloc_over_2us, r.all_p999_ns, r.all_max_ns,
                   r.faulted_calls, r.preempted_calls, r.faults);
      for (const SlowCalls* sc : {&r.slow2, &r.slow10}) {
        absl::PrintF(", \"slow_over_%dus\": {", sc->threshold_ns / 1000);
        for (int c = 0; c < kNumCauses; ++c) {
          absl::PrintF("%s\"%s\": [%d, %d]", c ? ", " : "", SlowCauseName(c),
                       sc->by_cause[c], sc->max_ns[c]);
        }
        absl::PrintF("}");
      }
      absl::PrintF(", \"rechecked_over_10us\": {");
      for (int c = 0; c < kNumCauses; ++c) {
        absl::PrintF("%s\"%s\": [%d, %d, %d]", c ? ", " : "", SlowCauseName(c),
                     r.rechecked[c], r.recheck_slow[c], r.recheck_max_ns[c]);
      }
      absl::PrintF("}");
    }
    if (r.has_in_use) absl::PrintF(", \"in_use_bytes_per_live_block\": %.2f", r.meta_in_use);
    absl::PrintF(", \"live_blocks\": %d}%s\n", r.live, i + 1 < rows.size() ? "," : "");
  }
  absl::PrintF("]}\n");
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace gpumem;
  if (absl::GetFlag(FLAGS_prefault)) {
    Prefault(uint64_t(std::max(0, absl::GetFlag(FLAGS_prefault_mib))) << 20);
  }
  const Environment env = MeasureEnvironment(2000000);
  std::vector<std::string> want = absl::StrSplit(absl::GetFlag(FLAGS_traces), ',');
  auto wanted = [&](const char* name) {
    return std::find(want.begin(), want.end(), name) != want.end();
  };
  const bool baseline = !absl::GetFlag(FLAGS_skip_baseline);
  std::vector<Row> rows;
  for (const traces::TraceSpec& t : {traces::TraceS(), traces::TraceL()}) {
    if (!wanted(t.name)) continue;
    rows.push_back(RunHarnessFloor(t));
    rows.push_back(RunChurnTrace<OffsetAllocatorUnderTest>(t, "OffsetAllocator"));
    if (baseline) rows.push_back(RunChurnTrace<BestFitBaseline>(t, "map best-fit"));
  }
  if (wanted("F")) {
    rows.push_back(RunF<OffsetAllocatorUnderTest>("OffsetAllocator"));
    if (baseline) rows.push_back(RunF<BestFitBaseline>("map best-fit"));
  }
  for (const traces::RampSpec& t : {traces::TraceC(), traces::TraceP()}) {
    if (!wanted(t.name)) continue;
    rows.push_back(RunRampTrace<OffsetAllocatorUnderTest>(t, "OffsetAllocator"));
    if (baseline) rows.push_back(RunRampTrace<BestFitBaseline>(t, "map best-fit"));
  }
  if (absl::GetFlag(FLAGS_json)) PrintJson(rows, env);
  else PrintTable(rows, env);
  for (const Row& r : rows) {
    if (r.failures != 0 && r.timed && (r.trace == "S" || r.trace == "L")) {
      absl::FPrintF(stderr, "note: %s/%s refused %d requests in the timed run\n",
                   r.trace.c_str(), r.allocator.c_str(), r.failures);
    }
  }
  return 0;
}
