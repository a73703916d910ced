// CudaDeviceContext: the device a slab lives on, in this process's numbering.
// The daemon names devices by UUID (nvidia-smi's spelling, "MIG-..." for MIG
// instances); this process may number them differently (CUDA_VISIBLE_DEVICES,
// CUDA_DEVICE_ORDER, a container's subset of the GPUs) or not see some at
// all. Invariants: the library runs on the application's threads, so it
// never changes what they have current: every driver call is made inside a
// ScopedCudaContext (push the device's context, pop it after); a device's
// primary context is retained once and kept for the process's life, like
// the runtime does.
#ifndef GPUMEMD_CLIENT_LIB_SLABS_CUDA_DEVICE_CONTEXT_H_
#define GPUMEMD_CLIENT_LIB_SLABS_CUDA_DEVICE_CONTEXT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda_driver.h"

namespace gpumem {
namespace client {

struct CudaDeviceContext {
  int ordinal = -1;  // this process's device ordinal
  CUcontext ctx = nullptr;
  std::string uuid;

  // Looks the UUID up among the devices the driver shows this process and
  // retains that device's primary context (once per device, cached).
  // FAILED_PRECONDITION naming the UUID when this process cannot see it, and
  // naming the compute mode when the device refuses this process a context.
  static absl::StatusOr<CudaDeviceContext> Find(const CudaDriver& d,
                                                const std::string& uuid);
  // The UUID of this process's device `ordinal` (cuDeviceGet, then its
  // UUID). INVALID_ARGUMENT naming the count when there is no such device.
  static absl::StatusOr<std::string> UuidOfOrdinal(const CudaDriver& d, int ordinal);

  // The UUIDs of the devices the driver shows this process, by ordinal
  // (after CUDA_VISIBLE_DEVICES and the container's GPUs); empty where no
  // driver can be used. Learnt on the first call and kept for the process's
  // life: the driver reads CUDA_VISIBLE_DEVICES once, at cuInit.
  static const std::vector<std::string>& VisibleUuids();

  // OK when `scope` made this device's context current.
  absl::Status Entered(const CudaDriver& d, const ScopedCudaContext& scope) const;
  // Host <-> device copies into [base + offset, + n) of a slab of `size`
  // bytes (OUT_OF_RANGE outside the slab); both have returned only once the
  // bytes are where they were copied to: a pageable cuMemcpyHtoD returns as
  // soon as they are staged, so Write synchronizes the NULL stream after it,
  // and another process may read them at once.
  absl::Status Write(const CudaDriver& d, CUdeviceptr base, uint64_t size, uint64_t offset,
                     const void* src, uint64_t n) const;
  absl::Status Read(const CudaDriver& d, CUdeviceptr base, uint64_t size, uint64_t offset,
                    void* dst, uint64_t n) const;
  // cuCtxSynchronize of the context, in RELAXED capture mode (so that it
  // invalidates no application capture); a capture's refusal is UNAVAILABLE.
  absl::Status Synchronize(const CudaDriver& d) const;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_SLABS_CUDA_DEVICE_CONTEXT_H_
