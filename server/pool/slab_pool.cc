// Carving order: the tenant's own shared slabs, oldest first (older slabs
// fill up, younger ones drain and get released); then a reserved slab nobody
// has been given yet; then a new slab, created outside the lock with its
// capacity promised meanwhile; then, if capacity sits in empty unheld slabs,
// release them and try a new slab once more. Slabs that are released while a
// live session holds their handle stay in `slabs_`, marked retained.
// Slabs leave through a Graveyard declared before the lock, so the backend
// takes them back after the lock is dropped; the lock is dropped mid-way
// only where the pool must see the backend's work before going on.
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

uint64_t SlabPool::GrownSlabSizeLocked(uint32_t tenant, uint64_t need) const {
  auto t = tenants_.find(tenant);
  const uint64_t have = t == tenants_.end() ? 0 : t->second.slab_bytes;
  // As large as what the tenant has here (so its slab count grows with the
  // log of its use), but never rounded past the block itself: a slab larger
  // than the block is room the tenant's quota pays for.
  const uint64_t want = std::max({need, have, options_.min_slab_size});
  if (want >= options_.slab_size) return options_.slab_size;
  return RoundUp(want);
}

bool SlabPool::TakeLocked(uint64_t id, SlabEntry& e, uint64_t size,
                          uint64_t alignment, bool new_slab, PoolBlock* out) {
  OffsetAllocator::Block b;
  if (!e.allocator->Allocate(size, alignment, &b)) return false;
  e.empty_since = absl::InfiniteFuture();  // not empty any more
  used_bytes_ += size;
  ++live_blocks_;
  TenantPoolStats& t = tenants_[e.tenant];
  t.used_bytes += size;
  ++t.live_blocks;
  *out = PoolBlock{id, e.size, b.offset, size, b.handle, e.tenant, new_slab};
  out->kind = e.kind;
  out->dedicated = e.dedicated;
  return true;
}

CarveResult SlabPool::Carve(uint64_t size, uint64_t alignment, uint32_t tenant,
                            HandleKind kind) {
  return CarveIn(size, alignment, tenant, kind, /*may_call_backend=*/true);
}

CarveResult SlabPool::TryCarve(uint64_t size, uint64_t alignment, uint32_t tenant,
                               HandleKind kind) {
  return CarveIn(size, alignment, tenant, kind, /*may_call_backend=*/false);
}

CarveResult SlabPool::CarveIn(uint64_t size, uint64_t alignment, uint32_t tenant,
                              HandleKind kind, bool may_call_backend) {
  CarveResult r;
  if (size == 0) {
    r.error = absl::InvalidArgumentError("size must be > 0");
    return r;
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    r.error = absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a power of two"));
    return r;
  }
  if (tenant == kNoTenant) {
    r.error = absl::InvalidArgumentError("no tenant");
    return r;
  }
  const bool dedicated = size > options_.slab_size;
  const uint64_t need = RoundUp(size);
  uint64_t bytes = 0;
  {
    Graveyard dead;  // destroyed after the lock is dropped
    absl::MutexLock lock(&mu_);
    if (!dedicated) {
      for (auto& [id, e] : slabs_) {
        if (e.dedicated || e.retained || e.tenant != tenant || e.kind != kind ||
            e.slab == nullptr) {
          continue;
        }
        if (TakeLocked(id, e, size, alignment, false, &r.block)) {
          r.kind = CarveResult::Kind::kBlock;
          return r;
        }
      }
      // One of its own slabs released while a session still holds its
      // handle: the tenant's already (its bytes count in its footprint), so
      // it is carvable again rather than a new slab made beside it.
      for (auto& [id, e] : slabs_) {
        if (!e.retained || e.dedicated || e.tenant != tenant || e.kind != kind ||
            e.slab == nullptr || e.size < size) {
          continue;
        }
        e.retained = false;
        retained_bytes_ -= e.size;
        tenants_[tenant].retained_bytes -= e.size;
        pooled_bytes_ += e.size;
        OwnLocked(tenant, e.size);
        e.empty_since = absl::Now();
        if (keeper_ != nullptr) keeper_->SlabChanged(FactsLocked(id, e));
        if (TakeLocked(id, e, size, alignment, false, &r.block)) {
          r.kind = CarveResult::Kind::kBlock;
          return r;
        }
      }
      // A reserved slab nobody has carved from: claimed for good.
      for (auto& [id, e] : slabs_) {
        if (e.tenant != kNoTenant || e.kind != kind || e.allocator->capacity() < size ||
            e.slab == nullptr) {
          continue;
        }
        // It becomes part of the tenant's footprint, within its budget.
        std::string why;
        if (budget_ != nullptr &&
            !budget_->TryTake(tenant, device_, e.size, options_.granularity, &why)) {
          continue;
        }
        e.tenant = tenant;
        OwnLocked(tenant, e.size);
        if (keeper_ != nullptr) keeper_->SlabChanged(FactsLocked(id, e));
        if (TakeLocked(id, e, size, alignment, false, &r.block)) {
          r.block.claimed_slab = true;
          r.kind = CarveResult::Kind::kBlock;
          return r;
        }
      }
    }
    // A new slab: dedicated (exactly big enough) or one sized for the
    // tenant (GrownSlabSizeLocked), cut down to the tenant's budget and to
    // what is left of the device. Its offset 0 meets any alignment.
    // The budget first: the tenant's own empty slabs count in its footprint,
    // so giving them back may make the room.
    if (BudgetRoomLocked(tenant) < need && BudgetFreeLocked(tenant) >= need) {
      if (!may_call_backend) {
        r.kind = CarveResult::Kind::kNeedsBackendWork;
        return r;
      }
      for (auto it = slabs_.begin(); it != slabs_.end();) {
        auto next = std::next(it);
        if (it->second.tenant == tenant && Releasable(it->second)) {
          ReleaseSlabLocked(it, &dead);
        }
        it = next;
      }
      if (!dead.empty()) {
        // Unlocked for the backend's slow release, done now so that the new slab is sized after it.
        mu_.Unlock();
        dead.clear();  // the backend takes the memory back
        mu_.Lock();
      }
    }
    if (BudgetRoomLocked(tenant) < need) {
      r.kind = CarveResult::Kind::kRefused;
      r.refusal = RefuseLocked(size, alignment, tenant);
      return r;
    }
    auto fits = [&] {
      // Within the budget's room (half of it for the tenant's first slab
      // here, leaving the rest for its other devices), in whole blocks of
      // this size: room left over in a slab is quota the tenant pays for,
      // so a tenant near its quota gets slabs its blocks fill.
      uint64_t sized = dedicated ? need : GrownSlabSizeLocked(tenant, need);
      auto own = tenants_.find(tenant);
      const bool first_here = own == tenants_.end() || own->second.slab_bytes == 0;
      const uint64_t room = BudgetRoomLocked(tenant);
      const uint64_t cap = first_here ? room / 2 : room;
      if (!dedicated && sized > cap) sized = std::max<uint64_t>(1, cap / need) * need;
      bytes = dedicated ? need : RoundDown(std::min(sized, UnpooledLocked()));
      return bytes >= need && bytes <= UnpooledLocked();
    };
    if (!fits() && FreeBytesLocked(UnpooledByTotalLocked()) >= need) {
      // Only the device's room, as last learnt, is short; it may have more
      // now (other processes freed memory). Learning it is backend work.
      if (!may_call_backend) {
        r.kind = CarveResult::Kind::kNeedsBackendWork;
        return r;
      }
      // Unlocked for the backend's query of the device's room (a driver call on cuda).
      mu_.Unlock();
      backend_->RefreshNewSlabRoom(device_);
      mu_.Lock();
    }
    if (!fits() && FreeBytesLocked() >= need) {
      if (!may_call_backend) {
        r.kind = CarveResult::Kind::kNeedsBackendWork;
        return r;
      }
      // Capacity sits in empty slabs nobody holds: release them. (A held
      // empty slab would only become retained and free nothing.)
      for (auto it = slabs_.begin(); it != slabs_.end();) {
        auto next = std::next(it);
        if (Releasable(it->second)) ReleaseSlabLocked(it, &dead);
        it = next;
      }
      if (!dead.empty()) {
        // Unlocked for the backend's slow release, done now so that fits() below counts the room.
        mu_.Unlock();
        dead.clear();  // the backend takes the memory back
        mu_.Lock();
      }
    }
    if (!fits()) {
      r.kind = CarveResult::Kind::kRefused;
      r.refusal = RefuseLocked(size, alignment, tenant);
      return r;
    }
    if (!may_call_backend) {
      r.kind = CarveResult::Kind::kNeedsBackendWork;
      return r;
    }
    // Taken from the budget with the check (another device's carve for the
    // same tenant may have taken room since it was read).
    std::string why;
    if (budget_ != nullptr &&
        !budget_->TryTake(tenant, device_, bytes, options_.granularity, &why)) {
      r.kind = CarveResult::Kind::kRefused;
      r.refusal = RefuseLocked(size, alignment, tenant);
      return r;
    }
    creating_bytes_ += bytes;
  }
  // Backend work outside the lock: the capacity is promised meanwhile.
  absl::StatusOr<std::unique_ptr<Slab>> slab = backend_->CreateSlab(device_, bytes, kind);
  const uint64_t new_id = slab.ok() ? MadeSlab(**slab, kind, tenant, dedicated, false) : 0;
  absl::MutexLock lock(&mu_);
  creating_bytes_ -= bytes;
  if (!slab.ok()) {
    GiveBudgetLocked(tenant, bytes);
    r.error = BackendError(slab.status(), "creating", bytes);
    return r;
  }
  auto [id, entry] = AddSlabLocked(new_id, std::move(*slab), kind, tenant);
  SlabEntry& e = *entry;
  e.dedicated = dedicated;  // before TakeLocked, which copies it into the block
  if (!TakeLocked(id, e, size, alignment, true, &r.block)) {
    // Cannot happen for a fresh slab of at least `need` bytes.
    r.error = absl::InternalError(absl::StrCat(
        "device ", device_, ": a new ", FormatBytes(bytes), " slab could not hold ",
        FormatBytes(size)));
    Graveyard dead;
    ReleaseSlabLocked(slabs_.find(id), &dead);
    // Unlocked for the backend's slow release (`lock` spans the function, `dead` does not).
    mu_.Unlock();
    dead.clear();
    mu_.Lock();
    return r;
  }
  r.kind = CarveResult::Kind::kBlock;
  return r;
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

PoolRefusal SlabPool::RefuseLocked(uint64_t size, uint64_t alignment,
                                   uint32_t tenant) const {
  // What this tenant could reach: free space in its own slabs, plus a new
  // slab of unpooled capacity and empty slabs nobody holds, as far as its
  // budget allows.
  uint64_t own_free = 0, own_largest = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.retained || e.tenant != tenant || Releasable(e) || e.slab == nullptr) continue;
    own_free += e.allocator->free_bytes();
    own_largest = std::max(own_largest, e.allocator->largest_free());
  }
  const uint64_t device_fresh = FreeBytesLocked();
  const uint64_t budget_fresh = BudgetFreeLocked(tenant);
  const uint64_t fresh = std::min(device_fresh, budget_fresh);
  PoolRefusal p;
  p.free_bytes = own_free + fresh;
  p.largest_free_bytes = std::max(own_largest, fresh);
  // Its own slabs could not hold the block (or RefuseLocked would not be
  // asked), and the device could give a new slab the budget does not allow.
  if (budget_fresh < RoundUp(size) && device_fresh >= RoundUp(size)) {
    std::string why = "its quota";
    if (budget_->TryTake(tenant, device_, RoundUp(size), options_.granularity, &why)) {
      budget_->Give(tenant, device_, RoundUp(size));  // room came meanwhile
    }
    p.reason = PoolRefusal::Reason::kFootprint;
    p.message = absl::StrCat("device ", device_, ": footprint: ", FormatBytes(size),
                             " asked needs a new ", FormatBytes(RoundUp(size)),
                             " slab beyond ", why);
  } else if (p.free_bytes < size) {
    p.reason = PoolRefusal::Reason::kCapacity;
    p.message = absl::StrCat("device ", device_, ": capacity: ",
                             FormatBytes(p.free_bytes), " free, ", FormatBytes(size),
                             " asked",
                             retained_bytes_ > 0
                                 ? absl::StrCat(" (", FormatBytes(retained_bytes_),
                                                " retained by live sessions)")
                                 : "");
  } else {
    p.reason = PoolRefusal::Reason::kFragmentation;
    p.message = absl::StrCat(
        "device ", device_, ": fragmentation: ", FormatBytes(p.free_bytes),
        " free but the largest range is ", FormatBytes(p.largest_free_bytes), ", ",
        FormatBytes(size), " asked",
        alignment > 1 ? absl::StrCat(" at alignment ", alignment) : "");
  }
  return p;
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

template <typename T>
absl::StatusOr<T> SlabPool::GiveHandle(uint64_t slab_id, uint32_t tenant, uint64_t session,
                                       const char* what,
                                       absl::StatusOr<T> (*give)(const Slab& slab)) {
  std::shared_ptr<Slab> slab;
  bool newly_held = false;
  {
    absl::MutexLock lock(&mu_);
    SlabEntry* e = FindLocked(slab_id);
    if (e == nullptr || e->retained) {
      return absl::NotFoundError(absl::StrCat("no slab ", slab_id, " on device ", device_));
    }
    if (e->tenant != tenant || tenant == kNoTenant) {
      return absl::PermissionDeniedError(absl::StrCat(
          "slab ", slab_id, " belongs to another tenant"));
    }
    if (e->slab == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "slab ", slab_id, " on device ", device_, " is waiting for its handle to come "
          "back after the daemon restarted (from a client that has it open); try again soon"));
    }
    // Recorded before the export: from here on the session may hold it.
    newly_held = e->holders.insert(session).second;
    exports_[session].insert(slab_id);
    if (newly_held && keeper_ != nullptr) keeper_->HolderAdded(slab_id, session);
    slab = e->slab;
  }
  absl::StatusOr<T> given = give(*slab);
  slab.reset();
  if (given.ok()) return given;
  if (newly_held) {
    Graveyard dead;
    absl::MutexLock lock(&mu_);
    DropHolderLocked(slab_id, session, &dead);
  }
  return absl::Status(given.status().code(),
                      absl::StrCat("device ", device_, ": ", what, " slab ", slab_id,
                                   " failed: ", given.status().message()));
}

absl::StatusOr<SlabPool::Export> SlabPool::ExportSlab(uint64_t slab_id, uint32_t tenant,
                                                      uint64_t session) {
  return GiveHandle<Export>(
      slab_id, tenant, session, "exporting", [](const Slab& slab) -> absl::StatusOr<Export> {
        absl::StatusOr<int> fd = slab.ExportFd();
        if (!fd.ok()) return fd.status();
        return Export{*fd, slab.size()};
      });
}

absl::StatusOr<std::string> SlabPool::IpcHandle(uint64_t slab_id, uint32_t tenant,
                                                uint64_t session) {
  return GiveHandle<std::string>(
      slab_id, tenant, session, "getting the IPC handle of",
      [](const Slab& slab) { return slab.IpcHandle(); });
}

void SlabPool::DropHolderLocked(uint64_t slab_id, uint64_t session,
                                Graveyard* dead) {
  auto ex = exports_.find(session);
  if (ex != exports_.end()) {
    ex->second.erase(slab_id);
    if (ex->second.empty()) exports_.erase(ex);
  }
  auto it = slabs_.find(slab_id);
  if (it == slabs_.end()) return;
  if (it->second.holders.erase(session) > 0 && keeper_ != nullptr) {
    keeper_->HolderGone(slab_id, session);
  }
  if (it->second.retained && it->second.holders.empty()) {
    ReleaseSlabLocked(it, dead);
  }
}

absl::Status SlabPool::CloseExport(uint64_t slab_id, uint64_t session) {
  Graveyard dead;
  absl::MutexLock lock(&mu_);
  auto ex = exports_.find(session);
  if (ex == exports_.end() || !ex->second.contains(slab_id)) {
    return absl::NotFoundError(absl::StrCat(
        "slab ", slab_id, " was not given to this session"));
  }
  DropHolderLocked(slab_id, session, &dead);
  return absl::OkStatus();
}

void SlabPool::ForgetSession(uint64_t session) {
  Graveyard dead;
  absl::MutexLock lock(&mu_);
  auto ex = exports_.find(session);
  if (ex == exports_.end()) return;
  const std::vector<uint64_t> ids(ex->second.begin(), ex->second.end());
  for (uint64_t id : ids) DropHolderLocked(id, session, &dead);
}

int SlabPool::ReleaseIdleSlabs(absl::Time now) {
  Graveyard dead;
  int released = 0;
  absl::MutexLock lock(&mu_);
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    auto next = std::next(it);
    const SlabEntry& e = it->second;
    if (!e.reserved && !e.retained && e.allocator->live_blocks() == 0 &&
        now - e.empty_since >= options_.empty_release_after) {
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

absl::Status SlabPool::AdoptSlab(const SlabFacts& f, std::unique_ptr<Slab> slab) {
  if (slab != nullptr && slab->size() != f.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab ", f.slab_id, ": its handle is ", slab->size(), " bytes, the record says ",
        f.size));
  }
  AdvanceSlabIdsPast(f.slab_id);
  absl::MutexLock lock(&mu_);
  if (slabs_.count(f.slab_id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("slab ", f.slab_id, " restored twice"));
  }
  SlabEntry& e = slabs_[f.slab_id];
  e.size = f.size;
  e.allocator = std::make_unique<OffsetAllocator>(f.size, 0, PagePopulator::Shared());
  e.slab = std::move(slab);
  e.kind = f.kind;
  e.tenant = f.tenant;
  e.dedicated = f.dedicated;
  e.reserved = f.reserved;
  e.retained = f.retained;
  e.identity = f.identity;
  e.empty_since = absl::Now();
  if (e.retained) {
    retained_bytes_ += f.size;
    tenants_[f.tenant].retained_bytes += f.size;
  } else {
    pooled_bytes_ += f.size;
    if (f.tenant != kNoTenant) OwnLocked(f.tenant, f.size);
  }
  // It was within the tenant's budget when it was made; a budget lowered
  // since takes nothing back.
  if (budget_ != nullptr && f.tenant != kNoTenant) budget_->Take(f.tenant, device_, f.size);
  if (e.slab == nullptr) awaiting_bytes_ += f.size;
  return absl::OkStatus();
}

absl::StatusOr<PoolBlock> SlabPool::AdoptBlock(uint64_t slab_id, uint64_t offset,
                                               uint64_t size) {
  absl::MutexLock lock(&mu_);
  SlabEntry* e = FindLocked(slab_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no slab ", slab_id));
  if (e->retained) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slab ", slab_id, " was released: no block of it is live"));
  }
  OffsetAllocator::Block b;
  if (!e->allocator->AllocateAt(offset, size, &b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[", offset, ", +", size, ") is not free in slab ", slab_id, " (", e->size,
        " bytes): it overlaps another block or lies outside the slab"));
  }
  e->empty_since = absl::InfiniteFuture();
  used_bytes_ += size;
  ++live_blocks_;
  TenantPoolStats& t = tenants_[e->tenant];
  t.used_bytes += size;
  ++t.live_blocks;
  PoolBlock out{slab_id, e->size, b.offset, size, b.handle, e->tenant, false};
  out.kind = e->kind;
  out.dedicated = e->dedicated;
  return out;
}

void SlabPool::AdoptHolder(uint64_t slab_id, uint64_t session, bool record) {
  absl::MutexLock lock(&mu_);
  SlabEntry* e = FindLocked(slab_id);
  if (e == nullptr) return;
  const bool fresh = e->holders.insert(session).second;
  exports_[session].insert(slab_id);
  if (fresh && record && keeper_ != nullptr) keeper_->HolderAdded(slab_id, session);
}

bool SlabPool::IsHolder(uint64_t slab_id, uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(slab_id);
  return it != slabs_.end() && it->second.holders.contains(session);
}

absl::Status SlabPool::CompleteSlab(uint64_t slab_id, std::unique_ptr<Slab> slab) {
  absl::MutexLock lock(&mu_);
  SlabEntry* e = FindLocked(slab_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no slab ", slab_id));
  if (e->slab != nullptr) return absl::OkStatus();  // given back already
  if (slab->size() != e->size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this handle is of ", slab->size(), " bytes; slab ", slab_id, " has ", e->size));
  }
  e->slab = std::move(slab);
  awaiting_bytes_ -= e->size;
  if (keeper_ != nullptr) {
    keeper_->SlabMade(FactsLocked(slab_id, *e), e->slab.get());
  }
  return absl::OkStatus();
}

std::vector<SlabFacts> SlabPool::SlabsAwaitingHandles() const {
  std::vector<SlabFacts> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : slabs_) {
    if (e.slab == nullptr) out.push_back(FactsLocked(id, e));
  }
  return out;
}

void SlabPool::DropAwaitingSlab(uint64_t slab_id) {
  Graveyard dead;
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(slab_id);
  if (it == slabs_.end() || it->second.slab != nullptr ||
      it->second.allocator->live_blocks() != 0) {
    return;
  }
  ReleaseSlabLocked(it, &dead);
}

uint64_t SlabPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t SlabPool::LargestCarvableLocked() const {
  uint64_t largest = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.retained || Releasable(e) || e.slab == nullptr) continue;  // releasable: below
    largest = std::max(largest, e.allocator->largest_free());
  }
  return std::max(largest, FreeBytesLocked());
}

uint64_t SlabPool::largest_carvable() const {
  absl::MutexLock lock(&mu_);
  return LargestCarvableLocked();
}

uint64_t SlabPool::LargestReachable(uint32_t tenant, HandleKind kind) const {
  absl::MutexLock lock(&mu_);
  uint64_t largest = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.retained || Releasable(e) || e.kind != kind) continue;  // releasable: below
    if (e.tenant != tenant && e.tenant != kNoTenant) continue;
    largest = std::max(largest, e.allocator->largest_free());
  }
  return std::max(largest, std::min(BudgetFreeLocked(tenant), FreeBytesLocked()));
}

double Fragmentation(uint64_t largest_free, uint64_t free_bytes) {
  if (free_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free) / static_cast<double>(free_bytes);
}

PoolStats SlabPool::Stats() const {
  PoolStats s;
  absl::MutexLock lock(&mu_);
  s.total_bytes = total_bytes_;
  s.used_bytes = used_bytes_;
  s.live_blocks = live_blocks_;
  s.pooled_bytes = pooled_bytes_;
  s.retained_bytes = retained_bytes_;
  for (const auto& [id, e] : slabs_) {
    if (e.retained) {
      ++s.retained_slab_count;
      continue;
    }
    s.pooled_free_bytes += e.allocator->free_bytes();
    s.largest_pooled_free = std::max(s.largest_pooled_free, e.allocator->largest_free());
    ++s.slab_count;
  }
  s.largest_carvable = LargestCarvableLocked();
  s.fragmentation = Fragmentation(s.largest_pooled_free, s.pooled_free_bytes);
  // What a tenant with nothing here could get: new slabs, out of capacity
  // no slab holds (within what the device itself has room for: on cuda,
  // memory the pool does not see) and of empty slabs nobody holds. Free
  // ranges of another tenant's slabs are that tenant's only.
  s.free_bytes = FreeBytesLocked();
  return s;
}

std::vector<SlabStats> SlabPool::Slabs() const {
  std::vector<SlabStats> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : slabs_) {
    SlabStats s;
    s.slab_id = id;
    s.tenant = e.tenant;
    s.size = e.size;
    s.used_bytes = e.allocator->used_bytes();
    s.free_bytes = e.retained ? 0 : e.allocator->free_bytes();
    s.largest_free = e.retained ? 0 : e.allocator->largest_free();
    s.fragmentation = Fragmentation(s.largest_free, s.free_bytes);
    s.live_blocks = e.allocator->live_blocks();
    s.holders = static_cast<uint32_t>(e.holders.size());
    s.dedicated = e.dedicated;
    s.reserved = e.reserved;
    s.retained = e.retained;
    out.push_back(s);
  }
  return out;
}

absl::flat_hash_map<uint32_t, TenantPoolStats> SlabPool::TenantStats() const {
  absl::MutexLock lock(&mu_);
  return tenants_;
}

uint64_t SlabPool::TenantRetained(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.retained_bytes;
}

absl::flat_hash_map<uint64_t, uint64_t> SlabPool::SessionRetained() const {
  absl::flat_hash_map<uint64_t, uint64_t> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [session, ids] : exports_) {
    for (uint64_t id : ids) {
      auto it = slabs_.find(id);
      if (it != slabs_.end() && it->second.retained) {
        out[session] += it->second.size;
      }
    }
  }
  return out;
}

absl::Status SlabPool::Validate() const {
  absl::MutexLock lock(&mu_);
  uint64_t used = 0, live = 0, pooled = 0, retained = 0, all = 0, awaiting = 0;
  absl::flat_hash_map<uint32_t, TenantPoolStats> tenants;
  for (const auto& [id, e] : slabs_) {
    absl::Status s = e.allocator->Validate();
    if (!s.ok()) return s;
    if (e.allocator->capacity() != e.size) {
      return absl::InternalError(absl::StrCat("slab ", id, ": allocator size mismatch"));
    }
    if (e.dedicated && !e.retained && e.allocator->live_blocks() == 0) {
      return absl::InternalError(absl::StrCat("slab ", id, ": empty dedicated slab kept"));
    }
    if (e.retained && (e.holders.empty() || e.allocator->live_blocks() != 0)) {
      return absl::InternalError(absl::StrCat(
          "slab ", id, ": retained with ", e.holders.size(), " holders and ",
          e.allocator->live_blocks(), " live blocks"));
    }
    if (e.tenant == kNoTenant && (!e.reserved || e.allocator->live_blocks() != 0 ||
                                  !e.holders.empty())) {
      return absl::InternalError(absl::StrCat("slab ", id, ": unowned but in use"));
    }
    for (uint64_t session : e.holders) {
      auto ex = exports_.find(session);
      if (ex == exports_.end() || !ex->second.contains(id)) {
        return absl::InternalError(absl::StrCat(
            "slab ", id, ": holder ", session, " missing from the export books"));
      }
    }
    used += e.allocator->used_bytes();
    live += e.allocator->live_blocks();
    (e.retained ? retained : pooled) += e.size;
    if (e.slab != nullptr) {
      all += e.size;  // what the backend holds; an adopted slab awaiting its handle not
    } else {
      awaiting += e.size;
    }
    if (e.tenant != kNoTenant) {
      TenantPoolStats& t = tenants[e.tenant];
      t.used_bytes += e.allocator->used_bytes();
      t.live_blocks += e.allocator->live_blocks();
      if (e.retained) {
        t.retained_bytes += e.size;
      } else {
        ++t.slab_count;
        t.slab_bytes += e.size;
      }
    }
  }
  for (const auto& [session, ids] : exports_) {
    for (uint64_t id : ids) {
      auto it = slabs_.find(id);
      if (it == slabs_.end() || !it->second.holders.contains(session)) {
        return absl::InternalError(absl::StrCat(
            "session ", session, ": export of slab ", id, " not on the slab"));
      }
    }
  }
  if (used != used_bytes_ || live != live_blocks_ || pooled != pooled_bytes_ ||
      retained != retained_bytes_) {
    return absl::InternalError("pool totals disagree with its slabs");
  }
  for (const auto& [tenant, t] : tenants) {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || it->second.used_bytes != t.used_bytes ||
        it->second.live_blocks != t.live_blocks ||
        it->second.retained_bytes != t.retained_bytes ||
        it->second.slab_count != t.slab_count || it->second.slab_bytes != t.slab_bytes) {
      return absl::InternalError(absl::StrCat("tenant ", tenant, ": figures disagree"));
    }
  }
  if (awaiting != awaiting_bytes_) {
    return absl::InternalError("bytes of slabs awaiting their handle disagree");
  }
  if (creating_bytes_ == 0 && (all != backend_->SlabBytes(device_) || all > total_bytes_)) {
    return absl::InternalError("slab bytes disagree with the backend");
  }
  return absl::OkStatus();
}

}  // namespace gpumem
