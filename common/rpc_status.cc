// See rpc_status.h.
#include "common/rpc_status.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "common/refusal_payload.h"

namespace gpumem {

v1::RpcStatus ToRpcStatus(const absl::Status& status) {
  v1::RpcStatus out;
  if (status.ok()) return out;
  out.set_code(static_cast<int32_t>(status.code()));
  out.set_message(std::string(status.message()));
  std::optional<v1::PlacementRefusal> refusal = RefusalFromStatus(status);
  if (refusal.has_value()) out.add_details()->PackFrom(*refusal);
  return out;
}

absl::Status FromRpcStatus(const v1::RpcStatus& status) {
  if (status.code() == 0) return absl::OkStatus();
  int code = status.code();
  // 1..16 are the codes gRPC and absl share.
  if (code < 1 || code > 16) code = static_cast<int>(absl::StatusCode::kUnknown);
  absl::Status out(static_cast<absl::StatusCode>(code), status.message());
  for (const google::protobuf::Any& any : status.details()) {
    if (any.Is<v1::PlacementRefusal>()) {
      out.SetPayload(kPlacementRefusalTypeUrl, absl::Cord(any.value()));
    }
  }
  return out;
}

}  // namespace gpumem
