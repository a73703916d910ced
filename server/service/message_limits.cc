// One table, by request type: the method's name (for the refusal's words)
// and its limit.
#include "server/service/message_limits.h"

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {
namespace {

struct Limit {
  absl::string_view type;
  absl::string_view method;
  size_t bytes;
};

constexpr Limit kLimits[] = {
    {"gpumem.v1.AllocateRequest", "Allocate", kAllocateRequestLimit},
    {"gpumem.v1.FreeRequest", "Free", kSmallRequestLimit},
    {"gpumem.v1.GetStatsRequest", "GetStats", kSmallRequestLimit},
    {"gpumem.v1.GetSessionRequest", "GetSession", kSmallRequestLimit},
    {"gpumem.v1.GetUsageRequest", "GetUsage", kSmallRequestLimit},
    {"gpumem.v1.GetLedgerRequest", "GetLedger", kSmallRequestLimit},
    {"gpumem.v1.SetQuotaRequest", "SetQuota", kTenantRequestLimit},
    {"gpumem.v1.PutTenantRequest", "PutTenant", kTenantRequestLimit},
    {"gpumem.v1.DeleteTenantRequest", "DeleteTenant", kSmallRequestLimit},
    {"gpumem.v1.ResumeRequest", "Resume", kResumeRequestLimit},
};

const Limit* Find(absl::string_view type) {
  for (const Limit& l : kLimits) {
    if (l.type == type) return &l;
  }
  return nullptr;
}

}  // namespace

size_t RequestLimit(absl::string_view request_type) {
  const Limit* l = Find(request_type);
  return l == nullptr ? kSmallRequestLimit : l->bytes;
}

absl::Status CheckRequestSize(const google::protobuf::Message& request) {
  const std::string& type = request.GetDescriptor()->full_name();
  const size_t limit = RequestLimit(type);
  const size_t bytes = request.ByteSizeLong();
  if (bytes <= limit) return absl::OkStatus();
  const Limit* l = Find(type);
  return absl::ResourceExhaustedError(absl::StrCat(
      l == nullptr ? type : std::string(l->method), " request of ", bytes,
      " bytes is over its limit of ", FormatBytes(limit), " (a fixed per-method limit: README \"Limits\")"));
}

absl::Status CheckStreamMessageSize(uint64_t index, size_t bytes) {
  if (bytes <= kAllocateRequestLimit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "stream message ", index, " is ", bytes, " bytes, over the limit of ",
      FormatBytes(kAllocateRequestLimit),
      " for a Stream message (a fixed per-method limit: README \"Limits\")"));
}

}  // namespace gpumem
