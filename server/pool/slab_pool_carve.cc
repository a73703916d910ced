// SlabPool's carving. Order: the tenant's own slabs, oldest first (older
// slabs fill up, younger ones drain and get released); then one of its
// retained slabs, carvable again (its bytes count in its footprint
// already); then a reserved slab nobody has been given yet, claimed for
// good; then a new slab, sized for the tenant (GrownSlabSizeLocked) within
// its budget and the device's room, created outside the lock with its
// capacity promised meanwhile (creating_bytes_) and its budget taken. Short
// of budget, the tenant's own empty slabs are released first; short of the
// device's room, the backend is asked for it again, then empty slabs nobody
// holds (of any tenant) are released. TryCarve stops where any of that
// backend work would be needed, having changed nothing; a refusal carries
// the figures the tenant could reach (RefuseLocked).
#include "server/pool/slab_pool.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {

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

Refusal SlabPool::RefuseLocked(uint64_t size, uint64_t alignment,
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
  Refusal p;
  p.refused = true;
  p.device = device_;
  p.asked_bytes = size;
  p.free_bytes = own_free + fresh;
  p.largest_free_bytes = std::max(own_largest, fresh);
  // Its own slabs could not hold the block (or RefuseLocked would not be
  // asked), and the device could give a new slab the budget does not allow.
  if (budget_fresh < RoundUp(size) && device_fresh >= RoundUp(size)) {
    std::string why = "its quota";
    if (budget_->TryTake(tenant, device_, RoundUp(size), options_.granularity, &why)) {
      budget_->Give(tenant, device_, RoundUp(size));  // room came meanwhile
    }
    p.reason = RefusalReason::kQuota;  // the tenant's quota, in slabs
    p.message = absl::StrCat("device ", device_, ": footprint: ", FormatBytes(size),
                             " asked needs a new ", FormatBytes(RoundUp(size)),
                             " slab beyond ", why);
    p.detail = p.message;
  } else if (p.free_bytes < size) {
    p.reason = RefusalReason::kCapacity;
    p.message = absl::StrCat("device ", device_, ": capacity: ",
                             FormatBytes(p.free_bytes), " free, ", FormatBytes(size),
                             " asked",
                             retained_bytes_ > 0
                                 ? absl::StrCat(" (", FormatBytes(retained_bytes_),
                                                " retained by live sessions)")
                                 : "");
    if (const uint64_t headroom = backend_->Headroom(device_); headroom > 0) {
      p.detail = absl::StrCat("besides ", FormatBytes(headroom),
                              " kept for other processes' CUDA contexts and libraries "
                              "(--device_headroom)");
      absl::StrAppend(&p.message, "; ", p.detail);
    }
  } else {
    p.reason = RefusalReason::kFragmentation;
    p.message = absl::StrCat(
        "device ", device_, ": fragmentation: ", FormatBytes(p.free_bytes),
        " free but the largest range is ", FormatBytes(p.largest_free_bytes), ", ",
        FormatBytes(size), " asked",
        alignment > 1 ? absl::StrCat(" at alignment ", alignment) : "");
  }
  return p;
}

}  // namespace gpumem
