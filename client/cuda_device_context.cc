#include "client/cuda_device_context.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {
namespace client {

absl::StatusOr<CudaDeviceContext> CudaDeviceContext::Find(const CudaDriver& d,
                                                          const std::string& uuid) {
  // Found once per device per driver: the numbering never changes in a
  // process, and the primary context is retained once.
  static absl::Mutex mu(absl::kConstInit);
  static auto* found =
      new absl::flat_hash_map<std::pair<const CudaDriver*, std::string>, CudaDeviceContext>;
  absl::MutexLock lock(&mu);
  auto cached = found->find(std::make_pair(&d, uuid));
  if (cached != found->end()) return cached->second;
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
    found->emplace(std::make_pair(&d, uuid), out);
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

}  // namespace client
}  // namespace gpumem
