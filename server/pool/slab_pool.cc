// SlabPool's slabs coming and going: making them (Reserve, and the id and
// keeper record every new slab gets), the free-bytes rule (FreeBytesLocked,
// BudgetFreeLocked), and releasing them (Release, Uncarve, the idle sweep,
// a tenant gone, shutdown). The bookkeeping invariants:
//  - pooled_bytes_ counts carvable slabs, retained_bytes_ retained ones; a
//    tenant's slab_count/slab_bytes count its carvable slabs, its footprint
//    adds its retained ones, and its budget is given back only when a slab
//    leaves the pool or a claimed reserved slab goes back to nobody.
//  - Releasing an empty slab a live session holds makes it retained; it
//    goes back to the device when its last holder lets go.
//  - Slabs leave through a Graveyard declared before the lock, so the
//    backend takes them back after the lock is dropped; the lock is dropped
//    mid-way only where the pool must see the backend's work before going
//    on (slab_pool_carve.cc).
#include "server/pool/slab_pool.h"

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace
namespace {

// Slab ids are unique for the daemon's lifetime, across devices, so a client
// cache keyed by slab id can never confuse a released slab with a new one.
std::atomic<uint64_t> next_slab_id{1};

}  // namespace

void SlabPool::AdvanceSlabIdsPast(uint64_t id) {
  uint64_t cur = next_slab_id.load();
  while (cur <= id && !next_slab_id.compare_exchange_weak(cur, id + 1)) {
  }
}

SlabFacts SlabPool::FactsLocked(uint64_t id, const SlabEntry& e) const {
  SlabFacts f;
  f.slab_id = id;
  f.device = device_;
  f.size = e.size;
  f.tenant = e.tenant;
  f.kind = e.kind;
  f.dedicated = e.dedicated;
  f.reserved = e.reserved;
  f.retained = e.retained;
  f.identity = e.identity;
  return f;
}

uint64_t SlabPool::MadeSlab(const Slab& slab, HandleKind kind, uint32_t tenant, bool dedicated,
                            bool reserved) {
  const uint64_t id = next_slab_id.fetch_add(1);
  if (keeper_ != nullptr) {
    SlabFacts f;
    f.slab_id = id;
    f.device = device_;
    f.size = slab.size();
    f.tenant = tenant;
    f.kind = kind;
    f.dedicated = dedicated;
    f.reserved = reserved;
    keeper_->SlabMade(f, &slab);  // kept before any block of it is handed out
  }
  return id;
}

SlabPool::SlabPool(Backend* backend, uint32_t device, PoolOptions options)
    : backend_(backend),
      device_(device),
      options_(options),
      total_bytes_(backend->devices().at(device).total_bytes) {
  options_.granularity = std::max<uint64_t>(
      {options_.granularity, backend->Granularity(device), 1});
  options_.slab_size = std::max(RoundUp(options_.slab_size), options_.granularity);
  options_.min_slab_size =
      std::min(options_.slab_size, std::max(RoundUp(options_.min_slab_size), options_.granularity));
}

SlabPool::~SlabPool() { ReleaseAll(); }

uint64_t SlabPool::RoundUp(uint64_t v) const {
  const uint64_t g = options_.granularity;
  if (v > UINT64_MAX - (g - 1)) return UINT64_MAX - (UINT64_MAX % g);
  return (v + g - 1) / g * g;
}

uint64_t SlabPool::UnpooledByTotalLocked() const {
  // Backend bytes include retained slabs and slabs whose release is still
  // running outside the lock: both are really held.
  const uint64_t held = backend_->SlabBytes(device_) + creating_bytes_ + awaiting_bytes_;
  return held >= total_bytes_ ? 0 : total_bytes_ - held;
}

uint64_t SlabPool::UnpooledLocked() const {
  // And what the device really has left (slabs being created have not
  // taken theirs from it yet).
  const uint64_t room = backend_->NewSlabRoom(device_);
  const uint64_t by_device = room > creating_bytes_ ? room - creating_bytes_ : 0;
  return std::min(UnpooledByTotalLocked(), by_device);
}

uint64_t SlabPool::FreeBytesLocked() const { return FreeBytesLocked(UnpooledLocked()); }

uint64_t SlabPool::FreeBytesLocked(uint64_t unpooled) const {
  return RoundDown(unpooled + ReleasableLocked());
}

uint64_t SlabPool::BudgetFreeLocked(uint32_t tenant) const {
  return RoundDown(SaturatingAdd(BudgetRoomLocked(tenant), OwnReleasableLocked(tenant)));
}

absl::Status SlabPool::Reserve() {
  if (options_.reserve_fraction <= 0) return absl::OkStatus();
  const uint64_t target = static_cast<uint64_t>(
      std::min(1.0, options_.reserve_fraction) * static_cast<double>(total_bytes_));
  uint64_t reserved = 0;
  while (reserved < target) {
    uint64_t bytes;
    {
      absl::MutexLock lock(&mu_);
      bytes = RoundDown(std::min(options_.slab_size, UnpooledLocked()));
    }
    if (bytes == 0) break;
    const HandleKind kind = backend_->handle_kinds().front();
    absl::StatusOr<std::unique_ptr<Slab>> slab = backend_->CreateSlab(device_, bytes, kind);
    if (!slab.ok()) return BackendError(slab.status(), "reserving", bytes);
    const uint64_t id = MadeSlab(**slab, kind, kNoTenant, false, true);
    absl::MutexLock lock(&mu_);
    AddSlabLocked(id, std::move(*slab), kind, kNoTenant).second->reserved = true;
    reserved += bytes;
  }
  return absl::OkStatus();
}

absl::Status SlabPool::BackendError(const absl::Status& s, absl::string_view doing,
                                    uint64_t bytes) const {
  return absl::Status(s.code(), absl::StrCat("device ", device_, ": ", doing, " a ",
                                             FormatBytes(bytes), " slab failed: ",
                                             s.message()));
}

std::pair<uint64_t, SlabPool::SlabEntry*> SlabPool::AddSlabLocked(
    uint64_t id, std::unique_ptr<Slab> slab, HandleKind kind, uint32_t tenant) {
  SlabEntry& e = slabs_[id];
  e.size = slab->size();
  e.allocator = std::make_unique<OffsetAllocator>(e.size, /*reserve_slots=*/0,
                                                  PagePopulator::Shared());
  pooled_bytes_ += e.size;
  e.slab = std::move(slab);
  e.kind = kind;
  e.tenant = tenant;
  e.empty_since = absl::Now();
  if (tenant != kNoTenant) OwnLocked(tenant, e.size);
  return {id, &e};
}

void SlabPool::OwnLocked(uint32_t tenant, uint64_t bytes) {
  TenantPoolStats& t = tenants_[tenant];
  ++t.slab_count;
  t.slab_bytes += bytes;
}

void SlabPool::DisownLocked(uint32_t tenant, uint64_t bytes) {
  auto t = tenants_.find(tenant);
  if (t == tenants_.end()) return;
  --t->second.slab_count;
  t->second.slab_bytes -= bytes;
}

void SlabPool::GiveBudgetLocked(uint32_t tenant, uint64_t bytes) {
  if (budget_ != nullptr && tenant != kNoTenant) budget_->Give(tenant, device_, bytes);
}

uint64_t SlabPool::BudgetRoomLocked(uint32_t tenant) const {
  return budget_ == nullptr ? UINT64_MAX
                            : budget_->Room(tenant, device_, options_.granularity);
}

uint64_t SlabPool::OwnReleasableLocked(uint32_t tenant) const {
  uint64_t bytes = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.tenant == tenant && Releasable(e)) bytes += e.size;
  }
  return bytes;
}

bool SlabPool::Releasable(const SlabEntry& e) {
  return !e.retained && e.holders.empty() && e.allocator->live_blocks() == 0 &&
         e.slab != nullptr;
}

uint64_t SlabPool::ReleasableLocked() const {
  uint64_t bytes = 0;
  for (const auto& [id, e] : slabs_) {
    if (Releasable(e)) bytes += e.size;
  }
  return bytes;
}

void SlabPool::ReleaseSlabLocked(std::map<uint64_t, SlabEntry>::iterator it,
                                 Graveyard* dead) {
  SlabEntry& e = it->second;
  const uint64_t size = e.size;
  if (!e.retained) {
    pooled_bytes_ -= size;
    if (e.tenant != kNoTenant) DisownLocked(e.tenant, size);
  }
  if (!e.holders.empty()) {
    if (!e.retained) {
      e.retained = true;
      retained_bytes_ += size;
      tenants_[e.tenant].retained_bytes += size;
      if (keeper_ != nullptr) keeper_->SlabChanged(FactsLocked(it->first, e));
    }
    return;
  }
  if (e.retained) {
    retained_bytes_ -= size;
    tenants_[e.tenant].retained_bytes -= size;
  }
  auto t = tenants_.find(e.tenant);
  if (t != tenants_.end() && t->second.slab_count == 0 &&
      t->second.retained_bytes == 0 && t->second.live_blocks == 0) {
    tenants_.erase(t);
  }
  if (e.slab == nullptr) awaiting_bytes_ -= size;
  GiveBudgetLocked(e.tenant, size);
  if (keeper_ != nullptr) keeper_->SlabGone(it->first);  // before the backend takes it
  dead->push_back(std::move(e.slab));
  slabs_.erase(it);
}

void SlabPool::Release(const PoolBlock& block) {
  Graveyard dead;
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(block.slab_id);
  if (it == slabs_.end()) return;
  SlabEntry& e = it->second;
  OffsetAllocator::Block b{block.offset, block.size, block.handle};
  e.allocator->Free(b);
  used_bytes_ -= block.size;
  --live_blocks_;
  TenantPoolStats& t = tenants_[e.tenant];
  t.used_bytes -= block.size;
  --t.live_blocks;
  if (e.allocator->live_blocks() == 0) {
    if (e.dedicated || gone_.contains(e.tenant)) {
      ReleaseSlabLocked(it, &dead);
    } else {
      e.empty_since = absl::Now();
    }
  }
}

void SlabPool::Uncarve(const PoolBlock& block) {
  Release(block);
  if (block.claimed_slab) {
    // A reserved slab the carve claimed goes back to nobody, unless it
    // was used or given out meanwhile.
    absl::MutexLock lock(&mu_);
    auto it = slabs_.find(block.slab_id);
    if (it != slabs_.end() && Releasable(it->second) && it->second.reserved) {
      DisownLocked(it->second.tenant, it->second.size);
      GiveBudgetLocked(it->second.tenant, it->second.size);
      it->second.tenant = kNoTenant;
      if (keeper_ != nullptr) keeper_->SlabChanged(FactsLocked(it->first, it->second));
    }
    return;
  }
  if (!block.new_slab) return;
  Graveyard dead;
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(block.slab_id);
  if (it != slabs_.end() && !it->second.retained &&
      it->second.allocator->live_blocks() == 0) {
    ReleaseSlabLocked(it, &dead);
  }
}

SlabPool::SlabEntry* SlabPool::FindLocked(uint64_t slab_id) {
  auto it = slabs_.find(slab_id);
  return it == slabs_.end() ? nullptr : &it->second;
}

bool SlabPool::HasSlab(uint64_t slab_id) const {
  absl::MutexLock lock(&mu_);
  return slabs_.count(slab_id) != 0;
}

int SlabPool::ReleaseIdleSlabs(absl::Time now) {
  // Other processes grown into the device's headroom (a new one's context,
  // its libraries) get empty slabs back at once, not after
  // empty_release_after: the driver's figure is learnt first (a driver
  // call, so before the lock).
  uint64_t shortfall = 0;
  if (backend_->Headroom(device_) > 0) {
    backend_->RefreshNewSlabRoom(device_);
    shortfall = backend_->HeadroomShortfall(device_);
  }
  Graveyard dead;
  int released = 0;
  absl::MutexLock lock(&mu_);
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    auto next = std::next(it);
    const SlabEntry& e = it->second;
    const bool idle = !e.reserved && !e.retained && e.allocator->live_blocks() == 0;
    if (idle && (now - e.empty_since >= options_.empty_release_after ||
                 (shortfall > 0 && Releasable(e)))) {
      shortfall -= std::min(shortfall, e.size);
      ReleaseSlabLocked(it, &dead);
      ++released;
    }
    it = next;
  }
  return released;
}

int SlabPool::ReleaseTenantSlabs(uint32_t tenant) {
  Graveyard dead;
  int released = 0;
  absl::MutexLock lock(&mu_);
  gone_.insert(tenant);
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    auto next = std::next(it);
    const SlabEntry& e = it->second;
    if (e.tenant == tenant && !e.retained && e.allocator->live_blocks() == 0) {
      ReleaseSlabLocked(it, &dead);
      ++released;
    }
    it = next;
  }
  return released;
}

void SlabPool::ReleaseAll() {
  std::map<uint64_t, SlabEntry> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(slabs_);
    for (const auto& [id, e] : all) GiveBudgetLocked(e.tenant, e.size);
    exports_.clear();
    tenants_.clear();
    used_bytes_ = live_blocks_ = pooled_bytes_ = retained_bytes_ = awaiting_bytes_ = 0;
    if (keeper_ != nullptr) {
      for (const auto& [id, e] : all) keeper_->SlabGone(id);
    }
  }
  // `all` goes out of scope here: every slab back to the device.
}

}  // namespace gpumem
