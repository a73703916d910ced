#include "common/refusal_payload.h"

#include <string>

#include "absl/strings/ascii.h"

namespace gpumem {

std::optional<v1::PlacementRefusal> RefusalFromStatus(const absl::Status& status) {
  auto payload = status.GetPayload(kPlacementRefusalTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::PlacementRefusal refusal;
  if (!refusal.ParseFromString(std::string(*payload))) return std::nullopt;
  return refusal;
}

RefusalReason RefusalReasonOf(const absl::Status& status) {
  std::optional<v1::PlacementRefusal> refusal = RefusalFromStatus(status);
  if (!refusal.has_value()) return RefusalReason::kOther;
  int votes[3] = {0, 0, 0};
  for (const v1::DeviceRefusal& d : refusal->devices()) {
    switch (d.reason()) {
      case v1::DeviceRefusal::REASON_CAPACITY: ++votes[0]; break;
      case v1::DeviceRefusal::REASON_FRAGMENTATION: ++votes[1]; break;
      case v1::DeviceRefusal::REASON_QUOTA: ++votes[2]; break;
      default: break;  // excluded / holds a shard: not why it failed
    }
  }
  int best = -1;
  for (int i = 0; i < 3; ++i) {
    if (votes[i] > 0 && (best < 0 || votes[i] > votes[best])) best = i;
  }
  switch (best) {
    case 0: return RefusalReason::kCapacity;
    case 1: return RefusalReason::kFragmentation;
    case 2: return RefusalReason::kQuota;
    default: return RefusalReason::kOther;
  }
}

v1::DeviceRefusal DeviceRefusalOf(const Refusal& refusal) {
  v1::DeviceRefusal d;
  d.set_device_index(refusal.device);
  switch (refusal.reason) {
    case RefusalReason::kCapacity: d.set_reason(v1::DeviceRefusal::REASON_CAPACITY); break;
    case RefusalReason::kFragmentation:
      d.set_reason(v1::DeviceRefusal::REASON_FRAGMENTATION);
      break;
    case RefusalReason::kQuota: d.set_reason(v1::DeviceRefusal::REASON_QUOTA); break;
    case RefusalReason::kOther: d.set_reason(v1::DeviceRefusal::REASON_UNSPECIFIED); break;
  }
  d.set_free_bytes(refusal.free_bytes);
  d.set_largest_free_bytes(refusal.largest_free_bytes);
  d.set_detail(refusal.detail);
  return d;
}

std::string RefusalLabel(const absl::Status& status) {
  switch (RefusalReasonOf(status)) {
    case RefusalReason::kCapacity: return "capacity";
    case RefusalReason::kFragmentation: return "fragmentation";
    case RefusalReason::kQuota: return "quota";
    case RefusalReason::kOther: break;
  }
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

}  // namespace gpumem
