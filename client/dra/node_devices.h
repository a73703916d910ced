// NodeDevice: one GPU of this node as the DRA driver shows it, made from
// gpumemd's GetStats answer.
//
// The device's name in the ResourceSlice is derived from its UUID (lowercase,
// a DNS label), never from its index, so a claim keeps naming the same GPU
// when indices change (CUDA_VISIBLE_DEVICES, a daemon restart).
// leasable_bytes is what gpumemd can still lend to claims on it: the
// device's total, less what tenants that are not claims hold there (used
// and retained bytes: the main socket's uid/gid tenants), less, on the cuda
// backend, memory held outside gpumemd (driver total - driver free -
// gpumemd's pool). Claims' own memory is not subtracted: the scheduler
// already counts it against the capacity (consumedCapacity).
#ifndef GPUMEMD_CLIENT_DRA_NODE_DEVICES_H_
#define GPUMEMD_CLIENT_DRA_NODE_DEVICES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace dra {

// Claim tenants are named kClaimTenantPrefix + the claim's UID.
inline constexpr absl::string_view kClaimTenantPrefix = "claim-";

struct NodeDevice {
  uint32_t index = 0;
  std::string name;   // the ResourceSlice device name
  std::string uuid;   // gpumemd's (and CUDA's) UUID, "GPU-..."
  std::string model;  // the device's name ("NVIDIA H200")
  std::string pci_bus_id;
  uint64_t total_bytes = 0;
  uint64_t leasable_bytes = 0;
};

// "GPU-51000000-..." -> "gpu-51000000-...": lowercase, characters other
// than [a-z0-9-] become '-', at most 63, starting and ending alphanumeric;
// "gpu-<index>" when nothing usable is left.
std::string DeviceNameForUuid(absl::string_view uuid, uint32_t index);

std::vector<NodeDevice> DevicesFromStats(const v1::GetStatsResponse& stats);

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_NODE_DEVICES_H_
