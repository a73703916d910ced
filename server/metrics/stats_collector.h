// StatsCollector: Prometheus gauges read from MemoryBroker::Stats() at each
// scrape, rendered as GetStats renders it (server/service/stats_proto.h), so
// they are exactly what GetStats answers at that moment (no second
// bookkeeping that could drift). Scrapes see what root sees. The families
// are listed at FromStats. Thread-safety: Collect() may run on any thread;
// it only calls Stats().
#ifndef GPUMEMD_SERVER_METRICS_STATS_COLLECTOR_H_
#define GPUMEMD_SERVER_METRICS_STATS_COLLECTOR_H_

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/core/memory_broker.h"

namespace gpumem {

class StatsCollector final : public prometheus::Collectable {
 public:
  // `broker` must outlive the collector's registration.
  explicit StatsCollector(const MemoryBroker* broker) : broker_(broker) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

  // The same families from a GetStats answer (what Collect uses; tests too).
  // Per device (labels device="<index>", uuid="GPU-..."):
  //   gpumemd_device_total_bytes, gpumemd_device_used_bytes,
  //   gpumemd_device_pooled_bytes, gpumemd_device_free_bytes,
  //   gpumemd_device_largest_free_block_bytes, gpumemd_device_fragmentation,
  //   gpumemd_device_slabs, gpumemd_device_allocations,
  //   gpumemd_device_retained_bytes
  // per tenant (labels tenant="<name>", as GetStats names it: "ml", or
  // "uid-1000" when no tenants are configured; tenant_id="<id>"), GetStats'
  // tenant rows (tenants that hold slabs or retained bytes now):
  //   gpumemd_tenant_used_bytes, gpumemd_tenant_retained_bytes,
  //   gpumemd_tenant_allocations, gpumemd_tenant_peak_bytes,
  //   gpumemd_tenant_waiting_requests, and per device (labels tenant, device)
  //   gpumemd_tenant_device_used_bytes, gpumemd_tenant_device_retained_bytes,
  //   gpumemd_tenant_device_slabs
  // and the tenant's quota as GetStats' tenant row gives it (the quota
  // book's, config or SetQuota): gpumemd_tenant_quota_bytes (total_bytes),
  // gpumemd_tenant_quota_allocations (max_allocations), and
  // gpumemd_tenant_device_quota_bytes (labels tenant, device); a limit that
  // is not set has no sample (an unlimited tenant has none of the three).
  // Also gpumemd_sessions (live sessions), gpumemd_waiting_requests (all
  // tenants' waiting Allocates), gpumemd_uptime_seconds and
  // gpumemd_restart_lost_allocations (DaemonCounters).
  static std::vector<prometheus::MetricFamily> FromStats(const v1::GetStatsResponse& stats);

 private:
  const MemoryBroker* broker_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_STATS_COLLECTOR_H_
