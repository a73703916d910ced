// SlabPool's export books: which live sessions were given each slab's
// handle (an fd or a CUDA IPC handle). A session is recorded as a holder
// before the backend hands the handle out (outside the lock), and the
// record is undone if that fails. A slab released while it has holders is
// retained until the last one closes it or ends, then goes back to the
// device. exports_ (session -> slabs) and each slab's holders always agree.
#include "server/pool/slab_pool.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {

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

bool SlabPool::IsHolder(uint64_t slab_id, uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(slab_id);
  return it != slabs_.end() && it->second.holders.contains(session);
}

}  // namespace gpumem
