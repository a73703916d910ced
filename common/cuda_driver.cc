// One table per library name, loaded once and never unloaded: the driver's
// state (contexts, mappings) lives as long as the process anyway.
#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace gpumem {

std::string CudaDriver::ErrorText(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName != nullptr) cuGetErrorName(r, &name);
  if (cuGetErrorString != nullptr) cuGetErrorString(r, &text);
  return absl::StrCat(name != nullptr ? name : "CUDA error", " (", static_cast<int>(r),
                      ")", text != nullptr ? absl::StrCat(": ", text) : "");
}

absl::StatusOr<const CudaDriver*> LoadCudaDriver(const char* library) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, std::unique_ptr<CudaDriver>>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded->find(library);
  if (it != loaded->end()) return it->second.get();
  auto d = std::make_unique<CudaDriver>();
  d->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (d->lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no NVIDIA driver on this machine (cannot load ", library, ": ", dlerror(), ")"));
  }
  std::string missing;
#define GPUMEM_CUDA_DRIVER_LOAD(name)                                    \
  d->name = reinterpret_cast<decltype(d->name)>(dlsym(d->lib, #name));   \
  if (d->name == nullptr) absl::StrAppend(&missing, " ", #name);
  GPUMEM_CUDA_DRIVER_FUNCTIONS(GPUMEM_CUDA_DRIVER_LOAD)
#undef GPUMEM_CUDA_DRIVER_LOAD
  if (!missing.empty()) {
    dlclose(d->lib);
    return absl::FailedPreconditionError(absl::StrCat(
        library, " lacks driver entry points (driver too old?):", missing));
  }
  CUresult r = d->cuInit(0);
  if (r != CUDA_SUCCESS) {
    std::string text = d->ErrorText(r);
    dlclose(d->lib);
    return absl::FailedPreconditionError(absl::StrCat(
        "cuInit failed: ", text, "; is the NVIDIA driver loaded and a GPU visible?"));
  }
  const CudaDriver* out = d.get();
  loaded->emplace(library, std::move(d));
  return out;
}

absl::Status CudaStatus(const CudaDriver& driver, CUresult r, absl::string_view call,
                        absl::string_view context) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(context, context.empty() ? "" : ": ", call, ": ",
                                     driver.ErrorText(r));
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  absl::Status s(code, message);
  s.SetPayload(kDriverErrorPayload, absl::Cord(absl::StrCat(static_cast<int>(r))));
  return s;
}

CUresult CudaErrorOf(const absl::Status& status) {
  auto p = status.GetPayload(kDriverErrorPayload);
  if (!p.has_value()) return CUDA_SUCCESS;
  int v = 0;
  if (!absl::SimpleAtoi(std::string(*p), &v)) return CUDA_ERROR_UNKNOWN;
  return static_cast<CUresult>(v);
}

std::string FormatCudaUuid(const CUuuid& uuid) {
  const unsigned char* u = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
      u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
      u[14], u[15]);
}

ScopedCudaContext::ScopedCudaContext(const CudaDriver& driver, CUcontext ctx)
    : driver_(driver), pushed_(driver.cuCtxPushCurrent_v2(ctx)) {}

ScopedCudaContext::~ScopedCudaContext() {
  if (pushed_ != CUDA_SUCCESS) return;
  CUcontext popped = nullptr;
  driver_.cuCtxPopCurrent_v2(&popped);
}

}  // namespace gpumem
