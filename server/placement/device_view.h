// DeviceView: what placement knows about the devices at the moment it decides.
//
// Placement never talks to a backend or a pool itself. The caller hands it a
// DeviceSnapshot: every device of the daemon (index, UUID, load figures) and
// how devices reach each other. Resolution (resolve.h) reads the indices and
// UUIDs, policy ordering (policy_order.h) reads the loads and the peer
// distances. The figures are a snapshot: the carver (carver.h) has the last
// word on whether a block fits, so a snapshot that is slightly stale only
// changes the order devices are tried in, never correctness.
//
// Guarantees the caller gives:
//  - devices[i].index == i for every i (the backend numbers devices 0..N-1).
//  - peer(a, b) is defined for every pair of valid indices; a null `peer`
//    means every other device is reached through the host.
#ifndef GPUMEMD_SERVER_PLACEMENT_DEVICE_VIEW_H_
#define GPUMEMD_SERVER_PLACEMENT_DEVICE_VIEW_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpumem {
namespace placement {

// How one device reaches another; smaller is nearer. Same values as the
// backend's PeerLink (server/backend/backend.h), so a backend answer converts
// with a static_cast.
enum class PeerDistance : uint8_t { kSelf = 0, kNvLink = 1, kPcie = 2, kHost = 3 };

struct DeviceView {
  uint32_t index = 0;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  uint64_t total_bytes = 0;
  uint64_t used_bytes = 0;          // bytes in live blocks
  uint64_t free_bytes = 0;          // what is left to allocate
  uint64_t largest_free_bytes = 0;  // largest block carvable now
};

struct DeviceSnapshot {
  std::vector<DeviceView> devices;
  std::function<PeerDistance(uint32_t from, uint32_t to)> peer;

  // peer(from, to), kSelf when from == to, kHost when `peer` is null.
  PeerDistance Distance(uint32_t from, uint32_t to) const {
    if (from == to) return PeerDistance::kSelf;
    if (!peer) return PeerDistance::kHost;
    return peer(from, to);
  }
};

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_DEVICE_VIEW_H_
