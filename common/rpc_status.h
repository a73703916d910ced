// absl::Status <-> gpumem.v1.RpcStatus (the google.rpc.Status shape).
//
// The stream RPC answers each request with an RpcStatus instead of a gRPC
// status; the unary RPCs carry the same message in their binary error
// details. Converting here keeps both paths identical: the code and message
// travel unchanged, and a PlacementRefusal payload (common/refusal_payload.h)
// becomes a `details` entry and back. Other payloads are not carried.
#ifndef GPUMEMD_COMMON_RPC_STATUS_H_
#define GPUMEMD_COMMON_RPC_STATUS_H_

#include "absl/status/status.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

// Code 0 and nothing else for OK.
v1::RpcStatus ToRpcStatus(const absl::Status& status);

// OK for code 0. A code outside gRPC's range becomes UNKNOWN, keeping the
// message (the other side may be hostile or newer).
absl::Status FromRpcStatus(const v1::RpcStatus& status);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_RPC_STATUS_H_
