// SlabMapper: opens a daemon slab in this process, the way its HandleKind
// says, and gives the address of the slab's first byte. One interface, three
// implementations (one file each, see the New*SlabMapper functions).
//
// Invariants: Open either returns an OpenedSlab covering [0,
// slab_size_bytes) or leaves nothing behind (partial steps undone); an
// OpenedSlab closes the slab when destroyed; a retired slab's addresses are
// never handed out again while it lives. Caching and refcounting (one open
// per slab per process) are the caller's (gpumem::Client). Mappers and
// opened slabs may be used from any thread; the CUDA ones push the device's
// primary context for each driver call and pop it after, so the calling
// thread's current context is left as it was.
#ifndef GPUMEMD_CLIENT_LIB_SLABS_SLAB_MAPPER_H_
#define GPUMEMD_CLIENT_LIB_SLABS_SLAB_MAPPER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "common/fd_channel.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

class OpenedSlab {
 public:
  virtual ~OpenedSlab() = default;  // unmaps / closes
  // The slab's first byte in this process: host pointer (memfd) or device
  // pointer (CUDA).
  virtual char* base() const = 0;
  virtual uint64_t size() const = 0;
  // For memory that is gone (the daemon that lent it went away): unmaps and
  // releases it but keeps the address range reserved (the CUDA reservation,
  // or an inaccessible host mapping) until the object is destroyed, so the
  // range is never handed out again meanwhile and a stale pointer into it can
  // never reach someone else's memory. Write and Read fail afterwards
  // (FAILED_PRECONDITION).
  virtual void Retire() = 0;
  // Copies between host memory and [offset, offset + n) of the slab: memcpy
  // for memfd, cuMemcpyHtoD/DtoH for CUDA. OUT_OF_RANGE outside the slab.
  virtual absl::Status Write(uint64_t offset, const void* src, uint64_t n) = 0;
  virtual absl::Status Read(uint64_t offset, void* dst, uint64_t n) = 0;
  // The slab's handle (memfd, CUDA VMM fd), kept open for the slab's life
  // so that it can be given back to a restarted daemon that lacks it
  // (fd_channel.h, kGiveSlab); -1 for kinds without one (legacy IPC).
  virtual int handle_fd() const { return -1; }
  // Device memory, which work this process queued may still use after the
  // host lets go of it (CUDA); false for host memory (memfd).
  virtual bool on_device() const { return false; }
  // Blocks until all the work this process queued on the slab's device
  // (every stream of its primary context) before the call has completed:
  // cuCtxSynchronize. UNAVAILABLE when a stream capture refused it (nothing
  // was waited for: try later); the driver's error when the device failed
  // (nothing will run there any more). Host memory: OK at once.
  virtual absl::Status WaitForDeviceWork() { return absl::OkStatus(); }
};

// Gets a slab's fd from the daemon (the slab-handle channel); called at
// most once per Open, and only by the fd kinds. The opened slab keeps the
// fd (handle_fd()) and closes it when destroyed; a failed Open closes it.
using SlabFdSource = std::function<absl::StatusOr<SlabFd>()>;

class SlabMapper {
 public:
  virtual ~SlabMapper() = default;
  virtual v1::HandleKind kind() const = 0;
  // Opens the slab `allocation` lives in (its slab_id, slab_size_bytes,
  // device_uuid and, for legacy IPC, ipc_handle).
  virtual absl::StatusOr<std::unique_ptr<OpenedSlab>> Open(
      const v1::Allocation& allocation, const SlabFdSource& fetch_fd) = 0;
};

// The mapper for `kind`. The CUDA ones fail with FAILED_PRECONDITION when
// `cuda_library` cannot be loaded (no NVIDIA driver); UNIMPLEMENTED for
// kinds no mapper opens (fabric). The CUDA mappers load the driver with
// dlopen like the daemon, and pick the device by the allocation's UUID in
// this process's own numbering, so CUDA_VISIBLE_DEVICES may reorder or hide
// devices; a device this process cannot see is FAILED_PRECONDITION naming
// the UUID.
absl::StatusOr<std::unique_ptr<SlabMapper>> NewSlabMapper(
    v1::HandleKind kind, const char* cuda_library = "libcuda.so.1");

// HANDLE_KIND_MEMFD (sim backend): mmap of the slab's memfd; the address is
// a host pointer.
std::unique_ptr<SlabMapper> NewMmapSlabMapper();
// HANDLE_KIND_CUDA_VMM_FD: cuMemImportFromShareableHandle of the fd,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess; the address is a device
// pointer. Closing tears down in reverse: cuMemUnmap, cuMemAddressFree,
// cuMemRelease.
absl::StatusOr<std::unique_ptr<SlabMapper>> NewCudaVmmSlabMapper(const char* cuda_library);
// HANDLE_KIND_CUDA_IPC (legacy): cuIpcOpenMemHandle of the allocation's 64
// handle bytes; closing is cuIpcCloseMemHandle. The memory is the
// exporter's (the daemon's) and dies with it.
absl::StatusOr<std::unique_ptr<SlabMapper>> NewCudaIpcSlabMapper(const char* cuda_library);

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_SLABS_SLAB_MAPPER_H_
