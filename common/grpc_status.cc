#include "common/grpc_status.h"

#include <string>

#include "common/refusal_payload.h"
#include "common/rpc_status.h"

namespace gpumem {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  std::string message(status.message());
  if (!RefusalFromStatus(status).has_value()) return grpc::Status(code, message);
  return grpc::Status(code, message, ToRpcStatus(status).SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  v1::RpcStatus details;
  if (status.error_details().empty() || !details.ParseFromString(status.error_details())) {
    details.Clear();
  }
  // The code and message are the call's own; only the details come from the
  // trailer (a peer may send details that disagree with its status).
  details.set_code(static_cast<int32_t>(status.error_code()));
  details.set_message(status.error_message());
  return FromRpcStatus(details);
}

}  // namespace gpumem
