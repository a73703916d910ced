// Backend: the one interface between the daemon and the memory of real or
// simulated GPUs. A backend enumerates devices once, at start, and then
// makes slabs: large device allocations that the pool sub-allocates and that
// clients import as a whole. A slab is an RAII object: destroying it
// releases the device memory (clients that already imported it keep their
// mapping; the physical memory lives until the last importer lets go, as
// with CUDA VMM handles).
//
// Invariants every backend keeps: devices() and handle_kinds() are fixed for
// its life; live slabs never exceed a device's total_bytes nor NewSlabRoom;
// a new slab reads as zeros; a slab is never silently smaller than asked;
// driver errors carry kDriverErrorPayload (common/driver_error.h), so the
// layers above can tell them from their own refusals. Implementations:
// sim_backend.h (memfd host memory), cuda_backend.h (driver API, dlopen).
#ifndef GPUMEMD_SERVER_BACKEND_BACKEND_H_
#define GPUMEMD_SERVER_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/driver_error.h"

namespace gpumem {

struct DeviceInfo {
  uint32_t index = 0;
  std::string uuid;         // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string name;         // product name
  std::string pci_bus_id;   // "0000:3b:00.0"
  int numa_node = -1;
  uint64_t total_bytes = 0;
};

// How two devices reach each other; the placement policy "near" prefers
// smaller values. Self < NvLink < Pcie (direct peer access over PCIe) <
// Host (no peer access: copies are staged through host memory).
enum class PeerLink : uint8_t { kSelf = 0, kNvLink = 1, kPcie = 2, kHost = 3 };

// How a client opens a slab (gpumem.v1.HandleKind says the same on the wire).
enum class HandleKind : uint8_t {
  kMemfd = 0,      // a memfd: mmap it (sim)
  kCudaVmmFd = 1,  // a CUDA VMM POSIX fd: cuMemImportFromShareableHandle + map
  kCudaIpc = 2,    // 64 cudaIpcMemHandle_t bytes: cuIpcOpenMemHandle
};
// "memfd", "cuda_vmm_fd", "cuda_ipc": the names of --handle_kinds.
const char* HandleKindName(HandleKind kind);
// Parses one of those names.
absl::StatusOr<HandleKind> ParseHandleKind(const std::string& name);
inline bool HandleKindUsesFd(HandleKind kind) { return kind != HandleKind::kCudaIpc; }
// A HandleKind as a persisted record stores it (state::SlabRecord::kind),
// and back: the one place that integer becomes a kind, nullopt for a value
// no kind has.
inline uint8_t HandleKindToRecord(HandleKind kind) { return static_cast<uint8_t>(kind); }
std::optional<HandleKind> HandleKindFromRecord(uint8_t value);

// What identifies a slab's handle, so that a handle met again after a
// restart (from systemd's fd store, or given back by a client) can be told
// to be that slab's: a memfd's inode and device numbers; zero where the
// backend has no such identity.
struct SlabIdentity {
  uint64_t ino = 0;
  uint64_t dev = 0;
};

// A device's memory as its driver reports it (cuMemGetInfo): includes what
// processes other than the daemon hold.
struct DriverMemInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

class Slab {
 public:
  virtual ~Slab() = default;
  virtual uint32_t device() const = 0;
  virtual uint64_t size() const = 0;
  virtual HandleKind handle_kind() const = 0;
  // A new file descriptor for the slab's shareable handle, each call; caller
  // closes it. FAILED_PRECONDITION for a slab of a kind without one.
  virtual absl::StatusOr<int> ExportFd() const = 0;
  // The legacy IPC handle bytes (CU_IPC_HANDLE_SIZE = 64) of a kCudaIpc slab;
  // FAILED_PRECONDITION for a slab of another kind.
  virtual absl::StatusOr<std::string> IpcHandle() const {
    return absl::FailedPreconditionError("this slab has no legacy IPC handle");
  }
  // Zeroes [offset, offset + length).
  virtual absl::Status Scrub(uint64_t offset, uint64_t length) = 0;
  // See SlabIdentity.
  virtual SlabIdentity Identity() const { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Fixed for the backend's lifetime; indices are 0..N-1.
  virtual const std::vector<DeviceInfo>& devices() const = 0;
  // How device a reaches device b (both valid indices).
  virtual PeerLink Peer(uint32_t a, uint32_t b) const = 0;
  // The kinds of slab this backend can make (fixed, non-empty); the first is
  // the default.
  virtual const std::vector<HandleKind>& handle_kinds() const = 0;
  // Slab sizes must be multiples of this (a power of two).
  virtual uint64_t Granularity(uint32_t device) const = 0;
  // A new slab of exactly `bytes` on `device`, opened the way `kind` says,
  // reading as zeros. RESOURCE_EXHAUSTED rather than exceed the device's
  // total_bytes in live slabs or what NewSlabRoom says it has left;
  // INVALID_ARGUMENT for a kind not in handle_kinds(). A size that is not a
  // multiple of Granularity(device) is refused or rounded up, never shrunk
  // (the pool only asks for multiples).
  virtual absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device, uint64_t bytes,
                                                           HandleKind kind) = 0;
  // The same, of the default kind.
  absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device, uint64_t bytes) {
    return CreateSlab(device, bytes, handle_kinds().front());
  }
  // Bytes in live slabs on `device`.
  virtual uint64_t SlabBytes(uint32_t device) const = 0;
  // A restart: the slab of `bytes` a previous daemon made on `device`, from
  // a handle it kept (`fd`, which the backend takes: it is closed on
  // failure), if the handle is that slab's (`identity`, as Slab::Identity()
  // gave it then). FAILED_PRECONDITION saying what does not match;
  // UNIMPLEMENTED for a kind whose memory does not outlive its exporter.
  virtual absl::StatusOr<std::unique_ptr<Slab>> AdoptSlab(uint32_t device, uint64_t bytes,
                                                          HandleKind kind, int fd,
                                                          const SlabIdentity& identity);
  // Bytes the device can still give to new slabs as far as the backend last
  // learnt, beyond the slabs it has: on cuda the driver's free memory (other
  // processes' use and every context's own cost taken out, which
  // total_bytes does not show). UINT64_MAX where total_bytes is the only
  // limit (sim). Cheap: callers hold locks.
  virtual uint64_t NewSlabRoom(uint32_t device) const {
    (void)device;
    return UINT64_MAX;
  }
  // Learns NewSlabRoom anew (other processes may have freed memory since);
  // may make a driver call, so callers hold no lock.
  virtual void RefreshNewSlabRoom(uint32_t device) { (void)device; }
  // Memory of the device kept free for other processes' contexts and
  // libraries (--device_headroom): NewSlabRoom leaves it out. 0 where no
  // other process uses the device (sim).
  virtual uint64_t Headroom(uint32_t device) const {
    (void)device;
    return 0;
  }
  // How far the driver's free memory, as last learnt, is below Headroom:
  // other processes have grown into it, and the pool gives empty slabs
  // back at once until it is whole again. Cheap: callers hold locks.
  virtual uint64_t HeadroomShortfall(uint32_t device) const {
    (void)device;
    return 0;
  }
  // How Headroom was chosen, for the start log ("" where it is 0 by nature).
  virtual std::string HeadroomOrigin(uint32_t device) const {
    (void)device;
    return "";
  }
  // The driver's own free/total figures; UNIMPLEMENTED where there is no
  // driver (sim).
  virtual absl::StatusOr<DriverMemInfo> DriverMemory(uint32_t device) const {
    (void)device;
    return absl::UnimplementedError("no driver figures for this backend");
  }
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_BACKEND_BACKEND_H_
