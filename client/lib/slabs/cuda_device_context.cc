#include "client/lib/slabs/cuda_device_context.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {
namespace client {
namespace {

std::string ComputeModeName(int mode) {
  switch (mode) {
    case CU_COMPUTEMODE_EXCLUSIVE_PROCESS: return "EXCLUSIVE_PROCESS";
    case CU_COMPUTEMODE_PROHIBITED: return "PROHIBITED";
    default: return "DEFAULT";
  }
}

}  // namespace

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
    if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    absl::StatusOr<std::string> mine = CudaDeviceUuid(d, dev);
    if (!mine.ok() || !SameCudaUuid(*mine, uuid)) continue;
    CudaDeviceContext out;
    out.ordinal = i;
    out.uuid = uuid;
    CUresult r = d.cuDevicePrimaryCtxRetain(&out.ctx, dev);
    if (r != CUDA_SUCCESS) {
      int mode = CU_COMPUTEMODE_DEFAULT;
      d.cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev);
      if (mode != CU_COMPUTEMODE_DEFAULT) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", uuid, " is in ", ComputeModeName(mode), " compute mode: ",
            mode == CU_COMPUTEMODE_PROHIBITED
                ? "no process may have a context on it"
                : "only one process at a time may have a context on it, and another has",
            " (", d.ErrorText(r), "); its memory can be used only in the DEFAULT mode "
            "(nvidia-smi -c DEFAULT)"));
      }
      return CudaStatus(d, r, "cuDevicePrimaryCtxRetain", absl::StrCat("device ", uuid));
    }
    found->emplace(std::make_pair(&d, uuid), out);
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", uuid, " is not visible to this process (", count,
      " visible; check CUDA_VISIBLE_DEVICES and the container's GPUs)"));
}

absl::StatusOr<std::string> CudaDeviceContext::UuidOfOrdinal(const CudaDriver& d,
                                                             int ordinal) {
  int count = 0;
  absl::Status s = CudaStatus(d, d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (!s.ok()) return s;
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", ordinal, " does not exist: this process has ", count, " CUDA device",
        count == 1 ? "" : "s", " (after CUDA_VISIBLE_DEVICES)"));
  }
  CUdevice dev;
  s = CudaStatus(d, d.cuDeviceGet(&dev, ordinal), "cuDeviceGet", absl::StrCat("device ", ordinal));
  if (!s.ok()) return s;
  return CudaDeviceUuid(d, dev);
}

const std::vector<std::string>& CudaDeviceContext::VisibleUuids() {
  static const std::vector<std::string>* uuids = [] {
    auto* out = new std::vector<std::string>();
    absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
    int count = 0;
    if (!d.ok() || (*d)->cuDeviceGetCount(&count) != CUDA_SUCCESS) return out;
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<std::string> uuid = UuidOfOrdinal(**d, i);
      if (uuid.ok()) out->push_back(*std::move(uuid));
    }
    return out;
  }();
  return *uuids;
}

absl::Status CudaDeviceContext::Entered(const CudaDriver& d,
                                        const ScopedCudaContext& scope) const {
  return CudaStatus(d, scope.result(), "cuCtxPushCurrent", absl::StrCat("device ", uuid));
}

absl::Status CudaDeviceContext::Write(const CudaDriver& d, CUdeviceptr base, uint64_t size,
                                      uint64_t offset, const void* src, uint64_t n) const {
  if (offset > size || n > size - offset) return absl::OutOfRangeError("outside the slab");
  ScopedCudaContext scope(d, ctx);
  absl::Status s = Entered(d, scope);
  if (!s.ok()) return s;
  const std::string where = absl::StrCat("device ", uuid);
  s = CudaStatus(d, d.cuMemcpyHtoD_v2(base + offset, src, n), "cuMemcpyHtoD", where);
  if (!s.ok()) return s;
  // From pageable memory the copy returns once the bytes are staged; they
  // are on the device when the NULL stream has drained.
  return CudaStatus(d, d.cuStreamSynchronize(nullptr), "cuStreamSynchronize", where);
}

absl::Status CudaDeviceContext::Synchronize(const CudaDriver& d) const {
  ScopedCudaContext scope(d, ctx);
  absl::Status s = Entered(d, scope);
  if (!s.ok()) return s;
  const CUresult r = d.cuCtxSynchronize();
  if (r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
    return absl::UnavailableError(absl::StrCat("device ", uuid, ": a stream capture is under way"));
  }
  return CudaStatus(d, r, "cuCtxSynchronize", absl::StrCat("device ", uuid));
}

absl::Status CudaDeviceContext::Read(const CudaDriver& d, CUdeviceptr base, uint64_t size,
                                     uint64_t offset, void* dst, uint64_t n) const {
  if (offset > size || n > size - offset) return absl::OutOfRangeError("outside the slab");
  ScopedCudaContext scope(d, ctx);
  absl::Status s = Entered(d, scope);
  if (!s.ok()) return s;
  return CudaStatus(d, d.cuMemcpyDtoH_v2(dst, base + offset, n), "cuMemcpyDtoH",
                    absl::StrCat("device ", uuid));
}

}  // namespace client
}  // namespace gpumem
