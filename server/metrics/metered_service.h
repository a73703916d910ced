// MeteredGpuMemoryService: GpuMemoryService with CallMetrics recorded around
// Allocate and Free; an adaptor, so the service itself knows nothing of
// metrics and the daemon registers this one only with --metrics_listen.
//
// Guarantees: answers exactly what GpuMemoryService answers; every Allocate
// is timed from handler entry to answer and counted by outcome, every Free
// counted when it succeeds. `metrics` must outlive the service.
#ifndef GPUMEMD_SERVER_METRICS_METERED_SERVICE_H_
#define GPUMEMD_SERVER_METRICS_METERED_SERVICE_H_

#include "server/metrics/call_metrics.h"
#include "server/service/gpumem_service.h"

namespace gpumem {

class MeteredGpuMemoryService final : public GpuMemoryService {
 public:
  MeteredGpuMemoryService(MemoryBroker* broker, const PeerTable* peers,
                          TenantAdmin* tenants, CallMetrics* metrics)
      : GpuMemoryService(broker, peers, tenants), metrics_(metrics) {}

  grpc::Status Allocate(grpc::ServerContext* ctx, const v1::AllocateRequest* req,
                        v1::AllocateResponse* resp) override {
    const absl::Time start = absl::Now();
    grpc::Status status = GpuMemoryService::Allocate(ctx, req, resp);
    metrics_->RecordAllocate(status, *resp, absl::Now() - start);
    return status;
  }

  grpc::Status Free(grpc::ServerContext* ctx, const v1::FreeRequest* req,
                    v1::FreeResponse* resp) override {
    grpc::Status status = GpuMemoryService::Free(ctx, req, resp);
    metrics_->RecordFree(status);
    return status;
  }

 private:
  CallMetrics* metrics_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_METERED_SERVICE_H_
