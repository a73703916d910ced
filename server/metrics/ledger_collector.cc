// See ledger_collector.h. Families in a fixed order, one sample each.
#include "server/metrics/ledger_collector.h"

#include <string>

namespace gpumem {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily One(const char* name, const char* help, MetricType type, double value) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  ClientMetric m;
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

std::vector<MetricFamily> LedgerCollector::FromStats(const ledger::WriterStats& s) {
  const MetricType g = MetricType::Gauge, c = MetricType::Counter;
  return {
      One("gpumemd_ledger_failing", "1 while the ledger's commits fail (see the daemon's log)",
          g, s.failing ? 1 : 0),
      One("gpumemd_ledger_held_events", "Events held in memory for a commit that works", g,
          double(s.held_events)),
      One("gpumemd_ledger_dropped_events_total",
          "Events dropped past max_held while commits failed", c, double(s.dropped_events)),
      One("gpumemd_ledger_committed_events_total", "Events committed to the ledger file", c,
          double(s.committed_events)),
      One("gpumemd_ledger_commits_total", "Ledger transactions committed", c,
          double(s.commits)),
      One("gpumemd_ledger_failed_commits_total", "Ledger commits that failed", c,
          double(s.failed_commits)),
      One("gpumemd_ledger_wal_pages", "Pages in the ledger's WAL", g, double(s.wal_pages)),
      One("gpumemd_ledger_blocked_checkpoints_total",
          "Checkpoints a reader's open read transaction kept from finishing", c,
          double(s.blocked_checkpoints)),
      One("gpumemd_ledger_writer_cpu_seconds_total", "CPU time of the ledger's writer thread",
          c, s.writer_cpu_ns / 1e9),
      One("gpumemd_ledger_churn_folded_pairs_total",
          "Allocate+free pairs past a tenant's churn cap, counted in `retained`, not stored",
          c, double(s.churn_folded_pairs)),
  };
}

std::vector<MetricFamily> LedgerCollector::Collect() const {
  if (ledger_ == nullptr || !ledger_->enabled()) return {};
  return FromStats(ledger_->stats());
}

}  // namespace gpumem
