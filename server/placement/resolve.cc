#include "server/placement/resolve.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/placement_set.h"

namespace gpumem {
namespace placement {
namespace {

using ::gpumem::v1::PlacementRequest;

std::string DeviceRange(size_t count) {
  if (count == 0) return "the daemon has no devices";
  if (count == 1) return "the only device is 0";
  return absl::StrCat("devices are 0..", count - 1);
}

// The one device `selector` names, or INVALID_ARGUMENT naming `field`.
// "all" names no single device, so it is refused here.
absl::StatusOr<uint32_t> ResolveOne(absl::string_view field,
                                    absl::string_view selector,
                                    absl::Span<const DeviceView> devices) {
  if (selector.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": empty device selector"));
  }
  if (IsAllSelector(selector)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"all\" names no single device"));
  }
  if (IsIndexSelector(selector)) {
    uint32_t index = 0;
    if (absl::SimpleAtoi(selector, &index) && index < devices.size()) {
      return index;
    }
  } else {
    for (const DeviceView& device : devices) {
      if (!device.uuid.empty() &&
          absl::EqualsIgnoreCase(selector, device.uuid)) {
        return device.index;
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": no device \"", selector, "\"; ", DeviceRange(devices.size())));
}

// The mask of the devices a repeated selector field names; empty means all
// when `empty_is_all`. "all" names every device. A device named twice is
// refused, naming both selectors.
absl::StatusOr<std::vector<bool>> ResolveSet(
    absl::string_view field,
    const google::protobuf::RepeatedPtrField<std::string>& selectors,
    absl::Span<const DeviceView> devices, bool empty_is_all) {
  std::vector<bool> mask(devices.size(), empty_is_all && selectors.empty());
  // by[d]: the position of the selector that named device d, or -1.
  std::vector<int> by(devices.size(), -1);
  auto twice = [&](int first, int again, uint32_t device) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"", selectors[again], "\" names device ", device,
        " again (\"", selectors[first], "\" named it); name each device once"));
  };
  for (int i = 0; i < selectors.size(); ++i) {
    const std::string& selector = selectors[i];
    if (IsAllSelector(selector)) {
      for (uint32_t d = 0; d < devices.size(); ++d) {
        if (by[d] >= 0) return twice(by[d], i, d);
        by[d] = i;
      }
      mask.assign(devices.size(), true);
      continue;
    }
    absl::StatusOr<uint32_t> device = ResolveOne(field, selector, devices);
    if (!device.ok()) return device.status();
    if (by[*device] >= 0) return twice(by[*device], i, *device);
    by[*device] = i;
    mask[*device] = true;
  }
  return mask;
}

// The size limits of resolve.h, for one list.
absl::Status CheckList(absl::string_view field,
                       const google::protobuf::RepeatedPtrField<std::string>& selectors,
                       size_t device_count) {
  const size_t limit = MaxSelectorsPerList(device_count);
  if (static_cast<size_t>(selectors.size()) > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", selectors.size(), " selectors, more than the limit of ", limit,
        " (max(", kSelectorsPerDevice, " x ", device_count, " devices, ",
        kMinSelectorsPerList, "))"));
  }
  for (int i = 0; i < selectors.size(); ++i) {
    if (selectors[i].size() > kMaxSelectorBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "]: a selector of ", selectors[i].size(),
          " bytes, more than the limit of ", kMaxSelectorBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// Every size limit of the request, before anything is matched.
absl::Status CheckBounds(const PlacementRequest& request, size_t device_count) {
  if (static_cast<size_t>(request.fallback_size()) > kMaxFallbackSets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.fallback: ", request.fallback_size(),
        " fallback sets, more than the limit of ", kMaxFallbackSets));
  }
  if (request.near().size() > kMaxSelectorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.near: a selector of ", request.near().size(),
        " bytes, more than the limit of ", kMaxSelectorBytes, " bytes"));
  }
  if (absl::Status s = CheckList("placement.devices", request.devices(), device_count);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckList("placement.exclude", request.exclude(), device_count);
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < request.fallback_size(); ++i) {
    if (absl::Status s = CheckList(absl::StrCat("placement.fallback[", i, "]"),
                                   request.fallback(i).devices(), device_count);
        !s.ok()) {
      return s;
    }
  }
  const auto& visible = request.visible_devices();
  if (static_cast<size_t>(visible.size()) > kMaxVisibleDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.visible_devices: ", visible.size(), " UUIDs, more than the limit of ",
        kMaxVisibleDevices));
  }
  for (int i = 0; i < visible.size(); ++i) {
    if (visible[i].size() > kMaxSelectorBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement.visible_devices[", i, "]: ", visible[i].size(),
          " bytes, more than the limit of ", kMaxSelectorBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// The devices `visible_devices` names by UUID; every device when it names
// none of them (the caller's view says nothing about this daemon's devices).
std::vector<bool> VisibleMask(const PlacementRequest& request,
                              absl::Span<const DeviceView> devices) {
  std::vector<bool> mask(devices.size(), false);
  bool any = false;
  for (const std::string& uuid : request.visible_devices()) {
    for (const DeviceView& device : devices) {
      if (!device.uuid.empty() && absl::EqualsIgnoreCase(uuid, device.uuid)) {
        mask[device.index] = true;
        any = true;
      }
    }
  }
  if (!any) mask.assign(devices.size(), true);
  return mask;
}

// FAILED_PRECONDITION when a selector of `field` names a device the caller
// cannot see ("all" means the visible ones and is never refused).
absl::Status CheckSeen(absl::string_view field,
                       const google::protobuf::RepeatedPtrField<std::string>& selectors,
                       absl::Span<const DeviceView> devices, const std::vector<bool>& seen) {
  for (const std::string& selector : selectors) {
    if (IsAllSelector(selector)) continue;
    absl::StatusOr<uint32_t> device = ResolveOne(field, selector, devices);
    if (!device.ok()) return device.status();
    if (seen[*device]) continue;
    std::vector<std::string> names;
    for (uint32_t d = 0; d < devices.size(); ++d) {
      if (seen[d]) names.push_back(absl::StrCat(d, " (", devices[d].uuid, ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": \"", selector, "\" is device ", *device, " (", devices[*device].uuid,
        "), which the calling process cannot see; of gpumemd's devices it sees ",
        absl::StrJoin(names, ", "),
        " (check CUDA_VISIBLE_DEVICES and the container's GPUs)"));
  }
  return absl::OkStatus();
}

}  // namespace

size_t MaxSelectorsPerList(size_t device_count) {
  return std::max(kSelectorsPerDevice * device_count, kMinSelectorsPerList);
}

size_t ResolvedPlacement::allowed_device_count() const {
  size_t n = 0;
  for (const std::vector<uint32_t>& stage : stages) n += stage.size();
  return n;
}

absl::StatusOr<ResolvedPlacement> ResolvePlacement(
    const PlacementRequest& request, absl::Span<const DeviceView> devices) {
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].index != i) {
      return absl::InternalError(
          absl::StrCat("placement: device snapshot entry ", i, " has index ",
                       devices[i].index));
    }
  }
  // Sizes first: nothing below does work in proportion to an unchecked list.
  if (absl::Status bounded = CheckBounds(request, devices.size()); !bounded.ok()) {
    return bounded;
  }
  ResolvedPlacement resolved;

  // Policy first: it does not depend on the devices.
  switch (request.policy()) {
    case PlacementRequest::POLICY_UNSPECIFIED:
      resolved.policy = PlacementRequest::POLICY_LEAST_LOADED;
      break;
    case PlacementRequest::POLICY_LEAST_LOADED:
    case PlacementRequest::POLICY_PACK:
    case PlacementRequest::POLICY_NEAR:
      resolved.policy = request.policy();
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("placement.policy: unknown policy ",
                       static_cast<int>(request.policy())));
  }
  if (resolved.policy == PlacementRequest::POLICY_NEAR) {
    if (request.near().empty()) {
      return absl::InvalidArgumentError(
          "placement.near: POLICY_NEAR needs the device to be near");
    }
  } else if (!request.near().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.near: \"", request.near(),
                     "\" is set but the policy is not POLICY_NEAR"));
  }

  // Every field is resolved before anything is decided, so any unknown
  // selector is reported whatever the other fields say.
  std::vector<std::vector<bool>> stage_masks;
  absl::StatusOr<std::vector<bool>> first =
      ResolveSet("placement.devices", request.devices(), devices,
                 /*empty_is_all=*/true);
  if (!first.ok()) return first.status();
  stage_masks.push_back(*std::move(first));
  for (int i = 0; i < request.fallback_size(); ++i) {
    absl::StatusOr<std::vector<bool>> set =
        ResolveSet(absl::StrCat("placement.fallback[", i, "]"),
                   request.fallback(i).devices(), devices,
                   /*empty_is_all=*/true);
    if (!set.ok()) return set.status();
    stage_masks.push_back(*std::move(set));
  }
  absl::StatusOr<std::vector<bool>> exclude =
      ResolveSet("placement.exclude", request.exclude(), devices,
                 /*empty_is_all=*/false);
  if (!exclude.ok()) return exclude.status();
  if (resolved.policy == PlacementRequest::POLICY_NEAR) {
    absl::StatusOr<uint32_t> near =
        ResolveOne("placement.near", request.near(), devices);
    if (!near.ok()) return near.status();
    resolved.near = *near;
  }

  // The caller's view last: a selector that names an unknown device is
  // INVALID_ARGUMENT above, whatever the process sees.
  const std::vector<bool> visible = VisibleMask(request, devices);
  if (absl::Status s = CheckSeen("placement.devices", request.devices(), devices, visible);
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < request.fallback_size(); ++i) {
    if (absl::Status s = CheckSeen(absl::StrCat("placement.fallback[", i, "]"),
                                   request.fallback(i).devices(), devices, visible);
        !s.ok()) {
      return s;
    }
  }

  std::vector<bool> seen(devices.size(), false);
  for (const std::vector<bool>& mask : stage_masks) {
    std::vector<uint32_t> stage;
    for (uint32_t d = 0; d < devices.size(); ++d) {
      if (!mask[d] || seen[d] || !visible[d]) continue;
      seen[d] = true;
      if (!(*exclude)[d]) stage.push_back(d);
    }
    resolved.stages.push_back(std::move(stage));
  }
  // Excluded devices some stage named; those no stage named were never
  // candidates.
  for (uint32_t d = 0; d < devices.size(); ++d) {
    if (seen[d] && (*exclude)[d]) resolved.excluded.push_back(d);
  }
  return resolved;
}

}  // namespace placement
}  // namespace gpumem
