// CudaDriver: the CUDA driver API, loaded at run time with dlopen.
//
// Neither the daemon nor the client library links libcuda: both resolve the
// entry points they use into one table of function pointers, whose types
// come from cuda.h (decltype of the declarations), so a signature mismatch is
// a compile error, not a crash. A machine without the NVIDIA driver gets a
// FAILED_PRECONDITION that says so instead of a loader error. Driver errors
// become statuses that name the call and say what the caller can do
// (CudaStatus).
#ifndef GPUMEMD_COMMON_CUDA_DRIVER_H_
#define GPUMEMD_COMMON_CUDA_DRIVER_H_

#include <cuda.h>

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/driver_error.h"

namespace gpumem {

struct CudaDriver {
  void* lib = nullptr;
#define GPUMEM_CUDA_DRIVER_FUNCTIONS(X)                                     \
  X(cuInit) X(cuGetErrorString) X(cuGetErrorName) X(cuDeviceGetCount)       \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetUuid_v2)                   \
  X(cuDeviceTotalMem_v2) X(cuDeviceGetPCIBusId) X(cuDeviceGetAttribute)     \
  X(cuDeviceCanAccessPeer) X(cuDeviceGetP2PAttribute)                       \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2)               \
  X(cuCtxSetCurrent) X(cuCtxGetCurrent)                                     \
  X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxSynchronize)          \
  X(cuMemGetInfo_v2) X(cuMemGetAllocationGranularity)                       \
  X(cuMemCreate) X(cuMemRelease) X(cuMemExportToShareableHandle)            \
  X(cuMemImportFromShareableHandle) X(cuMemAddressReserve)                  \
  X(cuMemGetAllocationPropertiesFromHandle)                                 \
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)           \
  X(cuMemsetD8_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemAlloc_v2)   \
  X(cuMemFree_v2) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2)             \
  X(cuIpcCloseMemHandle) X(cuStreamCreate) X(cuStreamDestroy_v2)            \
  X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent)              \
  X(cuLaunchHostFunc) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)     \
  X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuMemsetD8Async)             \
  X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2) X(cuCtxDestroy_v2)      \
  X(cuMemGetAccess) X(cuMemcpyDtoD_v2) X(cuThreadExchangeStreamCaptureMode)  \
  X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuStreamIsCapturing)    \
  X(cuUserObjectCreate) X(cuUserObjectRelease) X(cuGraphRetainUserObject)     \
  X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy)       \
  X(cuGraphDestroy) X(cuMemGetHandleForAddressRange)
#define GPUMEM_CUDA_DRIVER_FIELD(name) decltype(&::name) name = nullptr;
  GPUMEM_CUDA_DRIVER_FUNCTIONS(GPUMEM_CUDA_DRIVER_FIELD)
#undef GPUMEM_CUDA_DRIVER_FIELD
  // The first cuDeviceGetUuid (cuda.h now maps the name to _v2): for a MIG
  // device it gives the GPU's UUID where _v2 gives the instance's. Optional
  // (null when the library lacks it).
  CUresult (*cuDeviceGetUuid_v1)(CUuuid*, CUdevice) = nullptr;
  // cuCtxCreate (drivers of CUDA 12.5 and later): a context of one's own
  // beside the primary one. Optional (null when the library lacks it).
  decltype(&::cuCtxCreate_v4) cuCtxCreate_v4 = nullptr;
  // The graph a stream is capturing into (drivers of CUDA 12.3 and later).
  // Optional (null when the library lacks it).
  decltype(&::cuStreamGetCaptureInfo_v3) cuStreamGetCaptureInfo_v3 = nullptr;
  // The process that called cuInit; another pid is a fork() child.
  int init_pid = 0;

  // "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
  std::string ErrorText(CUresult r) const;
};

// dlopens `library`, resolves every entry point and calls cuInit(0).
// FAILED_PRECONDITION when the library is missing (CudaDriverMissing says
// so), lacks an entry point or cuInit fails, or in a fork() child of a
// process that loaded it. The table stays valid for the process's life (the
// library is never closed).
absl::StatusOr<const CudaDriver*> LoadCudaDriver(const char* library = "libcuda.so.1");

// True for LoadCudaDriver's answer on a machine without the library (no
// NVIDIA driver at all), as opposed to one that has it but cannot use it.
bool CudaDriverMissing(const absl::Status& status);

// OK for CUDA_SUCCESS; otherwise "<context>: <call>: <error text>" (the
// context e.g. the device; the text the driver's error name and text), with
// a code that says what the caller can do:
//   CUDA_ERROR_OUT_OF_MEMORY                        -> RESOURCE_EXHAUSTED
//   device gone or unusable (DEVICE_UNAVAILABLE, ECC_UNCORRECTABLE,
//   NOT_INITIALIZED, DEINITIALIZED, NO_DEVICE, ...) -> UNAVAILABLE
//   anything else                                   -> INTERNAL
// and kDriverErrorPayload (common/driver_error.h; the CUresult in decimal),
// so layers above can tell a driver's refusal from their own.
// fork(): a child fork()ed after its parent initialised CUDA cannot use it
// (the driver answers CUDA_ERROR_NOT_INITIALIZED there); that error there is
// FAILED_PRECONDITION saying so and what to do instead, never "device
// unavailable" (as is LoadCudaDriver in such a child).
absl::Status CudaStatus(const CudaDriver& driver, CUresult r, absl::string_view call,
                        absl::string_view context = "");

// The CUresult carried by a status CudaStatus made, or CUDA_SUCCESS.
CUresult CudaErrorOf(const absl::Status& status);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" ("MIG-..." for a MIG
// instance), as nvidia-smi and CUDA_VISIBLE_DEVICES spell it.
std::string FormatCudaUuid(const CUuuid& uuid, bool mig = false);

// Device `dev`'s UUID as nvidia-smi prints it: "MIG-..." when it is a MIG
// instance. Two signals, either one enough: cuDeviceGetUuid_v2 and the
// first cuDeviceGetUuid differ (the first names the GPU the instance lives
// on: the reason _v2 was added in CUDA 11.4), or the device's name carries
// a MIG profile (IsMigProfileName), as the driver names instances.
absl::StatusOr<std::string> CudaDeviceUuid(const CudaDriver& driver, CUdevice dev);

// Does a device name (cuDeviceGetName) end in a MIG profile, as the driver
// names a MIG instance: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H100 80GB
// HBM3 MIG 3g.40gb", "... MIG 1g.10gb+me"? " MIG ", then <n>g.<m>gb.
bool IsMigProfileName(absl::string_view name);

// The same UUID spelled either way ("GPU-"/"MIG-" prefix and case aside
// from the hex digits' case).
bool SameCudaUuid(absl::string_view a, absl::string_view b);

// Makes `ctx` the calling thread's current context for the life of the
// object and then gives the thread back the context it had (the driver's
// context stack: cuCtxPushCurrent / cuCtxPopCurrent), so code that runs on
// an application's threads leaves the application's context alone. For the
// same life the thread's stream capture mode is RELAXED (then given back):
// the calls made inside never invalidate a graph capture in progress on
// another thread, or on this one (PyTorch's allocator does the same around
// cudaMalloc).
class ScopedCudaContext {
 public:
  ScopedCudaContext(const CudaDriver& driver, CUcontext ctx);
  ~ScopedCudaContext();
  ScopedCudaContext(const ScopedCudaContext&) = delete;
  ScopedCudaContext& operator=(const ScopedCudaContext&) = delete;
  // CUDA_SUCCESS when `ctx` is current now (the push worked).
  CUresult result() const { return pushed_; }

 private:
  const CudaDriver& driver_;
  CUresult pushed_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_CUDA_DRIVER_H_
