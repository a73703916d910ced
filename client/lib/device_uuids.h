// Each device's UUID by the daemon's index, from the daemon's GetStats on
// the pool's connection: what gpumem_device_count counts and what the
// PyTorch entry points map this process's CUDA ordinals to.
#ifndef GPUMEMD_CLIENT_LIB_DEVICE_UUIDS_H_
#define GPUMEMD_CLIENT_LIB_DEVICE_UUIDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/lib/pool/caching_pool.h"

namespace gpumem {
namespace client {

// GPUMEM_E_FORKED in a fork() child of the pool's process.
absl::StatusOr<std::vector<std::string>> DeviceUuids(CachingPool* pool);

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_DEVICE_UUIDS_H_
