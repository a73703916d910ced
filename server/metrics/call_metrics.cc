// See call_metrics.h.
#include "server/metrics/call_metrics.h"

#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/status/status.h"

namespace gpumem {

CallMetrics::CallMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  allocations_ = &prometheus::BuildCounter()
                      .Name("gpumemd_allocations_total")
                      .Help("Blocks handed out by Allocate, per device")
                      .Register(*registry_);
  refusals_ = &prometheus::BuildCounter()
                   .Name("gpumemd_allocation_refusals_total")
                   .Help("Allocate calls refused, by reason")
                   .Register(*registry_);
  frees_ = &prometheus::BuildCounter()
                .Name("gpumemd_frees_total")
                .Help("Successful Free calls")
                .Register(*registry_)
                .Add({});
  latency_ = &prometheus::BuildHistogram()
                  .Name("gpumemd_allocation_latency_seconds")
                  .Help("Allocate calls, from handler entry to answer")
                  .Register(*registry_)
                  .Add({}, prometheus::Histogram::BucketBoundaries{
                               1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                               2.5e-3, 5e-3, 1e-2, 0.1, 1});
}

std::string CallMetrics::RefusalReason(const grpc::Status& status) {
  v1::RpcStatus details;
  v1::PlacementRefusal placement;
  std::optional<v1::PlacementRefusal> refusal;
  if (!status.error_details().empty() &&
      details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      if (any.UnpackTo(&placement)) refusal = placement;
    }
  }
  if (refusal.has_value()) {
    std::map<std::string, int> votes;
    for (const v1::DeviceRefusal& d : refusal->devices()) {
      switch (d.reason()) {
        case v1::DeviceRefusal::REASON_CAPACITY: ++votes["capacity"]; break;
        case v1::DeviceRefusal::REASON_FRAGMENTATION: ++votes["fragmentation"]; break;
        case v1::DeviceRefusal::REASON_QUOTA: ++votes["quota"]; break;
        default: break;  // excluded / holds a shard: not why it failed
      }
    }
    std::string best;
    int most = 0;
    for (const auto& [reason, n] : votes) {
      if (n > most) best = reason, most = n;
    }
    if (!best.empty()) return best;
  }
  // gRPC and absl status codes have the same numbers.
  return absl::AsciiStrToLower(
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())));
}

void CallMetrics::RecordAllocate(const grpc::Status& status,
                                 const v1::AllocateResponse& response,
                                 absl::Duration latency) {
  latency_->Observe(absl::ToDoubleSeconds(latency));
  if (!status.ok()) {
    refusals_->Add({{"reason", RefusalReason(status)}}).Increment();
    return;
  }
  for (const v1::Allocation& a : response.allocations()) {
    allocations_->Add({{"device", absl::StrCat(a.device_index())}}).Increment();
  }
}

void CallMetrics::RecordFree(const grpc::Status& status) {
  if (status.ok()) frees_->Increment();
}

}  // namespace gpumem
