// The node's ResourceSlice (resource.k8s.io/v1): what the scheduler sees of
// this node's gpumemd memory.
//
// One slice per node, one pool named after the node (resourceSliceCount 1),
// one device per GPU: attributes uuid, model, index (and pciBusID when the
// daemon knows it), capacity "memory" = leasable bytes rounded down to the
// request step, allowMultipleAllocations (KEP-5075 consumable capacity: many
// claims share one GPU, each consuming part of its memory), and a request
// policy: a claim that names no amount gets `default`, smaller requests are
// raised to `min`, and amounts are rounded up to min + n*step.
// A device whose capacity cannot hold the policy (less than both default and
// min + step) is left out: the API server would refuse the whole slice, and
// nothing could be allocated there anyway.
#ifndef GPUMEMD_CLIENT_DRA_RESOURCE_SLICE_H_
#define GPUMEMD_CLIENT_DRA_RESOURCE_SLICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "client/dra/node_devices.h"

namespace gpumem {
namespace dra {

struct SliceConfig {
  std::string driver;  // DRA driver name
  std::string node;    // node name: the slice's nodeName and pool name
  uint64_t default_bytes = uint64_t{1} << 30;
  uint64_t min_bytes = uint64_t{256} << 20;
  uint64_t step_bytes = uint64_t{256} << 20;
};

// INVALID_ARGUMENT unless step > 0, min and default are multiples of step,
// and default >= min (what the API server's validation needs).
absl::Status ValidateSliceConfig(const SliceConfig& config);

// "<node>-<driver>", a DNS subdomain.
std::string SliceName(const SliceConfig& config);

// The slice's "devices" array: what changes when capacity changes.
nlohmann::json SliceDevices(const SliceConfig& config, const std::vector<NodeDevice>& devices);

// The whole object, ready for server-side apply.
nlohmann::json BuildResourceSlice(const SliceConfig& config, const nlohmann::json& devices,
                                  int64_t generation);

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_RESOURCE_SLICE_H_
