// One table per library name, loaded once and never unloaded: the driver's
// state (contexts, mappings) lives as long as the process anyway.
#include "common/cuda_driver.h"

#include <dlfcn.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace gpumem {
namespace {

constexpr char kNoDriverPayload[] = "type.gpumem/no_cuda_driver";

absl::Status ForkedChildError(int parent_pid) {
  return absl::FailedPreconditionError(absl::StrCat(
      "this process (pid ", getpid(), ") was fork()ed from one that had initialised CUDA (pid ",
      parent_pid, "), and a fork()ed child cannot use CUDA (the driver answers "
      "CUDA_ERROR_NOT_INITIALIZED): start it with exec instead (for Python's multiprocessing, "
      "the 'spawn' start method), or fork before the parent first uses the GPU"));
}

}  // namespace

bool CudaDriverMissing(const absl::Status& status) {
  return status.GetPayload(kNoDriverPayload).has_value();
}

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
  if (it != loaded->end()) {
    if (it->second->init_pid != getpid()) return ForkedChildError(it->second->init_pid);
    return it->second.get();
  }
  auto d = std::make_unique<CudaDriver>();
  d->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (d->lib == nullptr) {
    absl::Status missing = absl::FailedPreconditionError(absl::StrCat(
        "no NVIDIA driver on this machine (cannot load ", library, ": ", dlerror(), ")"));
    missing.SetPayload(kNoDriverPayload, absl::Cord("1"));
    return missing;
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
  d->cuDeviceGetUuid_v1 =
      reinterpret_cast<decltype(d->cuDeviceGetUuid_v1)>(dlsym(d->lib, "cuDeviceGetUuid"));
  d->cuCtxCreate_v4 =
      reinterpret_cast<decltype(d->cuCtxCreate_v4)>(dlsym(d->lib, "cuCtxCreate_v4"));
  d->cuStreamGetCaptureInfo_v3 = reinterpret_cast<decltype(d->cuStreamGetCaptureInfo_v3)>(
      dlsym(d->lib, "cuStreamGetCaptureInfo_v3"));
  d->init_pid = getpid();
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
  if (r == CUDA_ERROR_NOT_INITIALIZED && driver.init_pid != 0 && driver.init_pid != getpid()) {
    absl::Status forked = ForkedChildError(driver.init_pid);
    absl::Status s(forked.code(), absl::StrCat(context, context.empty() ? "" : ": ", call, ": ",
                                               forked.message()));
    s.SetPayload(kDriverErrorPayload, absl::Cord(absl::StrCat(static_cast<int>(r))));
    return s;
  }
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

std::string FormatCudaUuid(const CUuuid& uuid, bool mig) {
  const unsigned char* u = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return absl::StrFormat(
      "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
      mig ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
      u[11], u[12], u[13], u[14], u[15]);
}

absl::StatusOr<std::string> CudaDeviceUuid(const CudaDriver& driver, CUdevice dev) {
  CUuuid v2;
  absl::Status s = CudaStatus(driver, driver.cuDeviceGetUuid_v2(&v2, dev), "cuDeviceGetUuid_v2",
                              absl::StrCat("device ", dev));
  if (!s.ok()) return s;
  // A MIG instance: _v2 names the instance, the first version the GPU; or
  // its name carries the profile (where the first version is missing or
  // fails, the name alone decides).
  char name[256] = {};
  bool mig = driver.cuDeviceGetName(name, sizeof(name) - 1, dev) == CUDA_SUCCESS &&
             IsMigProfileName(name);
  CUuuid v1;
  if (!mig && driver.cuDeviceGetUuid_v1 != nullptr &&
      driver.cuDeviceGetUuid_v1(&v1, dev) == CUDA_SUCCESS) {
    mig = std::memcmp(v1.bytes, v2.bytes, sizeof(v2.bytes)) != 0;
  }
  return FormatCudaUuid(v2, mig);
}

bool IsMigProfileName(absl::string_view name) {
  const size_t at = name.find(" MIG ");
  if (at == absl::string_view::npos) return false;
  absl::string_view p = name.substr(at + 5);
  auto digits = [&p] {
    size_t n = 0;
    while (n < p.size() && absl::ascii_isdigit(static_cast<unsigned char>(p[n]))) ++n;
    p.remove_prefix(n);
    return n > 0;
  };
  return digits() && absl::ConsumePrefix(&p, "g.") && digits() &&
         absl::StartsWithIgnoreCase(p, "gb");
}

bool SameCudaUuid(absl::string_view a, absl::string_view b) {
  return absl::EqualsIgnoreCase(a, b);
}

ScopedCudaContext::ScopedCudaContext(const CudaDriver& driver, CUcontext ctx)
    : driver_(driver), pushed_(driver.cuCtxPushCurrent_v2(ctx)) {
  exchanged_ = driver.cuThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
}

ScopedCudaContext::~ScopedCudaContext() {
  if (exchanged_) driver_.cuThreadExchangeStreamCaptureMode(&mode_);
  if (pushed_ != CUDA_SUCCESS) return;
  CUcontext popped = nullptr;
  driver_.cuCtxPopCurrent_v2(&popped);
}

}  // namespace gpumem
