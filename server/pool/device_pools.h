// DevicePools: the slab pools of every device of a backend, and PoolCarver,
// placement's carver (server/placement/carver.h) over them. DevicePools
// owns one SlabPool per device (each with its own lock) and gives placement
// its view of them: a DeviceSnapshot with each device's load figures and the
// backend's peer matrix. Devices never change for the life of a backend, so
// the device list is fixed at construction.
#ifndef GPUMEMD_SERVER_POOL_DEVICE_POOLS_H_
#define GPUMEMD_SERVER_POOL_DEVICE_POOLS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/backend/backend.h"
#include "server/placement/carver.h"
#include "server/placement/device_view.h"
#include "server/pool/slab_pool.h"

namespace gpumem {

class DevicePools {
 public:
  // `backend` must outlive the pools.
  DevicePools(Backend* backend, const PoolOptions& options);
  DevicePools(const DevicePools&) = delete;
  DevicePools& operator=(const DevicePools&) = delete;

  size_t size() const { return pools_.size(); }
  SlabPool& pool(uint32_t device) { return *pools_[device]; }
  const SlabPool& pool(uint32_t device) const { return *pools_[device]; }
  Backend& backend() const { return *backend_; }

  // Each device's index, UUID and total (load figures zero): what request
  // checks (placement::PrepareRequest) need.
  const std::vector<placement::DeviceView>& views() const { return views_; }
  // The capacity of the largest device.
  uint64_t largest_device_bytes() const { return largest_device_bytes_; }
  // Every device with its load figures now, and the peer matrix.
  placement::DeviceSnapshot Snapshot() const;

  // The pool holding slab `slab_id` (carvable or retained), or null.
  SlabPool* PoolOfSlab(uint64_t slab_id);

  // Across every device:
  // SlabPool::SetBudget (before the pools are used).
  void SetBudget(SlabBudget* budget);
  absl::Status Reserve();
  void ReleaseIdleSlabs(absl::Time now);
  void SetEmptyReleaseAfter(absl::Duration after);
  void ForgetSession(uint64_t session);
  void ReleaseAll();
  // SlabPool::ReleaseTenantSlabs on every device.
  void ReleaseTenantSlabs(uint32_t tenant);

 private:
  Backend* const backend_;
  std::vector<std::unique_ptr<SlabPool>> pools_;
  std::vector<placement::DeviceView> views_;
  uint64_t largest_device_bytes_ = 0;
};

// PoolCarver serves one request: it carves blocks for one tenant in one
// handle kind, on whichever devices placement asks, and keeps each block
// pending until its caller takes the blocks (Take) or releases them
// (Release, through whatever adaptors are stacked on the carver, so that
// they undo their part too). Used by one thread at a time (one request).
class PoolCarver final : public placement::DeviceCarver {
 public:
  //  - kMayCallBackend: carving may create slabs (SlabPool::Carve).
  //  - kExistingSlabsOnly: carving never calls the backend
  //    (SlabPool::TryCarve). Where a device would need backend work,
  //    TryCarve fails placement with an UNAVAILABLE error that stops it
  //    (placement then releases what it carved), and needed_backend_work()
  //    turns true: the caller reads the fact from the carver, not from the
  //    error.
  enum class Mode { kMayCallBackend, kExistingSlabsOnly };

  PoolCarver(DevicePools* pools, uint32_t tenant, HandleKind kind, Mode mode)
      : pools_(pools), tenant_(tenant), kind_(kind), mode_(mode) {}
  PoolCarver(const PoolCarver&) = delete;
  PoolCarver& operator=(const PoolCarver&) = delete;

  absl::StatusOr<placement::CarvedBlock> TryCarve(uint32_t device, uint64_t size,
                                                  uint64_t alignment,
                                                  Refusal* refusal) override;
  void Release(const placement::CarvedBlock& block) override;

  // The pool block behind a carved block that is still pending.
  const PoolBlock& block(const placement::CarvedBlock& carved) const {
    return pending_.at(carved.id);
  }
  // Hands the pending blocks over to the caller (who releases them to their
  // pools from then on); nothing is pending after.
  void Take() { pending_.clear(); }
  // kExistingSlabsOnly: some device needed backend work (see Mode).
  bool needed_backend_work() const { return needed_backend_work_; }

 private:
  DevicePools* const pools_;
  const uint32_t tenant_;
  const HandleKind kind_;
  const Mode mode_;
  bool needed_backend_work_ = false;
  uint64_t next_key_ = 1;
  absl::flat_hash_map<uint64_t, PoolBlock> pending_;  // CarvedBlock.id -> block
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_DEVICE_POOLS_H_
