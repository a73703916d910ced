#include "common/refusal_payload.h"

#include <string>

namespace gpumem {

std::optional<v1::PlacementRefusal> RefusalFromStatus(const absl::Status& status) {
  auto payload = status.GetPayload(kPlacementRefusalTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::PlacementRefusal refusal;
  if (!refusal.ParseFromString(std::string(*payload))) return std::nullopt;
  return refusal;
}

}  // namespace gpumem
