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

RefusalKind RefusalKindOf(absl::StatusCode code,
                          const std::optional<v1::PlacementRefusal>& refusal) {
  (void)code;  // every code without a device reason is kOther
  if (!refusal.has_value()) return RefusalKind::kOther;
  int votes[3] = {0, 0, 0};  // capacity, fragmentation, quota
  for (const v1::DeviceRefusal& d : refusal->devices()) {
    switch (d.reason()) {
      case v1::DeviceRefusal::REASON_CAPACITY: ++votes[0]; break;
      case v1::DeviceRefusal::REASON_FRAGMENTATION: ++votes[1]; break;
      case v1::DeviceRefusal::REASON_QUOTA: ++votes[2]; break;
      default: break;  // excluded / holds a shard: not why it failed
    }
  }
  int best = -1, most = 0;
  for (int i = 0; i < 3; ++i) {
    if (votes[i] > most) best = i, most = votes[i];
  }
  switch (best) {
    case 0: return RefusalKind::kCapacity;
    case 1: return RefusalKind::kFragmentation;
    case 2: return RefusalKind::kQuota;
    default: return RefusalKind::kOther;
  }
}

RefusalKind RefusalKindOf(const absl::Status& status) {
  return RefusalKindOf(status.code(), RefusalFromStatus(status));
}

std::string RefusalLabel(absl::StatusCode code,
                         const std::optional<v1::PlacementRefusal>& refusal) {
  switch (RefusalKindOf(code, refusal)) {
    case RefusalKind::kCapacity: return "capacity";
    case RefusalKind::kFragmentation: return "fragmentation";
    case RefusalKind::kQuota: return "quota";
    case RefusalKind::kOther: break;
  }
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

}  // namespace gpumem
