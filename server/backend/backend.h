// Backend: the one interface between the daemon and the memory of real or
// simulated GPUs.
//
// A backend enumerates devices once, at start, and then makes slabs: large
// device allocations that the pool sub-allocates and that clients import as a
// whole. A slab is an RAII object: destroying it releases the device memory
// (clients that already imported it keep their mapping; the physical memory
// lives until the last importer lets go, as with CUDA VMM handles).
//
// Guarantees every backend gives:
//  - devices() is fixed for the backend's lifetime; indices are 0..N-1.
//  - CreateSlab never exceeds a device's total_bytes in live slabs: it fails
//    with RESOURCE_EXHAUSTED instead.
//  - A new slab reads as zeros.
//  - ExportFd returns a new fd each call (the caller owns and closes it).
//
// Implementations: sim_backend.h (memfd host memory), cuda_backend.h (driver
// API through dlopen).
#ifndef GPUMEMD_SERVER_BACKEND_BACKEND_H_
#define GPUMEMD_SERVER_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
// smaller values. Self < NvLink < Host.
enum class PeerLink : uint8_t { kSelf = 0, kNvLink = 1, kHost = 2 };

class Slab {
 public:
  virtual ~Slab() = default;
  virtual uint32_t device() const = 0;
  virtual uint64_t size() const = 0;
  // A new file descriptor for the slab's shareable handle; caller closes it.
  virtual absl::StatusOr<int> ExportFd() const = 0;
  // Zeroes [offset, offset + length).
  virtual absl::Status Scrub(uint64_t offset, uint64_t length) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual const std::vector<DeviceInfo>& devices() const = 0;
  // How device a reaches device b (both valid indices).
  virtual PeerLink Peer(uint32_t a, uint32_t b) const = 0;
  // A new slab of exactly `bytes` on `device`.
  virtual absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device,
                                                           uint64_t bytes) = 0;
  // Bytes in live slabs on `device`.
  virtual uint64_t SlabBytes(uint32_t device) const = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_BACKEND_BACKEND_H_
