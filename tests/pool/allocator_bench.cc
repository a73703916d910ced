// allocator_bench: replays the fixed-seed S, L and F traces (tests/pool/
// traces.h) against gpumem::OffsetAllocator and, in the same run, against the
// std::map best-fit baseline, and prints per trace:
//   * ns per allocate+free pair, median and p99 over batches of 1024 ops
//     (batch time / 512), and ops/s over the timed run (S, L). Each batch is
//     generated into a flat op array before its clock starts, so the timed
//     loop does only allocator calls (traces::RunTimed); both allocators run
//     the same harness on the same trace;
//   * utilisation at first failure, on the growing random workload (S, L;
//     mean and min over --util_seeds seeds) or on the F staircase, in two
//     readings: "util@fail" = bytes of the live blocks / capacity when a
//     request is first refused; "util+req" = the same plus the refused
//     request (the demand that could not be met). The reference
//     figure for a std::map best-fit on L (0.973) matches the second reading
//     (the baseline here gives 0.974 on the default seeds) and not the first
//     (0.963); on S the two differ by < 0.001;
//   * host metadata bytes per live block: "held" = everything the allocator
//     holds (node array capacity incl. growth slack, neighbour flags, bin
//     tables, the object) / live blocks; "in use" = bytes of nodes
//     describing a live block or a free range / live blocks;
//   * a "harness floor" row: the same timed harness driving an allocator
//     that does nothing (a bump counter), i.e. what the harness itself costs
//     per pair; the allocators' rows include this cost. All three are
//     compiled into the loop (none is called out of line).
// Usage: allocator_bench [--json] [--ops_scale=1] [--util_seeds=10]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "server/pool/offset_allocator.h"
#include "tests/pool/best_fit_baseline.h"
#include "tests/pool/traces.h"

ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(double, ops_scale, 1.0,
          "scale the timed op counts (and the F slab) for smoke runs");
ABSL_FLAG(int, util_seeds, 10, "seeds averaged for utilisation at failure");
ABSL_FLAG(uint64_t, seed, 42, "base seed of every trace");
ABSL_FLAG(bool, skip_baseline, false, "profiling: run only OffsetAllocator");
ABSL_FLAG(int, probes, -1, "tuning: OffsetAllocator own-bin probes (-1: default)");

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
  double meta_held = 0, meta_in_use = 0;
  bool has_in_use = false;
  uint64_t live = 0;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

template <class A>
void FillMeta(const A& a, uint64_t live, Row* row);
template <>
void FillMeta(const OffsetAllocator& a, uint64_t live, Row* row) {
  row->meta_held = live ? double(a.metadata_bytes()) / live : 0;
  row->meta_in_use = live ? double(a.nodes_in_use_bytes()) / live : 0;
  row->has_in_use = true;
}
template <>
void FillMeta(const BestFitBaseline& a, uint64_t live, Row* row) {
  row->meta_held = live ? double(a.metadata_bytes()) / live : 0;
}

void SetProbes(OffsetAllocator* a) {
  if (absl::GetFlag(FLAGS_probes) >= 0) a->set_own_bin_probes(absl::GetFlag(FLAGS_probes));
}
void SetProbes(BestFitBaseline*) {}

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

uint64_t TimedOps(const traces::TraceSpec& t) {
  return std::max<uint64_t>(traces::kBatch,
                            uint64_t(t.ops * absl::GetFlag(FLAGS_ops_scale)));
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

Row RunHarnessFloor(const traces::TraceSpec& t) {
  Row row;
  row.trace = t.name;
  row.allocator = "harness floor";
  row.has_util = false;
  NullAllocator a(t.capacity);
  FillTimed(traces::RunTimed(a, t, TimedOps(t), absl::GetFlag(FLAGS_seed)), &row);
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
    FillTimed(traces::RunTimed(a, t, TimedOps(t), absl::GetFlag(FLAGS_seed)), &row);
    FillMeta(a, row.live, &row);
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
Row RunF(const char* name) {
  Row row;
  row.trace = "F";
  row.allocator = name;
  const double scale = std::min(1.0, absl::GetFlag(FLAGS_ops_scale));
  uint64_t cap = uint64_t(4 * traces::kGiB * scale) / traces::kGrain * traces::kGrain;
  cap = std::max<uint64_t>(cap, 4 * traces::kMiB);
  A a(cap);
  SetProbes(&a);
  traces::FResult r = traces::RunFTrace(a, cap, absl::GetFlag(FLAGS_seed));
  row.util_mean = row.util_min = r.utilization;
  row.util_req_mean = row.util_req_min = r.utilization_with_request;
  row.live = r.live_blocks;
  row.failures = r.fill_failed ? 1 : 0;
  FillMeta(a, r.live_blocks, &row);
  return row;
}

void PrintTable(const std::vector<Row>& rows) {
  absl::PrintF("%-5s %-16s %10s %10s %12s %10s %9s %15s %15s %11s %11s %8s\n",
               "trace", "allocator", "med ns/pr", "p99 ns/pr", "ops/s", "ops",
               "failures", "util@fail(min)", "util+req(min)", "meta B/live",
               "in-use B/l", "live");
  for (const Row& r : rows) {
    std::string med = "-", p99 = "-", opss = "-", ops = "-";
    if (r.timed) {
      med = absl::StrFormat("%.1f", r.median_ns);
      p99 = absl::StrFormat("%.1f", r.p99_ns);
      opss = absl::StrFormat("%.3g", r.ops_per_s);
      ops = absl::StrFormat("%d", r.ops);
    }
    std::string util = "-", util_req = "-", meta = "-";
    if (r.has_util) {
      util = r.timed ? absl::StrFormat("%.4f(%.4f)", r.util_mean, r.util_min)
                     : absl::StrFormat("%.4f", r.util_mean);
      util_req = r.timed
                     ? absl::StrFormat("%.4f(%.4f)", r.util_req_mean, r.util_req_min)
                     : absl::StrFormat("%.4f", r.util_req_mean);
      meta = absl::StrFormat("%.1f", r.meta_held);
    }
    std::string in_use = r.has_in_use ? absl::StrFormat("%.1f", r.meta_in_use) : "-";
    absl::PrintF("%-5s %-16s %10s %10s %12s %10s %9d %15s %15s %11s %11s %8d\n",
                 r.trace.c_str(), r.allocator.c_str(), med.c_str(), p99.c_str(),
                 opss.c_str(), ops.c_str(), r.failures, util.c_str(),
                 util_req.c_str(), meta.c_str(), in_use.c_str(), r.live);
  }
}

void PrintJson(const std::vector<Row>& rows) {
  absl::PrintF("{\"ops_scale\": %g, \"util_seeds\": %d, \"seed\": %d, \"rows\": [\n",
              absl::GetFlag(FLAGS_ops_scale), absl::GetFlag(FLAGS_util_seeds),
              absl::GetFlag(FLAGS_seed));
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
                   "\"util_at_first_failure_with_request_min\": %.5f, "
                   "\"metadata_bytes_per_live_block\": %.2f",
                   r.util_mean, r.util_min, r.util_req_mean, r.util_req_min,
                   r.meta_held);
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
  std::vector<Row> rows;
  for (const traces::TraceSpec& t : {traces::TraceS(), traces::TraceL()}) {
    rows.push_back(RunHarnessFloor(t));
    rows.push_back(RunChurnTrace<OffsetAllocator>(t, "OffsetAllocator"));
    if (!absl::GetFlag(FLAGS_skip_baseline)) {
      rows.push_back(RunChurnTrace<BestFitBaseline>(t, "map best-fit"));
    }
  }
  rows.push_back(RunF<OffsetAllocator>("OffsetAllocator"));
  if (!absl::GetFlag(FLAGS_skip_baseline)) {
    rows.push_back(RunF<BestFitBaseline>("map best-fit"));
  }
  if (absl::GetFlag(FLAGS_json)) PrintJson(rows);
  else PrintTable(rows);
  for (const Row& r : rows) {
    if (r.failures != 0 && r.timed) {
      absl::FPrintF(stderr, "note: %s/%s refused %d requests in the timed run\n",
                   r.trace.c_str(), r.allocator.c_str(), r.failures);
    }
  }
  return 0;
}
