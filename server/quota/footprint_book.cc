#include "server/quota/footprint_book.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {
namespace quota {
namespace {

// limit + slack - held, saturating at both ends.
uint64_t Headroom(uint64_t limit, uint64_t slack, uint64_t held) {
  const uint64_t cap = limit > UINT64_MAX - slack ? UINT64_MAX : limit + slack;
  return held >= cap ? 0 : cap - held;
}

}  // namespace

FootprintBook::Entry& FootprintBook::EntryLocked(uint32_t tenant) {
  Entry& e = tenants_[tenant];
  if (e.device_bytes.size() < device_count_) e.device_bytes.resize(device_count_);
  return e;
}

void FootprintBook::SetLimits(uint32_t tenant, const tenants::Quota& quota) {
  absl::MutexLock lock(&mu_);
  EntryLocked(tenant).limits = quota;
}

uint64_t FootprintBook::RoomLocked(const Entry& e, uint32_t device, uint64_t slack,
                                   std::string* limit) const {
  uint64_t room = UINT64_MAX;
  const uint64_t here = device < e.device_bytes.size() ? e.device_bytes[device] : 0;
  if (const std::optional<uint64_t> d = e.limits.device_limit(device); d) {
    room = Headroom(*d, slack, here);
    if (limit != nullptr) {
      *limit = absl::StrCat("its quota on device ", device, " (", FormatBytes(*d),
                            " + one ", FormatBytes(slack), " granule): its slabs there hold ",
                            FormatBytes(here));
    }
  }
  if (e.limits.total_bytes) {
    const uint64_t total = Headroom(*e.limits.total_bytes, slack, e.total_bytes);
    if (total < room) {
      room = total;
      if (limit != nullptr) {
        *limit = absl::StrCat("its quota total_bytes (", FormatBytes(*e.limits.total_bytes),
                              " + one ", FormatBytes(slack),
                              " granule): its slabs hold ", FormatBytes(e.total_bytes));
      }
    }
  }
  return room;
}

uint64_t FootprintBook::Room(uint32_t tenant, uint32_t device, uint64_t slack) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return UINT64_MAX;
  return RoomLocked(it->second, device, slack, nullptr);
}

bool FootprintBook::TryTake(uint32_t tenant, uint32_t device, uint64_t bytes,
                            uint64_t slack, std::string* why) {
  absl::MutexLock lock(&mu_);
  Entry& e = EntryLocked(tenant);
  if (device >= device_count_) return false;
  std::string limit;
  if (RoomLocked(e, device, slack, &limit) < bytes) {
    if (why != nullptr) *why = std::move(limit);
    return false;
  }
  e.device_bytes[device] += bytes;
  e.total_bytes += bytes;
  return true;
}

void FootprintBook::Take(uint32_t tenant, uint32_t device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Entry& e = EntryLocked(tenant);
  if (device >= device_count_) return;
  e.device_bytes[device] += bytes;
  e.total_bytes += bytes;
}

void FootprintBook::Give(uint32_t tenant, uint32_t device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end() || device >= device_count_) return;
  Entry& e = it->second;
  e.device_bytes[device] -= std::min(bytes, e.device_bytes[device]);
  e.total_bytes -= std::min(bytes, e.total_bytes);
}

uint64_t FootprintBook::Footprint(uint32_t tenant, uint32_t device) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end() || device >= it->second.device_bytes.size()) return 0;
  return it->second.device_bytes[device];
}

uint64_t FootprintBook::Footprint(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.total_bytes;
}

}  // namespace quota
}  // namespace gpumem
