// The library's configuration from the environment and the placement text
// form, shared by the C ABI and the PyTorch entry points.
//
// Every malformed value is INVALID_ARGUMENT naming the variable (or flag) and
// what is wrong; nothing is silently ignored.
#ifndef GPUMEMD_CLIENT_LIB_ENV_CONFIG_H_
#define GPUMEMD_CLIENT_LIB_ENV_CONFIG_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/lib/pool/caching_pool.h"
#include "common/placement_set.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

// GPUMEM_LEASE_SIZE, GPUMEM_CACHE_MAX, GPUMEM_IDLE_RELEASE_MS,
// GPUMEM_RECONNECT_MS; the socket is `socket_path` if not empty, else
// GPUMEMD_SOCKET, else the default (gpumem.h lists them).
absl::StatusOr<PoolOptions> PoolOptionsFromEnv(absl::string_view socket_path);

// The CLI's placement flags in one string: "--gpus=0,1 --exclude=2
// --fallback=3 --fallback=all --policy=pack" ("--" optional; blanks
// separate flags). An empty string is the default placement.
absl::StatusOr<v1::PlacementRequest> ParsePlacementText(absl::string_view text);

// GPUMEM_PLACEMENT parsed, or the default placement when it is unset.
absl::StatusOr<v1::PlacementRequest> PlacementFromEnv();

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_ENV_CONFIG_H_
