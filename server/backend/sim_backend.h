// SimBackend: simulated GPUs whose memory is real shared host memory.
//
// Each simulated device has a capacity, a stable UUID derived from its index
// and capacity, a fake PCI bus id and a peer-link matrix (every pair goes
// through the host unless a topology says otherwise, see sim_topology.h).
// A slab is a memfd of exactly the slab's size (HandleKind::kMemfd, the only
// kind it makes; no driver figures): sparse (pages cost RAM only once
// touched), reading as zeros when new, and shared with clients by passing
// its fd, so the bytes a client writes are really seen by every other
// importer. Invariants: every slab's memfd is sealed (F_SEAL_SHRINK |
// F_SEAL_GROW | F_SEAL_SEAL) before it is handed out, so whoever holds its
// fd can map and write it but cannot change its size (ftruncate and growing
// fallocate fail with EPERM) nor add seals. Thread-safe: CreateSlab and
// slab destruction may run on any thread.
#ifndef GPUMEMD_SERVER_BACKEND_SIM_BACKEND_H_
#define GPUMEMD_SERVER_BACKEND_SIM_BACKEND_H_

#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "server/backend/backend.h"

namespace gpumem {

class SimBackend : public Backend {
 public:
  // `links`: a device_count^2 matrix from ParseSimTopology; empty means
  // every pair goes through the host.
  explicit SimBackend(const std::vector<uint64_t>& device_bytes,
                      std::vector<PeerLink> links = {});
  ~SimBackend() override;

  const char* name() const override { return "sim"; }
  const std::vector<DeviceInfo>& devices() const override { return devices_; }
  PeerLink Peer(uint32_t a, uint32_t b) const override;
  const std::vector<HandleKind>& handle_kinds() const override;
  // Page size: memfds take any multiple of it. (The pool's own granularity
  // option, 2 MiB by default like CUDA VMM, is the larger and wins.)
  uint64_t Granularity(uint32_t) const override { return 4096; }
  using Backend::CreateSlab;
  absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device, uint64_t bytes,
                                                   HandleKind kind) override;
  uint64_t SlabBytes(uint32_t device) const override;
  // A memfd outlives the daemon while anything holds it (systemd's fd
  // store, a client), so a restarted daemon takes its slabs back, sealed as
  // they were made. The memfd of a slab a previous daemon made: checked to
  // be a memfd of `bytes` whose inode is `identity`'s (so a client cannot pass off another
  // file as a slab), and counted against the device like a new slab.
  absl::StatusOr<std::unique_ptr<Slab>> AdoptSlab(uint32_t device, uint64_t bytes,
                                                  HandleKind kind, int fd,
                                                  const SlabIdentity& identity) override;

  // Simulates a slow driver: CreateSlab on `device` sleeps `delay` first.
  // Call before the backend is shared between threads.
  void SetCreateDelay(uint32_t device, absl::Duration delay);

 private:
  class SimSlab;  // its Scrub punches the range out (zeros; RAM given back)
  std::vector<DeviceInfo> devices_;
  std::vector<PeerLink> links_;  // [a * n + b], always n * n
  // Bytes in live slabs per device; a slab's destructor gives its bytes back.
  std::unique_ptr<std::atomic<uint64_t>[]> slab_bytes_;
  std::vector<absl::Duration> create_delay_;  // per device; zero: none
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_BACKEND_SIM_BACKEND_H_
