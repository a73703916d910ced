// ReservingCarver: a DeviceCarver adaptor (RMM style, like the quota
// adaptor) for fair waiting: while a waiting request reserves
// (server/admission/admission.h), requests behind it in serving order carve
// through this adaptor, which keeps for it the room that frees up on the
// devices it may use. Invariants: a carve that would lessen what the
// reserving tenant can reach below the reserved block is undone and
// refused; devices the reservation does not name are not affected, so
// smaller requests go on being served elsewhere (backfill); two requests
// carving at once can only both be refused, never both let past it.
#ifndef GPUMEMD_SERVER_POOL_RESERVING_CARVER_H_
#define GPUMEMD_SERVER_POOL_RESERVING_CARVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/placement/carver.h"
#include "server/pool/device_pools.h"

namespace gpumem {

// The room a reserving request keeps: a block of `bytes` for `tenant` in
// slabs of `kind` on one of `devices`; `what` names it in refusals.
struct ReservedRoom {
  uint32_t tenant = 0;
  HandleKind kind = HandleKind::kMemfd;
  std::vector<uint32_t> devices;
  uint64_t bytes = 0;
  std::string what;
};

// The bytes on `pool`'s device that `tenant` could ever get while other
// tenants keep what they hold: the device's total minus the slabs of other
// tenants that hold a live block, are retained, or were given to a live
// session (their empty, unheld slabs could be given back, and unowned
// reserved slabs serve anyone). Computed from SlabPool::Stats and Slabs.
uint64_t RoomBesideOthers(const SlabPool& pool, uint32_t tenant);

// The devices of `devices` where a block of `bytes` could fit beside other
// tenants' holdings (RoomBesideOthers >= bytes), in the order given. A
// reservation is made only there: holding room on a device where other
// tenants' blocks leave too little for the reserving request would refuse
// them for nothing.
std::vector<uint32_t> DevicesThatCouldHold(const DevicePools& pools, uint32_t tenant,
                                           const std::vector<uint32_t>& devices,
                                           uint64_t bytes);

class ReservingCarver : public placement::DeviceCarver {
 public:
  // `inner` and `pools` must outlive the adaptor.
  ReservingCarver(placement::DeviceCarver* inner, const DevicePools* pools, ReservedRoom room)
      : inner_(inner), pools_(pools), room_(std::move(room)) {}

  // On a device the reservation names, the carve is kept if afterwards the
  // reserving tenant can still get a block of the reserved size there
  // (SlabPool::LargestReachable), or if it did not lessen what that tenant
  // can reach (memory the reserving request could not use: the carving
  // tenant's own slab, say). Otherwise it is undone and refused as
  // capacity, with the reservation named in the refusal's detail. The check
  // is made after carving, against the pool as it is then.
  absl::StatusOr<placement::CarvedBlock> TryCarve(uint32_t device, uint64_t size,
                                                  uint64_t alignment,
                                                  Refusal* refusal) override;
  void Release(const placement::CarvedBlock& block) override { inner_->Release(block); }

  // Carves this adaptor refused (tests, counters).
  uint64_t refused() const { return refused_; }

 private:
  placement::DeviceCarver* inner_;
  const DevicePools* pools_;
  const ReservedRoom room_;
  uint64_t refused_ = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_RESERVING_CARVER_H_
