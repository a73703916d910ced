// FakeCarver: a DeviceCarver over a model of per-device pools, for tests.
//
// Each device has a capacity and a set of live blocks (offset -> size) that
// really tracks what was carved: TryCarve is first-fit over the free ranges
// with alignment, Release removes the exact block. "Pinned" blocks placed at
// construction model memory used by others (and so fragmentation). An
// optional per-device quota refuses blocks beyond it with kQuota; a "broken"
// device answers INTERNAL. Every TryCarve is logged, so tests can check that
// placement never touched a device it should not have.
#ifndef GPUMEMD_TESTS_PLACEMENT_FAKE_CARVER_H_
#define GPUMEMD_TESTS_PLACEMENT_FAKE_CARVER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "server/placement/carver.h"
#include "server/placement/device_view.h"

namespace gpumem {
namespace placement {
namespace testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// 0-1 and 2-3 are NVLink pairs; everything else goes through the host.
inline PeerDistance Pairs(uint32_t a, uint32_t b) {
  if (a == b) return PeerDistance::kSelf;
  return a / 2 == b / 2 ? PeerDistance::kNvLink : PeerDistance::kHost;
}

struct FakeDeviceSpec {
  uint64_t total = 0;
  // Blocks already in use, as (offset, size); they must not overlap.
  std::vector<std::pair<uint64_t, uint64_t>> pinned;
  uint64_t quota = std::numeric_limits<uint64_t>::max();
  bool broken = false;
};

// A device with `used` bytes pinned at offset 0 (no fragmentation).
inline FakeDeviceSpec Used(uint64_t total, uint64_t used) {
  FakeDeviceSpec spec;
  spec.total = total;
  if (used > 0) spec.pinned.push_back({0, used});
  return spec;
}

inline std::string FakeUuid(uint32_t index) {
  return absl::StrFormat("GPU-%08x-aaaa-bbbb-cccc-%012x", 0x5f1c0000u + index,
                         index);
}

class FakeCarver : public DeviceCarver {
 public:
  struct Device {
    uint64_t total = 0;
    std::map<uint64_t, uint64_t> live;  // offset -> size, pinned included
    uint64_t quota = std::numeric_limits<uint64_t>::max();
    uint64_t charged = 0;  // bytes carved through TryCarve and not released
    bool broken = false;

    bool operator==(const Device& o) const {
      return total == o.total && live == o.live && quota == o.quota &&
             charged == o.charged && broken == o.broken;
    }
    uint64_t used() const {
      uint64_t u = 0;
      for (const auto& [offset, size] : live) u += size;
      return u;
    }
    uint64_t largest_free() const {
      uint64_t start = 0, largest = 0;
      for (const auto& [offset, size] : live) {
        largest = std::max(largest, offset - start);
        start = offset + size;
      }
      return std::max(largest, total - start);
    }
  };

  explicit FakeCarver(const std::vector<FakeDeviceSpec>& specs) {
    for (const FakeDeviceSpec& spec : specs) {
      Device d;
      d.total = spec.total;
      d.quota = spec.quota;
      d.broken = spec.broken;
      for (const auto& [offset, size] : spec.pinned) d.live[offset] = size;
      devices_.push_back(std::move(d));
    }
  }

  absl::StatusOr<CarvedBlock> TryCarve(uint32_t device, uint64_t size,
                                       uint64_t alignment,
                                       Refusal* refusal) override {
    tried_.push_back(device);
    if (device >= devices_.size()) {
      return absl::InternalError(absl::StrFormat("no device %d", device));
    }
    Device& d = devices_[device];
    if (d.broken) return absl::InternalError("device is broken");
    const uint64_t free = d.total - d.used();
    refusal->free_bytes = free;
    refusal->largest_free_bytes = d.largest_free();
    if (size > d.quota - d.charged) {
      refusal->refused = true;
      refusal->reason = RefusalReason::kQuota;
      refusal->detail =
          absl::StrFormat("quota leaves %d bytes", d.quota - d.charged);
      return absl::ResourceExhaustedError("quota");
    }
    // First fit over the free ranges.
    uint64_t start = 0;
    auto fits = [&](uint64_t begin, uint64_t end, uint64_t* at) {
      uint64_t aligned = (begin + alignment - 1) / alignment * alignment;
      if (aligned < end && end - aligned >= size) {
        *at = aligned;
        return true;
      }
      return false;
    };
    uint64_t at = 0;
    bool found = false;
    for (const auto& [offset, length] : d.live) {
      if (fits(start, offset, &at)) {
        found = true;
        break;
      }
      start = offset + length;
    }
    if (!found) found = fits(start, d.total, &at);
    if (!found) {
      refusal->refused = true;
      refusal->reason = free >= size ? RefusalReason::kFragmentation
                                     : RefusalReason::kCapacity;
      return absl::ResourceExhaustedError("does not fit");
    }
    d.live[at] = size;
    d.charged += size;
    CarvedBlock block;
    block.device = device;
    block.size_bytes = size;
    block.id = next_id_++;
    block.slab_id = device;
    block.offset = at;
    return block;
  }

  void Release(const CarvedBlock& block) override {
    ++releases_;
    Device& d = devices_.at(block.device);
    auto it = d.live.find(block.offset);
    if (it == d.live.end() || it->second != block.size_bytes) {
      released_unknown_ = true;
      return;
    }
    d.live.erase(it);
    d.charged -= block.size_bytes;
  }

  // The load snapshot placement orders by, with `peer` as the peer matrix.
  DeviceSnapshot Snapshot(
      std::function<PeerDistance(uint32_t, uint32_t)> peer = nullptr) const {
    DeviceSnapshot snapshot;
    for (uint32_t i = 0; i < devices_.size(); ++i) {
      const Device& d = devices_[i];
      DeviceView view;
      view.index = i;
      view.uuid = FakeUuid(i);
      view.total_bytes = d.total;
      view.used_bytes = d.used();
      view.free_bytes = d.total - view.used_bytes;
      view.largest_free_bytes = d.largest_free();
      snapshot.devices.push_back(std::move(view));
    }
    snapshot.peer = std::move(peer);
    return snapshot;
  }

  const std::vector<Device>& devices() const { return devices_; }
  const std::vector<uint32_t>& tried() const { return tried_; }
  int releases() const { return releases_; }
  bool released_unknown() const { return released_unknown_; }

 private:
  std::vector<Device> devices_;
  std::vector<uint32_t> tried_;
  uint64_t next_id_ = 1;
  int releases_ = 0;
  bool released_unknown_ = false;
};

}  // namespace testing
}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_PLACEMENT_FAKE_CARVER_H_
