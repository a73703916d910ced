// CallObserver: what the transports report of each Allocate and Free they
// answer, for an adaptor to count (server/metrics/ implements it for
// Prometheus). The transports know nothing of metrics; without an observer
// nothing is reported.
//
// Called once per answered call, on whichever thread answered it (a queue
// thread, a worker, admission's thread for a waiting request), with the
// status the client gets. Implementations must be thread-safe and quick.
#ifndef GPUMEMD_SERVER_SERVICE_CALL_OBSERVER_H_
#define GPUMEMD_SERVER_SERVICE_CALL_OBSERVER_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

class CallObserver {
 public:
  virtual ~CallObserver() = default;
  // `response` is empty unless `status` is OK; `latency` runs from the
  // request's arrival to its answer.
  virtual void OnAllocate(const absl::Status& status, const v1::AllocateResponse& response,
                          absl::Duration latency) = 0;
  virtual void OnFree(const absl::Status& status) = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_CALL_OBSERVER_H_
