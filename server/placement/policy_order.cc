#include "server/placement/policy_order.h"

#include <algorithm>

namespace gpumem {
namespace placement {

using ::gpumem::v1::PlacementRequest;

std::vector<uint32_t> OrderStage(absl::Span<const uint32_t> stage,
                                 PlacementRequest::Policy policy,
                                 std::optional<uint32_t> near,
                                 const DeviceSnapshot& snapshot) {
  std::vector<uint32_t> order(stage.begin(), stage.end());
  const std::vector<DeviceView>& view = snapshot.devices;
  // Each comparator is a strict "tried before" that ends with the index, so
  // no two devices compare equal.
  auto least_loaded = [&](uint32_t a, uint32_t b) {
    if (view[a].free_bytes != view[b].free_bytes) {
      return view[a].free_bytes > view[b].free_bytes;
    }
    return a < b;
  };
  switch (policy) {
    case PlacementRequest::POLICY_PACK:
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        if (view[a].used_bytes != view[b].used_bytes) {
          return view[a].used_bytes > view[b].used_bytes;
        }
        return a < b;
      });
      break;
    case PlacementRequest::POLICY_NEAR:
      if (near.has_value()) {
        std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
          PeerDistance da = snapshot.Distance(*near, a);
          PeerDistance db = snapshot.Distance(*near, b);
          if (da != db) return da < db;
          return least_loaded(a, b);
        });
        break;
      }
      [[fallthrough]];
    case PlacementRequest::POLICY_UNSPECIFIED:
    case PlacementRequest::POLICY_LEAST_LOADED:
    default:
      std::sort(order.begin(), order.end(), least_loaded);
      break;
  }
  return order;
}

std::vector<uint32_t> CandidateOrder(const ResolvedPlacement& placement,
                                     const DeviceSnapshot& snapshot) {
  std::vector<uint32_t> candidates;
  std::vector<bool> seen(snapshot.devices.size(), false);
  for (const std::vector<uint32_t>& stage : placement.stages) {
    for (uint32_t d :
         OrderStage(stage, placement.policy, placement.near, snapshot)) {
      // Resolution makes stages disjoint; stay safe for hand-built ones.
      if (seen[d]) continue;
      seen[d] = true;
      candidates.push_back(d);
    }
  }
  return candidates;
}

}  // namespace placement
}  // namespace gpumem
