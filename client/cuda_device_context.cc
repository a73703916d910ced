#include "client/cuda_device_context.h"

#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<CudaDeviceContext> CudaDeviceContext::Find(const CudaDriver& d,
                                                          const std::string& uuid) {
  int count = 0;
  absl::Status s = CudaStatus(d, d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (!s.ok()) return s;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    CUuuid u;
    if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS || d.cuDeviceGetUuid_v2(&u, dev) != CUDA_SUCCESS) {
      continue;
    }
    if (FormatCudaUuid(u) != uuid) continue;
    CudaDeviceContext out;
    out.ordinal = i;
    out.uuid = uuid;
    s = CudaStatus(d, d.cuDevicePrimaryCtxRetain(&out.ctx, dev), "cuDevicePrimaryCtxRetain",
                   absl::StrCat("device ", uuid));
    if (!s.ok()) return s;
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", uuid, " is not visible to this process (", count,
      " visible; check CUDA_VISIBLE_DEVICES)"));
}

absl::Status CudaDeviceContext::MakeCurrent(const CudaDriver& d) const {
  return CudaStatus(d, d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent", absl::StrCat("device ", uuid));
}

absl::Status CudaDeviceContext::Write(const CudaDriver& d, CUdeviceptr base, uint64_t size,
                                      uint64_t offset, const void* src, uint64_t n) const {
  if (offset > size || n > size - offset) return absl::OutOfRangeError("outside the slab");
  absl::Status s = MakeCurrent(d);
  if (!s.ok()) return s;
  return CudaStatus(d, d.cuMemcpyHtoD_v2(base + offset, src, n), "cuMemcpyHtoD",
                    absl::StrCat("device ", uuid));
}

absl::Status CudaDeviceContext::Read(const CudaDriver& d, CUdeviceptr base, uint64_t size,
                                     uint64_t offset, void* dst, uint64_t n) const {
  if (offset > size || n > size - offset) return absl::OutOfRangeError("outside the slab");
  absl::Status s = MakeCurrent(d);
  if (!s.ok()) return s;
  return CudaStatus(d, d.cuMemcpyDtoH_v2(dst, base + offset, n), "cuMemcpyDtoH",
                    absl::StrCat("device ", uuid));
}

}  // namespace gpumem
