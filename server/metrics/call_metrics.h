// CallMetrics: the daemon's event counters and the allocation latency
// histogram, kept in a prometheus-cpp Registry.
//
// Guarantees:
//  - gpumemd_allocations_total{device}: blocks handed out (a sharded call
//    counts one per shard, on its device).
//  - gpumemd_frees_total: successful Free RPCs (memory returned because a
//    session ended shows in the gauges, not here).
//  - gpumemd_allocation_refusals_total{reason}: refused Allocate calls, by
//    reason: "capacity", "fragmentation", "quota" (the placement refusal's
//    most common device reason) or the status code in lower case
//    ("invalid_argument", "unavailable", "permission_denied", ...): the
//    rule of common/refusal_payload.h, which GetStats' counters use too.
//  - gpumemd_allocation_latency_seconds: every Allocate call, served or not,
//    from the handler's entry to its answer (buckets 10 us .. 1 s).
// Thread-safety: the Record* methods may be called from any thread
// (prometheus-cpp's counters are atomic; the family maps are locked inside).
#ifndef GPUMEMD_SERVER_METRICS_CALL_METRICS_H_
#define GPUMEMD_SERVER_METRICS_CALL_METRICS_H_

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <grpcpp/support/status.h>

#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

class CallMetrics {
 public:
  CallMetrics();

  // `status` as the client gets it (a placement refusal travels in its
  // binary error details).
  void RecordAllocate(const grpc::Status& status, const v1::AllocateResponse& response,
                      absl::Duration latency);
  void RecordFree(const grpc::Status& status);

  // What the exposer collects.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // The refusal label for a failed Allocate (see above).
  static std::string RefusalReason(const grpc::Status& status);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* allocations_;
  prometheus::Family<prometheus::Counter>* refusals_;
  prometheus::Counter* frees_;
  prometheus::Histogram* latency_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_CALL_METRICS_H_
