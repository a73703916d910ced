// GpuMemoryService: gpumem.v1.GpuMemory over gRPC, a thin layer over
// MemoryBroker.
//
// Each handler finds its caller's kernel credentials in the PeerTable (by
// the "fd:N" peer string of connections the SocketListener accepted),
// calls the broker, and maps absl statuses to gRPC statuses one to one.
// A placement refusal travels as binary error details: a google.rpc.Status
// whose details hold a gpumem.v1.PlacementRefusal. The Stream method is not
// served here but asynchronously by StreamService (stream_service.h).
// server/metrics/metered_service.h derives from it to count and time the
// unary Allocate and Free.
#ifndef GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_

#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "server/service/memory_broker.h"
#include "server/service/stream_service.h"
#include "server/session/peer_credentials.h"
#include "server/service/tenant_admin.h"

namespace gpumem {

// absl -> gRPC, keeping the code and message; a PlacementRefusal payload
// becomes the binary error details.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The caller as the kernel identifies its connection (PeerTable, by
// ctx->peer()); a caller without a visible pid proves its connection-bound
// session with the token its slab channel was given (gRPC metadata
// kSessionTokenHeader). Used by the unary handlers and, once per stream,
// by StreamService.
absl::StatusOr<PeerCred> CallerOf(grpc::ServerContext* ctx, const PeerTable& peers,
                                  const MemoryBroker& broker);

class GpuMemoryService : public GpuMemoryWithAsyncStream {
 public:
  // `tenants` (GetUsage, GetLedger, SetQuota) may be null: those RPCs are
  // then UNIMPLEMENTED.
  GpuMemoryService(MemoryBroker* broker, const PeerTable* peers,
                   TenantAdmin* tenants = nullptr)
      : broker_(broker), peers_(peers), tenants_(tenants) {}

  grpc::Status Allocate(grpc::ServerContext* ctx, const v1::AllocateRequest* req,
                        v1::AllocateResponse* resp) override;
  grpc::Status Free(grpc::ServerContext* ctx, const v1::FreeRequest* req,
                    v1::FreeResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req,
                        v1::GetStatsResponse* resp) override;
  grpc::Status GetSession(grpc::ServerContext* ctx, const v1::GetSessionRequest* req,
                          v1::Session* resp) override;
  grpc::Status GetUsage(grpc::ServerContext* ctx, const v1::GetUsageRequest* req,
                        v1::GetUsageResponse* resp) override;
  grpc::Status GetLedger(grpc::ServerContext* ctx, const v1::GetLedgerRequest* req,
                         v1::GetLedgerResponse* resp) override;
  grpc::Status SetQuota(grpc::ServerContext* ctx, const v1::SetQuotaRequest* req,
                        v1::SetQuotaResponse* resp) override;

 private:
  MemoryBroker* broker_;
  const PeerTable* peers_;
  TenantAdmin* tenants_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_
