// Field names and shapes follow k8s.io/api resource/v1 types.go (v0.34.0):
// ResourceSliceSpec{driver, pool{name, generation, resourceSliceCount},
// nodeName, devices[]}, Device{name, attributes, capacity,
// allowMultipleAllocations}, DeviceCapacity{value, requestPolicy{default,
// validRange{min, step}}}, DeviceAttribute{string|int}.
#include "client/dra/resource_slice.h"

#include "absl/strings/str_cat.h"
#include "client/dra/quantity.h"

namespace gpumem {
namespace dra {

absl::Status ValidateSliceConfig(const SliceConfig& c) {
  if (c.driver.empty() || c.node.empty()) {
    return absl::InvalidArgumentError("the driver name and node name must be set");
  }
  if (c.step_bytes == 0) return absl::InvalidArgumentError("the request step must be > 0");
  if (c.min_bytes == 0 || c.min_bytes % c.step_bytes != 0 ||
      c.default_bytes % c.step_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request minimum (", FormatQuantityBytes(c.min_bytes), ") and default (",
        FormatQuantityBytes(c.default_bytes), ") must be positive multiples of the step (",
        FormatQuantityBytes(c.step_bytes), ")"));
  }
  if (c.default_bytes < c.min_bytes) {
    return absl::InvalidArgumentError("the request default must be at least the minimum");
  }
  return absl::OkStatus();
}

std::string SliceName(const SliceConfig& c) { return absl::StrCat(c.node, "-", c.driver); }

nlohmann::json SliceDevices(const SliceConfig& c, const std::vector<NodeDevice>& devices) {
  nlohmann::json out = nlohmann::json::array();
  for (const NodeDevice& d : devices) {
    const uint64_t capacity = d.leasable_bytes - d.leasable_bytes % c.step_bytes;
    if (capacity < c.default_bytes || capacity < c.min_bytes + c.step_bytes) continue;
    nlohmann::json attrs = {
        {"uuid", {{"string", d.uuid}}},
        {"model", {{"string", d.model}}},
        {"index", {{"int", d.index}}},
    };
    if (!d.pci_bus_id.empty()) attrs["pciBusID"] = {{"string", d.pci_bus_id}};
    out.push_back({
        {"name", d.name},
        {"attributes", attrs},
        {"capacity",
         {{"memory",
           {{"value", FormatQuantityBytes(capacity)},
            {"requestPolicy",
             {{"default", FormatQuantityBytes(c.default_bytes)},
              {"validRange",
               {{"min", FormatQuantityBytes(c.min_bytes)},
                {"step", FormatQuantityBytes(c.step_bytes)}}}}}}}}},
        {"allowMultipleAllocations", true},
    });
  }
  return out;
}

nlohmann::json BuildResourceSlice(const SliceConfig& c, const nlohmann::json& devices,
                                  int64_t generation) {
  return {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceSlice"},
      {"metadata", {{"name", SliceName(c)}}},
      {"spec",
       {{"driver", c.driver},
        {"nodeName", c.node},
        {"pool", {{"name", c.node}, {"generation", generation}, {"resourceSliceCount", 1}}},
        {"devices", devices}}},
  };
}

}  // namespace dra
}  // namespace gpumem
