// The CUDA VMM mapper: import the slab's POSIX fd and map it on the slab's
// device (the one with the allocation's UUID, in this process's numbering).
// Open: import, reserve, map, set access; the slab's destructor undoes them
// in reverse. A failure part way undoes the steps already done. Access is
// given to the slab's device and every device of this process that can
// reach it as a peer. Retire
// unmaps and releases the memory but keeps the address reservation until
// the destructor. Every step runs inside a ScopedCudaContext of the device.
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/slabs/slab_mapper.h"

namespace gpumem {
namespace client {
namespace {

// `owner` and the ordinals of this process's devices that can access its
// memory as peers (cuDeviceCanAccessPeer), ascending.
std::vector<int> Reaching(const CudaDriver& d, int owner) {
  std::vector<int> out;
  int count = 0;
  CUdevice mine;
  if (d.cuDeviceGetCount(&count) != CUDA_SUCCESS || d.cuDeviceGet(&mine, owner) != CUDA_SUCCESS) {
    return {owner};
  }
  for (int i = 0; i < count; ++i) {
    CUdevice other;
    int can = 0;
    if (i == owner || (d.cuDeviceGet(&other, i) == CUDA_SUCCESS &&
                       d.cuDeviceCanAccessPeer(&can, other, mine) == CUDA_SUCCESS && can)) {
      out.push_back(i);
    }
  }
  return out;
}

class VmmSlab : public OpenedSlab {
 public:
  VmmSlab(const CudaDriver* d, CudaDeviceContext dev, uint64_t size)
      : d_(d), dev_(std::move(dev)), size_(size) {}
  ~VmmSlab() override {
    ScopedCudaContext scope(*d_, dev_.ctx);
    Unmap();
    if (va_ != 0) d_->cuMemAddressFree(va_, size_);
    if (fd_ >= 0) close(fd_);
  }
  int handle_fd() const override { return fd_; }
  char* base() const override { return reinterpret_cast<char*>(va_); }
  uint64_t size() const override { return size_; }
  void Retire() override {
    ScopedCudaContext scope(*d_, dev_.ctx);
    Unmap();
    retired_ = true;
    if (fd_ >= 0) close(fd_);  // nothing left to give back
    fd_ = -1;
  }
  absl::Status Write(uint64_t offset, const void* src, uint64_t n) override {
    if (retired_) return absl::FailedPreconditionError("the slab was retired");
    return dev_.Write(*d_, va_, size_, offset, src, n);
  }
  bool on_device() const override { return true; }
  absl::Status WaitForDeviceWork() override { return dev_.Synchronize(*d_); }
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) override {
    if (retired_) return absl::FailedPreconditionError("the slab was retired");
    return dev_.Read(*d_, va_, size_, offset, dst, n);
  }

  // Takes ownership of `fd`: kept for the slab's life (handle_fd()).
  absl::Status Open(int fd) {
    const std::string where = absl::StrCat("device ", dev_.uuid);
    ScopedCudaContext scope(*d_, dev_.ctx);
    absl::Status s = dev_.Entered(*d_, scope);
    if (s.ok()) {
      s = CudaStatus(*d_,
                     d_->cuMemImportFromShareableHandle(
                         &handle_, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     "cuMemImportFromShareableHandle", where);
    }
    fd_ = fd;  // the import holds the memory; the fd is kept to give back
    if (!s.ok()) return s;
    s = CudaStatus(*d_, d_->cuMemAddressReserve(&va_, size_, 0, 0, 0), "cuMemAddressReserve",
                   where);
    if (!s.ok()) return s;
    s = CudaStatus(*d_, d_->cuMemMap(va_, size_, 0, handle_, 0), "cuMemMap", where);
    if (!s.ok()) return s;
    mapped_ = true;
    // Its own device, and every device of this process that can reach it as
    // a peer: cuCtxEnablePeerAccess does not cover cuMemMap memory, so
    // without this a kernel or copy of another device faults on it.
    std::vector<CUmemAccessDesc> access;
    for (int ordinal : Reaching(*d_, dev_.ordinal)) {
      CUmemAccessDesc a = {};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = ordinal;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access.push_back(a);
    }
    return CudaStatus(*d_, d_->cuMemSetAccess(va_, size_, access.data(), access.size()),
                      "cuMemSetAccess", where);
  }

 private:
  // With the device's context current.
  void Unmap() {
    if (mapped_) d_->cuMemUnmap(va_, size_);
    mapped_ = false;
    if (handle_ != 0) d_->cuMemRelease(handle_);
    handle_ = 0;
  }

  const CudaDriver* d_;
  CudaDeviceContext dev_;
  uint64_t size_;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  bool mapped_ = false;
  bool retired_ = false;
  int fd_ = -1;
};

class CudaVmmSlabMapper : public SlabMapper {
 public:
  explicit CudaVmmSlabMapper(const CudaDriver* d) : d_(d) {}
  v1::HandleKind kind() const override { return v1::HANDLE_KIND_CUDA_VMM_FD; }
  absl::StatusOr<std::unique_ptr<OpenedSlab>> Open(const v1::Allocation& a,
                                                   const SlabFdSource& fetch_fd) override {
    absl::StatusOr<CudaDeviceContext> dev = CudaDeviceContext::Find(*d_, a.device_uuid());
    if (!dev.ok()) return dev.status();
    absl::StatusOr<SlabFd> slab = fetch_fd();
    if (!slab.ok()) return slab.status();
    if (slab->size != a.slab_size_bytes()) {
      close(slab->fd);
      return absl::InternalError(absl::StrCat("slab ", a.slab_id(), " is ", slab->size,
                                              " bytes, the allocation says ",
                                              a.slab_size_bytes()));
    }
    auto out = std::make_unique<VmmSlab>(d_, *std::move(dev), slab->size);
    absl::Status s = out->Open(slab->fd);
    if (!s.ok()) return s;  // `out` undoes what was done
    return std::unique_ptr<OpenedSlab>(std::move(out));
  }

 private:
  const CudaDriver* d_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SlabMapper>> NewCudaVmmSlabMapper(const char* cuda_library) {
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver(cuda_library);
  if (!d.ok()) {
    return absl::Status(d.status().code(), absl::StrCat("cannot open CUDA VMM slabs: ",
                                                        d.status().message()));
  }
  return std::unique_ptr<SlabMapper>(new CudaVmmSlabMapper(*d));
}

}  // namespace client
}  // namespace gpumem
