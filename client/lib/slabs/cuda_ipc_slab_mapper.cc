// The legacy IPC mapper: cuIpcOpenMemHandle of the slab's 64 handle bytes
// (from the allocation), inside a ScopedCudaContext of the slab's device;
// closed with cuIpcCloseMemHandle. The driver allows one open per handle per
// context, so the caller's per-slab cache matters here. The memory is the
// exporter's: Retire (its exporter is gone) keeps the handle open, which
// keeps the addresses, and closes it only in the destructor.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/slabs/slab_mapper.h"

namespace gpumem {
namespace client {
namespace {

class IpcSlab : public OpenedSlab {
 public:
  IpcSlab(const CudaDriver* d, CudaDeviceContext dev, CUdeviceptr base, uint64_t size)
      : d_(d), dev_(std::move(dev)), base_(base), size_(size) {}
  ~IpcSlab() override {
    ScopedCudaContext scope(*d_, dev_.ctx);
    if (scope.result() == CUDA_SUCCESS) d_->cuIpcCloseMemHandle(base_);
  }
  char* base() const override { return reinterpret_cast<char*>(base_); }
  uint64_t size() const override { return size_; }
  void Retire() override { retired_ = true; }
  absl::Status Write(uint64_t offset, const void* src, uint64_t n) override {
    if (retired_) return absl::FailedPreconditionError("the slab was retired");
    return dev_.Write(*d_, base_, size_, offset, src, n);
  }
  bool on_device() const override { return true; }
  absl::Status WaitForDeviceWork() override { return dev_.Synchronize(*d_); }
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) override {
    if (retired_) return absl::FailedPreconditionError("the slab was retired");
    return dev_.Read(*d_, base_, size_, offset, dst, n);
  }

 private:
  const CudaDriver* d_;
  CudaDeviceContext dev_;
  CUdeviceptr base_;
  uint64_t size_;
  bool retired_ = false;
};

class CudaIpcSlabMapper : public SlabMapper {
 public:
  explicit CudaIpcSlabMapper(const CudaDriver* d) : d_(d) {}
  v1::HandleKind kind() const override { return v1::HANDLE_KIND_CUDA_IPC; }
  absl::StatusOr<std::unique_ptr<OpenedSlab>> Open(const v1::Allocation& a,
                                                   const SlabFdSource&) override {
    CUipcMemHandle handle;
    if (a.ipc_handle().size() != sizeof(handle.reserved)) {
      return absl::InternalError(absl::StrCat(
          "allocation ", a.id(), " carries ", a.ipc_handle().size(),
          " IPC handle bytes, not ", sizeof(handle.reserved)));
    }
    std::memcpy(handle.reserved, a.ipc_handle().data(), sizeof(handle.reserved));
    absl::StatusOr<CudaDeviceContext> dev = CudaDeviceContext::Find(*d_, a.device_uuid());
    if (!dev.ok()) return dev.status();
    ScopedCudaContext scope(*d_, dev->ctx);
    absl::Status s = dev->Entered(*d_, scope);
    if (!s.ok()) return s;
    CUdeviceptr base = 0;
    s = CudaStatus(*d_,
                   d_->cuIpcOpenMemHandle_v2(&base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                   "cuIpcOpenMemHandle", absl::StrCat("device ", a.device_uuid()));
    if (!s.ok()) return s;
    return std::unique_ptr<OpenedSlab>(
        new IpcSlab(d_, *std::move(dev), base, a.slab_size_bytes()));
  }

 private:
  const CudaDriver* d_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SlabMapper>> NewCudaIpcSlabMapper(const char* cuda_library) {
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver(cuda_library);
  if (!d.ok()) {
    return absl::Status(d.status().code(), absl::StrCat("cannot open legacy CUDA IPC slabs: ",
                                                        d.status().message()));
  }
  return std::unique_ptr<SlabMapper>(new CudaIpcSlabMapper(*d));
}

}  // namespace client
}  // namespace gpumem
