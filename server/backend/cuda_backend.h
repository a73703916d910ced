// CudaBackend: real GPUs through the CUDA driver API, loaded at run time.
//
// Nothing links libcuda: Create() loads "libcuda.so.1" (common/cuda_driver.h),
// so the daemon builds and starts anywhere, and on a machine without an
// NVIDIA driver Create() fails with one clear FAILED_PRECONDITION line
// instead of a loader error. Tests run it against tests/fake_cuda.
// Invariants: every new slab is zeroed before it is returned (the driver
// does not zero memory); slabs are admitted against what the driver has
// free, not the device's total; errors name the device and the call.
// Thread-safe: CreateSlab, slab methods and DriverMemory may run on any
// thread: each call pushes the device's primary context for its driver calls
// and pops it after, leaving the thread's own current context alone.
#ifndef GPUMEMD_SERVER_BACKEND_CUDA_BACKEND_H_
#define GPUMEMD_SERVER_BACKEND_CUDA_BACKEND_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "server/backend/backend.h"

namespace gpumem {

// Slabs, by HandleKind:
//  - kCudaVmmFd (the default): cuMemCreate with the POSIX fd handle type,
//    exported with cuMemExportToShareableHandle; clients import the fd.
//    Offered when every device reports POSIX fd handle support. Made
//    gpuDirectRDMACapable where the device supports GPUDirect RDMA with VMM
//    memory, so a NIC can register it.
//  - kCudaIpc (legacy): cuMemAlloc, with the 64 cuIpcGetMemHandle bytes, for
//    clients that need cudaIpcMemHandle_t.
// Sizes must be multiples of Granularity(device), the driver's minimum VMM
// granularity (cuMemGetAllocationGranularity); CreateSlab refuses others with
// INVALID_ARGUMENT. The daemon keeps each VMM slab mapped for its life, so
// Scrub is one cuMemsetD8 on that mapping, waited for (cuMemsetD8 returns
// before the bytes are written).
//
// Memory: slabs are admitted against what the driver has free (cuMemGetInfo,
// NewSlabRoom), not cuDeviceTotalMem: other processes and every context (the
// daemon's own included) hold memory the total does not show. The figure is
// learnt at start, around every slab created or released, and whenever
// DriverMemory is asked (GetStats).
//
// Errors name the device and the call: "device 0 (GPU-...): cuMemCreate:
// CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" as RESOURCE_EXHAUSTED; other
// driver errors are UNAVAILABLE (device lost) or INTERNAL (see
// common/cuda_driver.h).
class CudaBackend {
 public:
  // Loads the driver and enumerates devices. FAILED_PRECONDITION when the
  // driver library is missing, cuInit fails, there are no devices, or a
  // device lacks virtual memory management. Device UUIDs are nvidia-smi's
  // ("MIG-..." for a MIG instance). A device in EXCLUSIVE_PROCESS or
  // PROHIBITED compute mode is FAILED_PRECONDITION naming it: the daemon's
  // context would leave no room for its clients' (EXCLUSIVE_PROCESS admits
  // one process's context at a time), so lending its memory cannot work.
  // `library` is the name given to dlopen (tests pass a missing one).
  // `headroom`: each device's Headroom; unset for auto, which is what one
  // more context costs there (a context created and destroyed at start,
  // the driver's free memory read before and after; 512 MiB where the
  // driver cannot create one) plus 1/64 of the device, at least 64 MiB,
  // rounded up to the allocation granularity.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(
      const char* library = "libcuda.so.1", std::optional<uint64_t> headroom = std::nullopt);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_BACKEND_CUDA_BACKEND_H_
