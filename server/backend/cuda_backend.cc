// The driver's entry points are resolved once into a table of function
// pointers whose types come from cuda.h (decltype of the declarations), so a
// signature mismatch is a compile error here, not a crash at run time.
#include "server/backend/cuda_backend.h"

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {
namespace {

struct Driver {
  void* lib = nullptr;
#define GPUMEM_CU_FN(name) decltype(&::name) name = nullptr;
  GPUMEM_CU_FN(cuInit)
  GPUMEM_CU_FN(cuGetErrorString)
  GPUMEM_CU_FN(cuDeviceGetCount)
  GPUMEM_CU_FN(cuDeviceGet)
  GPUMEM_CU_FN(cuDeviceGetName)
  GPUMEM_CU_FN(cuDeviceGetUuid_v2)
  GPUMEM_CU_FN(cuDeviceTotalMem_v2)
  GPUMEM_CU_FN(cuDeviceGetPCIBusId)
  GPUMEM_CU_FN(cuDeviceGetAttribute)
  GPUMEM_CU_FN(cuDeviceCanAccessPeer)
  GPUMEM_CU_FN(cuDevicePrimaryCtxRetain)
  GPUMEM_CU_FN(cuCtxSetCurrent)
  GPUMEM_CU_FN(cuMemGetAllocationGranularity)
  GPUMEM_CU_FN(cuMemCreate)
  GPUMEM_CU_FN(cuMemRelease)
  GPUMEM_CU_FN(cuMemExportToShareableHandle)
  GPUMEM_CU_FN(cuMemAddressReserve)
  GPUMEM_CU_FN(cuMemAddressFree)
  GPUMEM_CU_FN(cuMemMap)
  GPUMEM_CU_FN(cuMemUnmap)
  GPUMEM_CU_FN(cuMemSetAccess)
  GPUMEM_CU_FN(cuMemsetD8_v2)
  GPUMEM_CU_FN(cuCtxSynchronize)
#undef GPUMEM_CU_FN

  std::string Error(CUresult r) const {
    const char* s = nullptr;
    if (cuGetErrorString != nullptr) cuGetErrorString(r, &s);
    return s != nullptr ? absl::StrCat(s, " (", static_cast<int>(r), ")")
                        : absl::StrCat("CUDA error ", static_cast<int>(r));
  }
};

absl::Status Check(const Driver& d, CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", d.Error(r)));
  }
  return absl::InternalError(absl::StrCat(what, ": ", d.Error(r)));
}

CUmemAllocationProp SlabProp(int ordinal) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

class CudaBackendImpl;

class CudaSlab : public Slab {
 public:
  CudaSlab(const Driver* d, CUcontext ctx, uint32_t device, uint64_t size,
           CUmemGenericAllocationHandle h, std::atomic<uint64_t>* account)
      : d_(d), ctx_(ctx), device_(device), size_(size), handle_(h), account_(account) {}
  ~CudaSlab() override {
    d_->cuMemRelease(handle_);
    account_->fetch_sub(size_);
  }
  uint32_t device() const override { return device_; }
  uint64_t size() const override { return size_; }
  absl::StatusOr<int> ExportFd() const override {
    int fd = -1;
    absl::Status s = Check(*d_, d_->cuMemExportToShareableHandle(
        &fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
    if (!s.ok()) return s;
    return fd;
  }
  absl::Status Scrub(uint64_t offset, uint64_t length) override {
    if (offset > size_ || length > size_ - offset) {
      return absl::OutOfRangeError("scrub range outside the slab");
    }
    if (length == 0) return absl::OkStatus();
    absl::Status s = Check(*d_, d_->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    if (!s.ok()) return s;
    CUdeviceptr va = 0;
    s = Check(*d_, d_->cuMemAddressReserve(&va, size_, 0, 0, 0), "cuMemAddressReserve");
    if (!s.ok()) return s;
    s = Check(*d_, d_->cuMemMap(va, size_, 0, handle_, 0), "cuMemMap");
    if (s.ok()) {
      CUmemAccessDesc access = {};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = static_cast<int>(device_);
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      s = Check(*d_, d_->cuMemSetAccess(va, size_, &access, 1), "cuMemSetAccess");
      if (s.ok()) {
        s = Check(*d_, d_->cuMemsetD8_v2(va + offset, 0, length), "cuMemsetD8");
      }
      if (s.ok()) s = Check(*d_, d_->cuCtxSynchronize(), "cuCtxSynchronize");
      d_->cuMemUnmap(va, size_);
    }
    d_->cuMemAddressFree(va, size_);
    return s;
  }

 private:
  const Driver* d_;
  CUcontext ctx_;
  uint32_t device_;
  uint64_t size_;
  CUmemGenericAllocationHandle handle_;
  std::atomic<uint64_t>* account_;
};

class CudaBackendImpl : public Backend {
 public:
  CudaBackendImpl(Driver d, std::vector<DeviceInfo> devices,
                  std::vector<CUcontext> contexts, std::vector<PeerLink> peers)
      : d_(d),
        devices_(std::move(devices)),
        contexts_(std::move(contexts)),
        peers_(std::move(peers)),
        slab_bytes_(new std::atomic<uint64_t>[devices_.size()]) {
    for (size_t i = 0; i < devices_.size(); ++i) slab_bytes_[i] = 0;
  }
  const char* name() const override { return "cuda"; }
  const std::vector<DeviceInfo>& devices() const override { return devices_; }
  PeerLink Peer(uint32_t a, uint32_t b) const override {
    return peers_[a * devices_.size() + b];
  }
  uint64_t SlabBytes(uint32_t device) const override {
    return device < devices_.size() ? slab_bytes_[device].load() : 0;
  }
  absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device,
                                                   uint64_t bytes) override {
    if (device >= devices_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no device ", device));
    }
    std::atomic<uint64_t>& used = slab_bytes_[device];
    uint64_t cur = used.load();
    do {
      if (bytes > devices_[device].total_bytes - cur) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "device ", device, ": not enough capacity left for a slab"));
      }
    } while (!used.compare_exchange_weak(cur, cur + bytes));
    absl::Status s = Check(d_, d_.cuCtxSetCurrent(contexts_[device]), "cuCtxSetCurrent");
    CUmemGenericAllocationHandle h = 0;
    if (s.ok()) {
      CUmemAllocationProp prop = SlabProp(static_cast<int>(device));
      s = Check(d_, d_.cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate");
    }
    if (!s.ok()) {
      used.fetch_sub(bytes);
      return s;
    }
    return std::unique_ptr<Slab>(
        new CudaSlab(&d_, contexts_[device], device, bytes, h, &used));
  }

 private:
  Driver d_;
  std::vector<DeviceInfo> devices_;
  std::vector<CUcontext> contexts_;
  std::vector<PeerLink> peers_;
  std::unique_ptr<std::atomic<uint64_t>[]> slab_bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(const char* library) {
  Driver d;
  d.lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (d.lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: no NVIDIA driver on this machine (cannot load ", library,
        ": ", dlerror(), "); use --backend=sim to run without a GPU"));
  }
  bool missing = false;
  std::string missing_names;
#define GPUMEM_CU_LOAD(name)                                          \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(d.lib, #name));   \
  if (d.name == nullptr) {                                            \
    missing = true;                                                   \
    absl::StrAppend(&missing_names, " ", #name);                      \
  }
  GPUMEM_CU_LOAD(cuInit)
  GPUMEM_CU_LOAD(cuGetErrorString)
  GPUMEM_CU_LOAD(cuDeviceGetCount)
  GPUMEM_CU_LOAD(cuDeviceGet)
  GPUMEM_CU_LOAD(cuDeviceGetName)
  GPUMEM_CU_LOAD(cuDeviceGetUuid_v2)
  GPUMEM_CU_LOAD(cuDeviceTotalMem_v2)
  GPUMEM_CU_LOAD(cuDeviceGetPCIBusId)
  GPUMEM_CU_LOAD(cuDeviceGetAttribute)
  GPUMEM_CU_LOAD(cuDeviceCanAccessPeer)
  GPUMEM_CU_LOAD(cuDevicePrimaryCtxRetain)
  GPUMEM_CU_LOAD(cuCtxSetCurrent)
  GPUMEM_CU_LOAD(cuMemGetAllocationGranularity)
  GPUMEM_CU_LOAD(cuMemCreate)
  GPUMEM_CU_LOAD(cuMemRelease)
  GPUMEM_CU_LOAD(cuMemExportToShareableHandle)
  GPUMEM_CU_LOAD(cuMemAddressReserve)
  GPUMEM_CU_LOAD(cuMemAddressFree)
  GPUMEM_CU_LOAD(cuMemMap)
  GPUMEM_CU_LOAD(cuMemUnmap)
  GPUMEM_CU_LOAD(cuMemSetAccess)
  GPUMEM_CU_LOAD(cuMemsetD8_v2)
  GPUMEM_CU_LOAD(cuCtxSynchronize)
#undef GPUMEM_CU_LOAD
  if (missing) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: ", library, " lacks driver entry points (driver too old?):",
        missing_names));
  }
  CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: cuInit failed: ", d.Error(r),
        "; is the NVIDIA driver loaded and a GPU visible?"));
  }
  int count = 0;
  absl::Status s = Check(d, d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (!s.ok()) return s;
  if (count == 0) {
    return absl::FailedPreconditionError("cuda backend: the driver sees no GPU");
  }
  std::vector<DeviceInfo> devices;
  std::vector<CUcontext> contexts;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    s = Check(d, d.cuDeviceGet(&dev, i), "cuDeviceGet");
    if (!s.ok()) return s;
    DeviceInfo info;
    info.index = static_cast<uint32_t>(i);
    char name[256] = {};
    d.cuDeviceGetName(name, sizeof(name), dev);
    info.name = name;
    CUuuid uuid;
    s = Check(d, d.cuDeviceGetUuid_v2(&uuid, dev), "cuDeviceGetUuid");
    if (!s.ok()) return s;
    const unsigned char* u = reinterpret_cast<const unsigned char*>(uuid.bytes);
    info.uuid = absl::StrFormat(
        "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
        u[12], u[13], u[14], u[15]);
    size_t total = 0;
    s = Check(d, d.cuDeviceTotalMem_v2(&total, dev), "cuDeviceTotalMem");
    if (!s.ok()) return s;
    info.total_bytes = total;
    char bus[64] = {};
    d.cuDeviceGetPCIBusId(bus, sizeof(bus), dev);
    info.pci_bus_id = bus;
    int vmm = 0;
    d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    if (!vmm) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda backend: device ", i, " (", info.name,
          ") does not support virtual memory management"));
    }
    CUcontext ctx = nullptr;
    s = Check(d, d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    if (!s.ok()) return s;
    contexts.push_back(ctx);
    devices.push_back(info);
  }
  std::vector<PeerLink> peers(static_cast<size_t>(count) * count, PeerLink::kHost);
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      int can = 0;
      if (a == b) {
        peers[a * count + b] = PeerLink::kSelf;
      } else if (d.cuDeviceCanAccessPeer(&can, a, b) == CUDA_SUCCESS && can) {
        peers[a * count + b] = PeerLink::kNvLink;
      }
    }
  }
  return std::unique_ptr<Backend>(new CudaBackendImpl(
      d, std::move(devices), std::move(contexts), std::move(peers)));
}

}  // namespace gpumem
