// Each device's primary context is retained once at start. Every backend
// call that needs a context pushes the device's own onto the calling thread
// and pops it when done (ScopedCudaContext), whatever thread it runs on (the
// broker's, a backend worker, the slab channel's listener) and whatever that
// thread had current.
#include "server/backend/cuda_backend.h"

#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/cuda_driver.h"

namespace gpumem {
namespace {

struct Device {
  DeviceInfo info;
  CUcontext ctx = nullptr;
  uint64_t granularity = 0;
  std::string context;  // "device 0 (GPU-...)", for error messages
  bool rdma = false;            // slabs made gpuDirectRDMACapable
  uint64_t headroom = 0;       // kept free for other processes
  std::string headroom_origin;  // how it was chosen
};

constexpr uint64_t kMiB = uint64_t{1} << 20;
// When the driver cannot make a context to measure: about an H100's.
constexpr uint64_t kUnmeasuredContext = 512 * kMiB;

// What one more context costs on `dev`: the driver's free memory with the
// primary context current, then with a context of its own (created and
// destroyed here). 0 when the driver cannot create one.
uint64_t MeasureContext(const CudaDriver& d, CUdevice dev, CUcontext primary) {
  if (d.cuCtxCreate_v4 == nullptr) return 0;
  size_t before = 0, after = 0, total = 0;
  {
    ScopedCudaContext scope(d, primary);
    if (scope.result() != CUDA_SUCCESS || d.cuMemGetInfo_v2(&before, &total) != CUDA_SUCCESS) {
      return 0;
    }
  }
  CUctxCreateParams params = {};
  CUcontext extra = nullptr;
  if (d.cuCtxCreate_v4(&extra, &params, 0, dev) != CUDA_SUCCESS) return 0;
  const bool read = d.cuMemGetInfo_v2(&after, &total) == CUDA_SUCCESS;
  d.cuCtxDestroy_v2(extra);  // current to this thread: popped too
  return read && before > after ? before - after : 0;
}

// The driver's free memory on a device, learnt after every change the
// backend makes there and whenever its figures are asked for.
struct Room {
  std::atomic<uint64_t> bytes{UINT64_MAX};
  void Refresh(const CudaDriver& d, const Device& dev);
};

class CudaSlabBase : public Slab {
 public:
  CudaSlabBase(const CudaDriver* d, const Device* dev, uint64_t size,
               std::atomic<uint64_t>* account, Room* room)
      : d_(d), dev_(dev), size_(size), account_(account), room_(room) {}
  // Runs after the subclass gave the memory back.
  ~CudaSlabBase() override {
    account_->fetch_sub(size_);
    room_->Refresh(*d_, *dev_);
  }
  uint32_t device() const override { return dev_->info.index; }
  uint64_t size() const override { return size_; }

  absl::Status Scrub(uint64_t offset, uint64_t length) override {
    if (offset > size_ || length > size_ - offset) {
      return absl::OutOfRangeError("scrub range outside the slab");
    }
    if (length == 0) return absl::OkStatus();
    ScopedCudaContext scope(*d_, dev_->ctx);
    absl::Status s = Call(scope.result(), "cuCtxPushCurrent");
    // cuMemsetD8 returns before the bytes are zero: wait for them.
    if (s.ok()) s = Call(d_->cuMemsetD8_v2(base_ + offset, 0, length), "cuMemsetD8");
    if (s.ok()) s = Call(d_->cuCtxSynchronize(), "cuCtxSynchronize");
    return s;
  }

 protected:
  absl::Status Call(CUresult r, const char* what) const {
    return CudaStatus(*d_, r, what, dev_->context);
  }
  const CudaDriver* d_;
  const Device* dev_;
  uint64_t size_;
  std::atomic<uint64_t>* account_;
  Room* room_;
  CUdeviceptr base_ = 0;  // the daemon's own mapping of the whole slab
};

void Room::Refresh(const CudaDriver& d, const Device& dev) {
  ScopedCudaContext scope(d, dev.ctx);
  size_t free = 0, total = 0;
  if (scope.result() == CUDA_SUCCESS && d.cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS) {
    bytes.store(free);
  }
}

// cuMemCreate memory, mapped into the daemon at [base_, base_ + size_).
class VmmSlab : public CudaSlabBase {
 public:
  using CudaSlabBase::CudaSlabBase;
  ~VmmSlab() override {
    ScopedCudaContext scope(*d_, dev_->ctx);
    if (mapped_) d_->cuMemUnmap(base_, size_);
    if (base_ != 0) d_->cuMemAddressFree(base_, size_);
    if (handle_ != 0) d_->cuMemRelease(handle_);
  }
  HandleKind handle_kind() const override { return HandleKind::kCudaVmmFd; }

  absl::Status Init() {
    ScopedCudaContext scope(*d_, dev_->ctx);
    absl::Status s = Call(scope.result(), "cuCtxPushCurrent");
    if (!s.ok()) return s;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = static_cast<int>(dev_->info.index);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // So a NIC can register it (NCCL user buffers, UCX, NIXL: ibv_reg_mr on
    // the mapping, or its dma-buf).
    if (dev_->rdma) prop.allocFlags.gpuDirectRDMACapable = 1;
    CUmemGenericAllocationHandle h = 0;
    s = Call(d_->cuMemCreate(&h, size_, &prop, 0), "cuMemCreate");
    if (!s.ok()) return s;
    handle_ = h;
    s = Call(d_->cuMemAddressReserve(&base_, size_, 0, 0, 0), "cuMemAddressReserve");
    if (!s.ok()) return s;
    s = Call(d_->cuMemMap(base_, size_, 0, handle_, 0), "cuMemMap");
    if (!s.ok()) return s;
    mapped_ = true;
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = static_cast<int>(dev_->info.index);
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    s = Call(d_->cuMemSetAccess(base_, size_, &access, 1), "cuMemSetAccess");
    if (!s.ok()) return s;
    return Scrub(0, size_);
  }

  // A restart: the memory a previous daemon made, from the fd it exported
  // (taken: closed here). Its bytes are live blocks: nothing is scrubbed.
  absl::Status Adopt(int fd) {
    ScopedCudaContext scope(*d_, dev_->ctx);
    absl::Status s = Call(scope.result(), "cuCtxPushCurrent");
    CUmemGenericAllocationHandle h = 0;
    if (s.ok()) {
      s = Call(d_->cuMemImportFromShareableHandle(
                   &h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               "cuMemImportFromShareableHandle");
    }
    close(fd);  // the import holds the memory now
    if (!s.ok()) return s;
    handle_ = h;
    CUmemAllocationProp prop = {};
    s = Call(d_->cuMemGetAllocationPropertiesFromHandle(&prop, h),
             "cuMemGetAllocationPropertiesFromHandle");
    if (!s.ok()) return s;
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop.location.id != static_cast<int>(dev_->info.index)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the handle is memory of device ", prop.location.id, ", not of ", dev_->context));
    }
    s = Call(d_->cuMemAddressReserve(&base_, size_, 0, 0, 0), "cuMemAddressReserve");
    if (!s.ok()) return s;
    // Fails if the memory is smaller than the slab was.
    s = Call(d_->cuMemMap(base_, size_, 0, handle_, 0), "cuMemMap");
    if (!s.ok()) return s;
    mapped_ = true;
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = static_cast<int>(dev_->info.index);
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return Call(d_->cuMemSetAccess(base_, size_, &access, 1), "cuMemSetAccess");
  }

  absl::StatusOr<int> ExportFd() const override {
    ScopedCudaContext scope(*d_, dev_->ctx);
    absl::Status s = Call(scope.result(), "cuCtxPushCurrent");
    if (!s.ok()) return s;
    int fd = -1;
    s = Call(d_->cuMemExportToShareableHandle(
                              &fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                          "cuMemExportToShareableHandle");
    if (!s.ok()) return s;
    return fd;
  }

 private:
  CUmemGenericAllocationHandle handle_ = 0;
  bool mapped_ = false;
};

// cuMemAlloc memory with a legacy IPC handle.
class IpcSlab : public CudaSlabBase {
 public:
  using CudaSlabBase::CudaSlabBase;
  ~IpcSlab() override {
    ScopedCudaContext scope(*d_, dev_->ctx);
    if (base_ != 0 && scope.result() == CUDA_SUCCESS) d_->cuMemFree_v2(base_);
  }
  HandleKind handle_kind() const override { return HandleKind::kCudaIpc; }

  absl::Status Init() {
    ScopedCudaContext scope(*d_, dev_->ctx);
    absl::Status s = Call(scope.result(), "cuCtxPushCurrent");
    if (!s.ok()) return s;
    s = Call(d_->cuMemAlloc_v2(&base_, size_), "cuMemAlloc");
    if (!s.ok()) return s;
    CUipcMemHandle h;
    s = Call(d_->cuIpcGetMemHandle(&h, base_), "cuIpcGetMemHandle");
    if (!s.ok()) return s;
    handle_.assign(h.reserved, sizeof(h.reserved));
    return Scrub(0, size_);
  }

  absl::StatusOr<int> ExportFd() const override {
    return absl::FailedPreconditionError(
        "a legacy IPC slab has no fd; its handle bytes come with the allocation");
  }
  absl::StatusOr<std::string> IpcHandle() const override { return handle_; }

 private:
  std::string handle_;
};

class CudaBackendImpl : public Backend {
 public:
  CudaBackendImpl(const CudaDriver* d, std::vector<Device> devices,
                  std::vector<PeerLink> peers, std::vector<HandleKind> kinds)
      : d_(d),
        devices_(std::move(devices)),
        peers_(std::move(peers)),
        kinds_(std::move(kinds)),
        slab_bytes_(new std::atomic<uint64_t>[devices_.size()]),
        room_(new Room[devices_.size()]) {
    for (size_t i = 0; i < devices_.size(); ++i) {
      slab_bytes_[i] = 0;
      infos_.push_back(devices_[i].info);
      room_[i].Refresh(*d_, devices_[i]);
    }
  }
  const char* name() const override { return "cuda"; }
  const std::vector<DeviceInfo>& devices() const override { return infos_; }
  PeerLink Peer(uint32_t a, uint32_t b) const override {
    return peers_[a * devices_.size() + b];
  }
  const std::vector<HandleKind>& handle_kinds() const override { return kinds_; }
  uint64_t Granularity(uint32_t device) const override {
    return device < devices_.size() ? devices_[device].granularity : 1;
  }
  uint64_t SlabBytes(uint32_t device) const override {
    return device < devices_.size() ? slab_bytes_[device].load() : 0;
  }
  uint64_t NewSlabRoom(uint32_t device) const override {
    if (device >= devices_.size()) return 0;
    const uint64_t free = room_[device].bytes.load();
    return free > devices_[device].headroom ? free - devices_[device].headroom : 0;
  }
  uint64_t Headroom(uint32_t device) const override {
    return device < devices_.size() ? devices_[device].headroom : 0;
  }
  uint64_t HeadroomShortfall(uint32_t device) const override {
    if (device >= devices_.size()) return 0;
    const uint64_t free = room_[device].bytes.load();
    return free < devices_[device].headroom ? devices_[device].headroom - free : 0;
  }
  std::string HeadroomOrigin(uint32_t device) const override {
    return device < devices_.size() ? devices_[device].headroom_origin : "";
  }
  void RefreshNewSlabRoom(uint32_t device) override {
    if (device < devices_.size()) room_[device].Refresh(*d_, devices_[device]);
  }

  absl::StatusOr<DriverMemInfo> DriverMemory(uint32_t device) const override {
    if (device >= devices_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no device ", device));
    }
    const Device& dev = devices_[device];
    ScopedCudaContext scope(*d_, dev.ctx);
    absl::Status s = CudaStatus(*d_, scope.result(), "cuCtxPushCurrent", dev.context);
    if (!s.ok()) return s;
    size_t free = 0, total = 0;
    s = CudaStatus(*d_, d_->cuMemGetInfo_v2(&free, &total), "cuMemGetInfo", dev.context);
    if (!s.ok()) return s;
    room_[device].bytes.store(free);
    return DriverMemInfo{free, total};
  }

  using Backend::CreateSlab;
  absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device, uint64_t bytes,
                                                   HandleKind kind) override {
    if (device >= devices_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no device ", device));
    }
    const Device& dev = devices_[device];
    if (std::find(kinds_.begin(), kinds_.end(), kind) == kinds_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          dev.context, ": the cuda backend cannot make ", HandleKindName(kind), " slabs"));
    }
    if (bytes == 0 || bytes % dev.granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          dev.context, ": slab size ", bytes, " is not a positive multiple of the ",
          "device's allocation granularity ", dev.granularity));
    }
    std::atomic<uint64_t>& used = slab_bytes_[device];
    uint64_t cur = used.load();
    do {
      if (bytes > dev.info.total_bytes - cur) {
        return absl::ResourceExhaustedError(absl::StrCat(
            dev.context, " has ", FormatBytes(dev.info.total_bytes - cur),
            " left for slabs, ", FormatBytes(bytes), " asked"));
      }
    } while (!used.compare_exchange_weak(cur, cur + bytes));
    // From here the slab's destructor gives the bytes back, also on failure.
    // What the driver has free, not cuDeviceTotalMem, is what a new slab can
    // have: other processes and every context (the daemon's own too) hold
    // memory that total does not show.
    // And the headroom stays free for other processes' contexts.
    Room& room = room_[device];
    room.Refresh(*d_, dev);
    const uint64_t free = room.bytes.load();
    if (bytes > free || free - bytes < dev.headroom) {
      used.fetch_sub(bytes);
      return absl::ResourceExhaustedError(absl::StrCat(
          dev.context, ": the driver has ", FormatBytes(free), " free of ",
          FormatBytes(dev.info.total_bytes), " (other processes and contexts hold the rest)",
          dev.headroom > 0
              ? absl::StrCat(", ", FormatBytes(dev.headroom),
                             " of it kept for other processes' CUDA contexts and libraries "
                             "(--device_headroom)")
              : "",
          "; ", FormatBytes(bytes), " asked"));
    }
    absl::Status s;
    std::unique_ptr<Slab> slab;
    if (kind == HandleKind::kCudaIpc) {
      auto ipc = std::make_unique<IpcSlab>(d_, &dev, bytes, &used, &room);
      s = ipc->Init();
      slab = std::move(ipc);
    } else {
      auto vmm = std::make_unique<VmmSlab>(d_, &dev, bytes, &used, &room);
      s = vmm->Init();
      slab = std::move(vmm);
    }
    room.Refresh(*d_, dev);
    if (!s.ok()) return s;
    return slab;
  }

  // A VMM slab of a previous daemon, from its kept fd. What can be checked
  // of such a handle is its device and that it covers the slab's size (the
  // core accepts one only from the fd store, or from a client the slab was
  // given to); legacy IPC memory died with the daemon that made it.
  absl::StatusOr<std::unique_ptr<Slab>> AdoptSlab(uint32_t device, uint64_t bytes,
                                                  HandleKind kind, int fd,
                                                  const SlabIdentity& identity) override {
    (void)identity;
    if (device >= devices_.size() || kind != HandleKind::kCudaVmmFd) {
      close(fd);
      if (device >= devices_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("no device ", device));
      }
      return absl::UnimplementedError(absl::StrCat(
          HandleKindName(kind), " memory does not outlive the daemon that made it"));
    }
    const Device& dev = devices_[device];
    if (bytes == 0 || bytes % dev.granularity != 0) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(
          dev.context, ": slab size ", bytes, " is not a multiple of the granularity"));
    }
    std::atomic<uint64_t>& used = slab_bytes_[device];
    used.fetch_add(bytes);  // given back by the slab's destructor, also on failure
    auto vmm = std::make_unique<VmmSlab>(d_, &dev, bytes, &used, &room_[device]);
    absl::Status s = vmm->Adopt(fd);
    if (!s.ok()) return s;
    return std::unique_ptr<Slab>(std::move(vmm));
  }

 private:
  const CudaDriver* d_;
  std::vector<Device> devices_;
  std::vector<DeviceInfo> infos_;
  std::vector<PeerLink> peers_;
  std::vector<HandleKind> kinds_;
  std::unique_ptr<std::atomic<uint64_t>[]> slab_bytes_;
  std::unique_ptr<Room[]> room_;
};

const char* ComputeModeName(int mode) {
  return mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS ? "EXCLUSIVE_PROCESS"
         : mode == CU_COMPUTEMODE_PROHIBITED     ? "PROHIBITED"
                                                  : "DEFAULT";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(const char* library,
                                                            std::optional<uint64_t> headroom) {
  absl::StatusOr<const CudaDriver*> loaded = LoadCudaDriver(library);
  if (!loaded.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: ", loaded.status().message(),
        "; use --backend=sim to run without a GPU"));
  }
  const CudaDriver& d = **loaded;
  int count = 0;
  absl::Status s = CudaStatus(d, d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (!s.ok()) return s;
  if (count == 0) {
    return absl::FailedPreconditionError("cuda backend: the driver sees no GPU");
  }
  std::vector<Device> devices;
  std::vector<std::string> bad_modes;
  bool all_fd = true;
  for (int i = 0; i < count; ++i) {
    const std::string where = absl::StrCat("device ", i);
    CUdevice dev;
    s = CudaStatus(d, d.cuDeviceGet(&dev, i), "cuDeviceGet", where);
    if (!s.ok()) return s;
    Device device;
    DeviceInfo& info = device.info;
    info.index = static_cast<uint32_t>(i);
    char name[256] = {};
    d.cuDeviceGetName(name, sizeof(name), dev);
    info.name = name;
    // "MIG-..." for a MIG instance, as nvidia-smi and CUDA_VISIBLE_DEVICES
    // name it.
    absl::StatusOr<std::string> uuid = CudaDeviceUuid(d, dev);
    if (!uuid.ok()) return uuid.status();
    info.uuid = *uuid;
    device.context = absl::StrCat("device ", i, " (", info.uuid, ")");
    size_t total = 0;
    s = CudaStatus(d, d.cuDeviceTotalMem_v2(&total, dev), "cuDeviceTotalMem",
                   device.context);
    if (!s.ok()) return s;
    info.total_bytes = total;
    char bus[64] = {};
    d.cuDeviceGetPCIBusId(bus, sizeof(bus), dev);
    info.pci_bus_id = bus;
    int vmm = 0, fd = 0;
    d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    if (!vmm) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda backend: ", device.context, " (", info.name,
          ") does not support virtual memory management"));
    }
    d.cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           dev);
    all_fd = all_fd && fd != 0;
    int rdma = 0;
    d.cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                           dev);
    device.rdma = rdma != 0;
    // The daemon's own context is one more on every device: a device that
    // admits one process's context (EXCLUSIVE_PROCESS) would refuse every
    // client the daemon lends its memory to, and PROHIBITED admits none.
    int mode = CU_COMPUTEMODE_DEFAULT;
    d.cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev);
    if (mode != CU_COMPUTEMODE_DEFAULT) {
      bad_modes.push_back(absl::StrCat(device.context, " [", info.pci_bus_id, "] is in ",
                                       ComputeModeName(mode), " compute mode"));
      continue;
    }
    s = CudaStatus(d, d.cuDevicePrimaryCtxRetain(&device.ctx, dev),
                   "cuDevicePrimaryCtxRetain", device.context);
    if (!s.ok()) return s;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = i;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    s = CudaStatus(d, d.cuMemGetAllocationGranularity(&granularity, &prop,
                                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity", device.context);
    if (!s.ok()) return s;
    if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda backend: ", device.context, " reports allocation granularity ",
          granularity, ", not a power of two"));
    }
    device.granularity = granularity;
    if (headroom.has_value()) {
      device.headroom = *headroom;
      if (*headroom > 0) device.headroom_origin = "--device_headroom";
    } else {
      const uint64_t context = MeasureContext(d, dev, device.ctx);
      const uint64_t libraries = std::max(64 * kMiB, info.total_bytes / 64);
      device.headroom = (context > 0 ? context : kUnmeasuredContext) + libraries;
      device.headroom_origin = absl::StrCat(
          "auto: ", context > 0 ? "a context measured at " : "a context assumed at ",
          FormatBytes(context > 0 ? context : kUnmeasuredContext), " + ",
          FormatBytes(libraries), " for libraries");
    }
    device.headroom = (device.headroom + granularity - 1) / granularity * granularity;
    devices.push_back(std::move(device));
  }
  if (!bad_modes.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: ", absl::StrJoin(bad_modes, "; "),
        ": a shared pool needs the daemon's context and every client's on each device "
        "(EXCLUSIVE_PROCESS admits one process, PROHIBITED none); set the DEFAULT mode "
        "(nvidia-smi -i <bus id> -c DEFAULT) or hide the device from gpumemd "
        "(CUDA_VISIBLE_DEVICES)"));
  }
  std::vector<PeerLink> peers(static_cast<size_t>(count) * count, PeerLink::kHost);
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      int can = 0;
      if (a == b) {
        peers[a * count + b] = PeerLink::kSelf;
      } else if (d.cuDeviceCanAccessPeer(&can, a, b) == CUDA_SUCCESS && can) {
        // The driver does not name the link; native atomics over it are
        // NVLink's (PCIe peer access has none). Unknown counts as PCIe.
        int atomics = 0;
        const bool nvlink =
            d.cuDeviceGetP2PAttribute(&atomics, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                                      a, b) == CUDA_SUCCESS &&
            atomics != 0;
        peers[a * count + b] = nvlink ? PeerLink::kNvLink : PeerLink::kPcie;
      }
    }
  }
  std::vector<HandleKind> kinds;
  if (all_fd) kinds.push_back(HandleKind::kCudaVmmFd);
  kinds.push_back(HandleKind::kCudaIpc);
  return std::unique_ptr<Backend>(
      new CudaBackendImpl(&d, std::move(devices), std::move(peers), std::move(kinds)));
}

}  // namespace gpumem
