// CudaDeviceContext: the device a slab lives on, in this process's numbering.
//
// The daemon names devices by UUID; under CUDA_VISIBLE_DEVICES this process
// may number them differently or not see some at all. Find() looks the UUID
// up among the devices the driver shows this process and retains that
// device's primary context (once per device, cached, kept for the process's
// life, like the runtime does). MakeCurrent() sets it on the calling thread; Write/Read copy with
// cuMemcpyHtoD/DtoH for the CUDA slab mappers.
#ifndef GPUMEMD_CLIENT_CUDA_DEVICE_CONTEXT_H_
#define GPUMEMD_CLIENT_CUDA_DEVICE_CONTEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/cuda_driver.h"

namespace gpumem {
namespace client {

struct CudaDeviceContext {
  int ordinal = -1;  // this process's device ordinal
  CUcontext ctx = nullptr;
  std::string uuid;

  // FAILED_PRECONDITION naming the UUID when this process cannot see it.
  static absl::StatusOr<CudaDeviceContext> Find(const CudaDriver& d,
                                                const std::string& uuid);
  absl::Status MakeCurrent(const CudaDriver& d) const;
  // Host <-> device copies into [base + offset, + n) of a slab of `size`
  // bytes, with this device current (OUT_OF_RANGE outside the slab).
  absl::Status Write(const CudaDriver& d, CUdeviceptr base, uint64_t size, uint64_t offset,
                     const void* src, uint64_t n) const;
  absl::Status Read(const CudaDriver& d, CUdeviceptr base, uint64_t size, uint64_t offset,
                    void* dst, uint64_t n) const;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_CUDA_DEVICE_CONTEXT_H_
