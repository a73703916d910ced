#include "server/pool/reserving_carver.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {

uint64_t RoomBesideOthers(const SlabPool& pool, uint32_t tenant) {
  const uint64_t total = pool.Stats().total_bytes;
  uint64_t others = 0;
  for (const SlabStats& s : pool.Slabs()) {
    if (s.tenant == tenant || s.tenant == kNoTenant) continue;
    const bool held = s.retained || s.live_blocks > 0 || s.holders > 0;
    if (held) others += s.size;
  }
  return total > others ? total - others : 0;
}

std::vector<uint32_t> DevicesThatCouldHold(const DevicePools& pools, uint32_t tenant,
                                           const std::vector<uint32_t>& devices,
                                           uint64_t bytes) {
  std::vector<uint32_t> out;
  for (uint32_t d : devices) {
    if (d < pools.size() && RoomBesideOthers(pools.pool(d), tenant) >= bytes) out.push_back(d);
  }
  return out;
}

absl::StatusOr<placement::CarvedBlock> ReservingCarver::TryCarve(
    uint32_t device, uint64_t size, uint64_t alignment, Refusal* refusal) {
  const bool reserved =
      std::find(room_.devices.begin(), room_.devices.end(), device) != room_.devices.end();
  if (!reserved || device >= pools_->size()) {
    return inner_->TryCarve(device, size, alignment, refusal);
  }
  const SlabPool& pool = pools_->pool(device);
  const uint64_t before = pool.LargestReachable(room_.tenant, room_.kind);
  absl::StatusOr<placement::CarvedBlock> block =
      inner_->TryCarve(device, size, alignment, refusal);
  if (!block.ok()) return block;
  const uint64_t after = pool.LargestReachable(room_.tenant, room_.kind);
  if (after >= room_.bytes || after >= before) return block;
  inner_->Release(*block);
  ++refused_;
  refusal->refused = true;
  refusal->reason = RefusalReason::kCapacity;
  refusal->device = device;
  refusal->asked_bytes = size;
  refusal->free_bytes = before >= room_.bytes ? before - room_.bytes : 0;
  refusal->largest_free_bytes = refusal->free_bytes;
  refusal->detail = absl::StrCat("held for ", room_.what, ", which waits for ",
                                 FormatBytes(room_.bytes), " here and is served first");
  refusal->message = refusal->detail;
  return absl::ResourceExhaustedError(refusal->message);
}

}  // namespace gpumem
