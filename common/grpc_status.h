// absl::Status <-> grpc::Status, the one conversion both sides use.
//
// gRPC and absl share status codes 1..16, so the code and message travel
// unchanged. A placement refusal (common/refusal_payload.h) rides in the
// binary error details as a google.rpc.Status (v1::RpcStatus, see
// rpc_status.h) whose details hold the PlacementRefusal, and comes back as
// the payload. Other payloads are not carried.
#ifndef GPUMEMD_COMMON_GRPC_STATUS_H_
#define GPUMEMD_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace gpumem {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_GRPC_STATUS_H_
