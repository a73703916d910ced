// CudaBackend: real GPUs through the CUDA driver API, loaded at run time.
//
// Nothing links libcuda: Create() dlopens "libcuda.so.1" and resolves the
// entry points it needs, so the daemon builds and starts anywhere, and on a
// machine without an NVIDIA driver Create() fails with one clear
// FAILED_PRECONDITION line instead of a loader error.
//
// Slabs are CUDA virtual memory: cuMemCreate with a POSIX file descriptor
// handle type, exported with cuMemExportToShareableHandle, so clients import
// them exactly like the sim backend's memfds (HANDLE_KIND_POSIX_FD). Slab
// sizes must be multiples of granularity(); the pool rounds to it. Scrub maps
// the range into the daemon, zeroes it with cuMemsetD8 and unmaps it.
//
// Scope today (the CUDA backend issue will extend it): VMM POSIX-fd slabs
// only; no fabric handles, no legacy cudaIpcMemHandle_t mode.
#ifndef GPUMEMD_SERVER_BACKEND_CUDA_BACKEND_H_
#define GPUMEMD_SERVER_BACKEND_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/backend/backend.h"

namespace gpumem {

class CudaBackend {
 public:
  // Loads the driver and enumerates devices. FAILED_PRECONDITION when the
  // driver library is missing, cuInit fails, or there are no devices.
  // `library` is the name given to dlopen (tests pass a missing one).
  static absl::StatusOr<std::unique_ptr<Backend>> Create(
      const char* library = "libcuda.so.1");
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_BACKEND_CUDA_BACKEND_H_
