// LedgerCollector: Prometheus figures of the ledger's writer, read from
// TenantLedger::stats() at each scrape, so an operator sees a ledger that
// cannot write (disk full, file removed or replaced) or whose WAL cannot be
// checkpointed (a reader holding a read transaction) without reading logs.
//
// Families (no labels; none at all with --ledger=none):
//   gpumemd_ledger_failing                 1 while commits fail, else 0
//   gpumemd_ledger_held_events             events waiting in memory for a commit that works
//   gpumemd_ledger_dropped_events_total    events dropped past max_held (LEDGER_GAP counts them)
//   gpumemd_ledger_committed_events_total, gpumemd_ledger_commits_total,
//   gpumemd_ledger_failed_commits_total
//   gpumemd_ledger_wal_pages               pages in the WAL
//   gpumemd_ledger_blocked_checkpoints_total  checkpoints a reader kept from finishing
//   gpumemd_ledger_writer_cpu_seconds_total   the writer thread's CPU
// Thread-safety: Collect() may run on any thread; it only calls stats().
#ifndef GPUMEMD_SERVER_METRICS_LEDGER_COLLECTOR_H_
#define GPUMEMD_SERVER_METRICS_LEDGER_COLLECTOR_H_

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "server/ledger/tenant_ledger.h"

namespace gpumem {

class LedgerCollector final : public prometheus::Collectable {
 public:
  // `ledger` must outlive the collector's registration.
  explicit LedgerCollector(const ledger::TenantLedger* ledger) : ledger_(ledger) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

  // The families from the writer's figures (what Collect uses; tests too).
  static std::vector<prometheus::MetricFamily> FromStats(const ledger::WriterStats& stats);

 private:
  const ledger::TenantLedger* ledger_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_LEDGER_COLLECTOR_H_
