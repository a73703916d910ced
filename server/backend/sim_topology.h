// The simulated GPUs' interconnect, from a flag such as
// --sim_topology=nvlink:0-1,2-3;pcie:0-2
//
// Sections separated by ';', each "nvlink:" or "pcie:" then comma-separated
// groups of device indices joined by '-': every pair inside a group is
// linked that way ("0-1-2" links all three); NVLink wins where a pair is in
// both. Every other pair of distinct devices reaches each other through the
// host. An empty text means no peer links at all. A group naming a device
// that does not exist, a group of one, or any other syntax is
// INVALID_ARGUMENT.
#ifndef GPUMEMD_SERVER_BACKEND_SIM_TOPOLOGY_H_
#define GPUMEMD_SERVER_BACKEND_SIM_TOPOLOGY_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/backend/backend.h"

namespace gpumem {

// Row-major device_count x device_count matrix of links.
absl::StatusOr<std::vector<PeerLink>> ParseSimTopology(absl::string_view text,
                                                       uint32_t device_count);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_BACKEND_SIM_TOPOLOGY_H_
