#include "server/service/gpumem_service.h"

#include "common/fd_channel.h"
#include "common/refusal_payload.h"

namespace gpumem {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  std::string message(status.message());
  std::optional<v1::PlacementRefusal> refusal =
      RefusalFromStatus(status);
  if (!refusal.has_value()) return grpc::Status(code, message);
  v1::RpcStatus details;
  details.set_code(static_cast<int32_t>(status.code()));
  details.set_message(message);
  details.add_details()->PackFrom(*refusal);
  return grpc::Status(code, message, details.SerializeAsString());
}

absl::StatusOr<PeerCred> CallerOf(grpc::ServerContext* ctx, const PeerTable& peers,
                                  const MemoryBroker& broker) {
  absl::StatusOr<PeerCred> caller = peers.Lookup(ctx->peer());
  if (!caller.ok() || caller->pid > 0) return caller;
  auto token = ctx->client_metadata().find(kSessionTokenHeader);
  if (token == ctx->client_metadata().end()) return caller;  // Attach says why
  absl::StatusOr<uint64_t> session = broker.ResolveSessionToken(
      absl::string_view(token->second.data(), token->second.size()), *caller);
  if (!session.ok()) return session.status();
  caller->bound_session = *session;
  return caller;
}

namespace {

template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status GpuMemoryService::Allocate(grpc::ServerContext* ctx,
                                        const v1::AllocateRequest* req,
                                        v1::AllocateResponse* resp) {
  absl::StatusOr<PeerCred> caller = CallerOf(ctx, *peers_, *broker_);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(broker_->Allocate(*caller, *req), resp);
}

grpc::Status GpuMemoryService::Free(grpc::ServerContext* ctx,
                                    const v1::FreeRequest* req,
                                    v1::FreeResponse* resp) {
  absl::StatusOr<PeerCred> caller = CallerOf(ctx, *peers_, *broker_);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(broker_->Free(*caller, *req), resp);
}

grpc::Status GpuMemoryService::GetStats(grpc::ServerContext* ctx,
                                        const v1::GetStatsRequest* req,
                                        v1::GetStatsResponse* resp) {
  absl::StatusOr<PeerCred> caller = CallerOf(ctx, *peers_, *broker_);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  *resp = broker_->Stats(*caller, req->include_slabs());
  return grpc::Status::OK;
}

grpc::Status GpuMemoryService::GetSession(grpc::ServerContext* ctx,
                                          const v1::GetSessionRequest*,
                                          v1::Session* resp) {
  absl::StatusOr<PeerCred> caller = CallerOf(ctx, *peers_, *broker_);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(broker_->GetSession(*caller), resp);
}

grpc::Status GpuMemoryService::GetUsage(grpc::ServerContext* ctx, const v1::GetUsageRequest*,
                                        v1::GetUsageResponse* resp) {
  if (tenants_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no tenants");
  absl::StatusOr<PeerCred> caller = peers_->Lookup(ctx->peer());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(tenants_->GetUsage(*caller), resp);
}

grpc::Status GpuMemoryService::GetLedger(grpc::ServerContext* ctx,
                                         const v1::GetLedgerRequest* req,
                                         v1::GetLedgerResponse* resp) {
  if (tenants_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no tenants");
  absl::StatusOr<PeerCred> caller = peers_->Lookup(ctx->peer());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(tenants_->GetLedger(*caller, *req), resp);
}

grpc::Status GpuMemoryService::SetQuota(grpc::ServerContext* ctx, const v1::SetQuotaRequest* req,
                                        v1::SetQuotaResponse* resp) {
  if (tenants_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no tenants");
  absl::StatusOr<PeerCred> caller = peers_->Lookup(ctx->peer());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(tenants_->SetQuota(*caller, *req), resp);
}

}  // namespace gpumem
