// CallMetrics: the daemon's event counters and the allocation latency
// histogram, kept in a prometheus-cpp Registry. It is a CallObserver
// (server/service/call_observer.h): the transports report each answered
// Allocate and Free to it, unary and Stream alike, and know nothing of
// Prometheus; the daemon installs it only with --metrics_listen. The
// families are described on their fields. Thread-safety: the Record*
// methods may be called from any thread (prometheus-cpp's counters are
// atomic; the family maps are locked inside).
#ifndef GPUMEMD_SERVER_METRICS_CALL_METRICS_H_
#define GPUMEMD_SERVER_METRICS_CALL_METRICS_H_

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/service/call_observer.h"

namespace gpumem {

class CallMetrics final : public CallObserver {
 public:
  CallMetrics();

  void OnAllocate(const absl::Status& status, const v1::AllocateResponse& response,
                  absl::Duration latency) override;
  void OnFree(const absl::Status& status) override;

  // What the exposer collects.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  // gpumemd_allocations_total{device}: blocks handed out (a sharded call
  // counts one per shard, on its device).
  prometheus::Family<prometheus::Counter>* allocations_;
  // gpumemd_allocation_refusals_total{reason}: refused Allocate calls, by
  // reason: "capacity", "fragmentation", "quota" (the placement refusal's
  // most common device reason) or the status code in lower case
  // ("invalid_argument", "unavailable", "permission_denied", ...): the rule
  // of common/refusal_payload.h's RefusalLabel, which GetStats' counters
  // use too.
  prometheus::Family<prometheus::Counter>* refusals_;
  // gpumemd_frees_total: successful Free RPCs (memory returned because a
  // session ended shows in the gauges, not here).
  prometheus::Counter* frees_;
  // gpumemd_allocation_latency_seconds: every Allocate call, served or not,
  // from the handler's entry to its answer (buckets 10 us .. 1 s).
  prometheus::Histogram* latency_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_CALL_METRICS_H_
