// SlabPool after a restart: taking back what the previous daemon kept
// (slab_keeper.h). Adopted slabs, blocks and holders are counted exactly as
// if this pool had made them, the slabs in their tenant's budget (taken even
// past a budget lowered since: they were within it when made). A slab whose
// handle has not come back yet is held (awaiting_bytes_) but neither carved
// from nor exported until CompleteSlab, or dropped if it never comes back.
#include "server/pool/slab_pool.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {

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

std::optional<SlabPool::SlabState> SlabPool::FindSlab(uint64_t slab_id) const {
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(slab_id);
  if (it == slabs_.end()) return std::nullopt;
  return SlabState{FactsLocked(slab_id, it->second), it->second.slab == nullptr};
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

}  // namespace gpumem
