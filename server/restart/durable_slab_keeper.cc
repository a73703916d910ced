#include "server/restart/durable_slab_keeper.h"

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpumem {

namespace {
constexpr absl::string_view kSlabFdPrefix = "gpumemd-slab-";
}  // namespace

std::string SlabFdName(uint64_t slab_id) { return absl::StrCat(kSlabFdPrefix, slab_id); }

std::optional<uint64_t> SlabIdOfFdName(const std::string& name) {
  absl::string_view rest = name;
  uint64_t id = 0;
  if (!absl::ConsumePrefix(&rest, kSlabFdPrefix) || rest.empty() || rest.size() > 20 ||
      !absl::SimpleAtoi(rest, &id) || id == 0 || absl::StrCat(id) != rest) {
    return std::nullopt;
  }
  return id;
}

DurableSlabKeeper::DurableSlabKeeper(state::DurableState* state, FdStore* fds,
                                     std::function<std::string(uint32_t)> tenant_name)
    : state_(state), fds_(fds), tenant_name_(std::move(tenant_name)) {}

void DurableSlabKeeper::Record(const SlabFacts& f, const SlabIdentity& identity) {
  state::SlabRecord r;
  r.slab_id = f.slab_id;
  r.size = f.size;
  r.handle_ino = identity.ino;
  r.handle_dev = identity.dev;
  r.device = f.device;
  r.tenant = f.tenant;
  r.kind = HandleKindToRecord(f.kind);
  r.dedicated = f.dedicated;
  r.reserved = f.reserved;
  r.retained = f.retained;
  r.set_tenant_name(f.tenant == UINT32_MAX ? "" : tenant_name_(f.tenant));
  Kept& k = slabs_[f.slab_id];
  const uint32_t old = k.slot;
  k.slot = state_->PutSlab(r);  // the new copy first: a crash between keeps one
  state_->RemoveSlab(old);
}

void DurableSlabKeeper::SlabMade(const SlabFacts& f, const Slab* slab) {
  if (frozen_.load()) return;
  SlabIdentity identity;
  bool stored = false;
  if (slab != nullptr && HandleKindUsesFd(f.kind)) {
    identity = slab->Identity();
    if (fds_ != nullptr && fds_->enabled()) {
      absl::StatusOr<int> fd = slab->ExportFd();
      if (fd.ok()) {
        stored = fds_->Deposit(SlabFdName(f.slab_id), *fd).ok();
        close(*fd);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  Kept& k = slabs_[f.slab_id];
  if (slab != nullptr) {
    k.identity = identity;
    k.stored = k.stored || stored;
  }
  Record(f, k.identity);
}

void DurableSlabKeeper::SlabChanged(const SlabFacts& f) {
  if (frozen_.load()) return;
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(f.slab_id);
  Record(f, it == slabs_.end() ? SlabIdentity() : it->second.identity);
}

void DurableSlabKeeper::SlabGone(uint64_t slab_id) {
  if (frozen_.load()) return;
  bool stored = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = slabs_.find(slab_id);
    if (it == slabs_.end()) return;
    state_->RemoveSlab(it->second.slot);
    stored = it->second.stored;
    slabs_.erase(it);
  }
  if (stored && fds_ != nullptr) fds_->Remove(SlabFdName(slab_id));
}

void DurableSlabKeeper::HolderAdded(uint64_t slab_id, uint64_t session) {
  if (frozen_.load()) return;
  state::HolderRecord r;
  r.slab_id = slab_id;
  r.session = session;
  absl::MutexLock lock(&mu_);
  if (holders_.contains({slab_id, session})) return;
  holders_[{slab_id, session}] = state_->PutHolder(r);
}

void DurableSlabKeeper::HolderGone(uint64_t slab_id, uint64_t session) {
  if (frozen_.load()) return;
  absl::MutexLock lock(&mu_);
  auto it = holders_.find({slab_id, session});
  if (it == holders_.end()) return;
  state_->RemoveHolder(it->second);
  holders_.erase(it);
}

void DurableSlabKeeper::AdoptSlabRecord(const state::SlabRecord& r, bool handle_stored) {
  absl::MutexLock lock(&mu_);
  Kept& k = slabs_[r.slab_id];
  k.slot = r.slot;
  k.identity = SlabIdentity{r.handle_ino, r.handle_dev};
  k.stored = handle_stored;
}

void DurableSlabKeeper::AdoptHolderRecord(const state::HolderRecord& r) {
  absl::MutexLock lock(&mu_);
  holders_[{r.slab_id, r.session}] = r.slot;
}

}  // namespace gpumem
