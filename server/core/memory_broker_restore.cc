// A restart that loses nothing: MemoryBroker::Restore, Resume,
// AcceptSlabHandle, RebindConnection and FinishRestore (memory_broker.h).
// Invariants: nothing is taken on trust beyond what the records and the
// handles prove; anything that does not fit is closed, saying why; a
// restored allocation nobody claims within the grace time is freed then.
#include <unistd.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "server/core/memory_broker.h"

namespace gpumem {

namespace {

// Ids for restored tenants the directory in force no longer has: above any
// configured tenant's (which start at 1 and grow by one per new tenant).
constexpr uint32_t kRestoredTenantIds = 0x40000000u;

}  // namespace

std::string MemoryBroker::RestoreOutcome::Summary() const {
  return absl::StrCat(allocations, " allocation(s) in ", slabs, " slab(s) of ", sessions,
                      " session(s) survived the restart; ", slabs_awaiting_handle,
                      " slab(s) wait for a client to give their handle back; closed: ",
                      allocations_closed, " allocation(s), ", slabs_dropped, " slab(s), ",
                      sessions_gone, " session(s) whose process is gone");
}

// Takes back, in dependency order, what a previous daemon recorded
// (server/state/): sessions first (a process-bound one only if the very same
// process still runs), then slabs (each adopted from its kept handle, which
// the backend checks is that slab's, or left waiting for a client to give
// the handle back), then every allocation in its exact place in its slab
// (OffsetAllocator::AllocateAt) with its id and its charge, then who holds
// which slab. Anything that does not fit (its session gone, its slab not
// restored, its range not free) is closed, saying why. Restored allocations
// stay "unconfirmed" until a client of their session re-presents them
// (Resume) or retries the Allocate that made them with its request_key
// (RetakeByKey); those none claims within the grace time are freed then.
MemoryBroker::RestoreOutcome MemoryBroker::Restore(const state::Snapshot& previous,
                                                   std::map<uint64_t, int> slab_fds) {
  RestoreOutcome out;
  absl::ReaderMutexLock gate(&gate_);
  const std::shared_ptr<const tenants::TenantDirectory> dir = tenants_->Get();
  uint32_t next_restored_id = kRestoredTenantIds;
  absl::flat_hash_map<std::string, uint32_t> retired;  // name -> id given here
  // The tenant a record's name is now: the same name in the directory in
  // force, or (a tenant the config no longer has) an id of its own here.
  auto tenant_of = [&](const std::string& name) -> std::optional<tenants::TenantRef> {
    if (name.empty()) return std::nullopt;
    // A listed tenant (configured, or a socket tenant in either mode).
    if (const tenants::Tenant* t = dir->Find(name)) {
      return tenants::TenantRef{t->id, name, t->priority, t->max_waiting_requests,
                                t->max_sessions};
    }
    if (!dir->configured()) {
      std::optional<uint32_t> uid = tenants::UidOfTenantName(name);
      if (!uid.has_value()) return std::nullopt;
      return dir->Resolve(*uid, *uid).value_or(tenants::TenantRef{*uid, name});
    }
    if (std::optional<uint32_t> id = dir->IdOf(name)) {
      const tenants::Tenant* t = dir->FindId(*id);
      return tenants::TenantRef{*id, name, t->priority, t->max_waiting_requests,
                                t->max_sessions};
    }
    auto [it, fresh] = retired.try_emplace(name, next_restored_id);
    if (fresh) {
      ++next_restored_id;
      absl::MutexLock lock(&restore_mu_);
      restored_names_[it->second] = name;
    }
    return tenants::TenantRef{it->second, name, 0, tenants::kDefaultMaxWaitingRequests};
  };
  std::map<uint64_t, uint64_t> closed_session;
  auto close_record = [&](const state::AllocationRecordData& r, const std::string& why) {
    out.closed[r.id] = why;
    closed_session[r.id] = r.session;
    ++out.allocations_closed;
    if (options_.state != nullptr) options_.state->RemoveAllocation(r.slot);
  };

  // 1. Sessions.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions;
  uint64_t max_session = 0;
  for (const state::SessionRecord& r : previous.sessions) {
    max_session = std::max(max_session, r.id);
    std::optional<tenants::TenantRef> tenant;
    if (r.tenant_fixed) tenant = tenant_of(r.tenant_name_string());
    if (r.via_socket) {
      // Through a tenant's socket: that tenant must still be one with a
      // socket (socket tenants are back in the directory before this).
      const tenants::Tenant* t = tenant.has_value() ? dir->FindId(tenant->id) : nullptr;
      if (t == nullptr || t->socket.empty()) tenant.reset();
    }
    absl::StatusOr<std::shared_ptr<Session>> s = sessions_->Restore(r, tenant);
    if (!s.ok()) {
      ++out.sessions_gone;
      if (options_.state != nullptr) options_.state->RemoveSession(r.slot);
      continue;
    }
    sessions[r.id] = *s;
    ++out.sessions;
  }
  sessions_->AdvanceIdsPast(max_session);

  // 2. Slabs, with their handles where they were kept.
  struct Adopted {
    uint32_t device = 0;
    uint32_t tenant = 0;
    std::string tenant_name;
  };
  absl::flat_hash_map<uint64_t, Adopted> slabs;
  absl::flat_hash_map<uint64_t, std::string> slab_dropped_why;
  uint64_t max_slab = 0;
  for (const state::SlabRecord& r : previous.slabs) {
    max_slab = std::max(max_slab, r.slab_id);
    int fd = -1;
    if (auto it = slab_fds.find(r.slab_id); it != slab_fds.end()) {
      fd = it->second;
      slab_fds.erase(it);
    }
    const std::optional<HandleKind> recorded_kind = HandleKindFromRecord(r.kind);
    auto drop = [&](const std::string& why) {
      if (fd >= 0) close(fd);
      out.dropped_slabs.push_back(r.slab_id);
      slab_dropped_why[r.slab_id] = why;
      ++out.slabs_dropped;
      out.notes.push_back(absl::StrCat("slab ", r.slab_id, " dropped: ", why));
    };
    if (r.device >= pools_.size()) {
      drop(absl::StrCat("device ", r.device, " is gone"));
      continue;
    }
    if (!recorded_kind.has_value()) {
      drop(absl::StrCat("its handle kind ", static_cast<int>(r.kind), " is unknown"));
      continue;
    }
    const HandleKind kind = *recorded_kind;
    if (kind == HandleKind::kCudaIpc) {
      drop("legacy CUDA IPC memory dies with the daemon that exported it");
      continue;
    }
    SlabFacts f;
    f.slab_id = r.slab_id;
    f.device = r.device;
    f.size = r.size;
    f.kind = kind;
    f.dedicated = r.dedicated;
    f.reserved = r.reserved;
    f.retained = r.retained;
    f.identity = SlabIdentity{r.handle_ino, r.handle_dev};
    f.tenant = kNoTenant;
    std::string tenant_name;
    if (r.tenant != kNoTenant) {
      std::optional<tenants::TenantRef> t = tenant_of(r.tenant_name_string());
      if (!t.has_value()) {
        drop(absl::StrCat("its tenant \"", r.tenant_name_string(), "\" cannot be named"));
        continue;
      }
      f.tenant = t->id;
      tenant_name = t->name;
    }
    std::unique_ptr<Slab> slab;
    if (fd >= 0) {
      absl::StatusOr<std::unique_ptr<Slab>> adopted =
          backend_->AdoptSlab(r.device, r.size, kind, fd, f.identity);
      fd = -1;  // taken
      if (adopted.ok()) {
        slab = *std::move(adopted);
      } else {
        out.refused_handles.push_back(r.slab_id);
        out.notes.push_back(absl::StrCat("slab ", r.slab_id, ": its kept handle was refused (",
                                         adopted.status().message(),
                                         "); it waits for a client to give it back"));
      }
    }
    const bool awaiting = slab == nullptr;
    if (absl::Status s = pools_.pool(r.device).AdoptSlab(f, std::move(slab)); !s.ok()) {
      drop(std::string(s.message()));
      continue;
    }
    slabs[r.slab_id] = Adopted{r.device, f.tenant, tenant_name};
    ++out.slabs;
    if (awaiting) ++out.slabs_awaiting_handle;
  }
  for (const auto& [id, fd] : slab_fds) {
    close(fd);
    out.notes.push_back(absl::StrCat("a kept handle named for slab ", id,
                                     " matches no recorded slab: dropped"));
  }
  SlabPool::AdvanceSlabIdsPast(max_slab);

  // 3. Allocations, each in its exact place (in increasing offset order,
  // which AllocateAt restores in O(1) each).
  std::vector<const state::AllocationRecordData*> allocations;
  for (const state::AllocationRecordData& r : previous.allocations) allocations.push_back(&r);
  std::sort(allocations.begin(), allocations.end(), [](const auto* a, const auto* b) {
    return std::tie(a->slab_id, a->offset) < std::tie(b->slab_id, b->offset);
  });
  uint64_t max_id = 0;
  for (const state::AllocationRecordData* rp : allocations) {
    const state::AllocationRecordData& r = *rp;
    max_id = std::max(max_id, r.id);
    auto s = sessions.find(r.session);
    if (s == sessions.end()) {
      close_record(r, "its process ended while the daemon was down");
      continue;
    }
    auto slab = slabs.find(r.slab_id);
    if (slab == slabs.end()) {
      auto why = slab_dropped_why.find(r.slab_id);
      close_record(r, why != slab_dropped_why.end()
                          ? absl::StrCat("its slab did not survive the restart: ", why->second)
                          : "its slab did not survive the restart (no record of it)");
      continue;
    }
    if (slab->second.device != r.device) {
      close_record(r, "its record disagrees with its slab's device");
      continue;
    }
    absl::StatusOr<PoolBlock> block =
        pools_.pool(r.device).AdoptBlock(r.slab_id, r.offset, r.size);
    if (!block.ok()) {
      close_record(r, absl::StrCat("inconsistent with its slab: ", block.status().message()));
      continue;
    }
    AllocationRecord a;
    a.uid = r.uid;
    a.pid = r.pid;
    a.tenant = slab->second.tenant;
    a.device = r.device;
    a.charged = r.charged;
    a.block = *block;
    a.state_slot = r.slot;
    a.request_key = r.request_key;
    if (absl::Status t = table_.Restore(r.id, a, *s->second); !t.ok()) {
      pools_.pool(r.device).Release(*block);
      close_record(r, std::string(t.message()));
      continue;
    }
    if (options_.quotas != nullptr) options_.quotas->Charge(a.tenant, a.device, a.charged);
    ledger::LedgerEvent e;
    e.kind = ledger::EventKind::kAllocate;
    e.time_ns = r.time_ns;
    e.tenant = slab->second.tenant_name;
    e.uid = r.uid;
    e.pid = r.pid;
    e.session = r.session;
    e.device = static_cast<int32_t>(r.device);
    e.bytes = r.charged;
    e.allocation_id = r.id;
    out.survivors.push_back(std::move(e));
    ++out.allocations;
    absl::MutexLock lock(&restore_mu_);
    unconfirmed_[r.session].insert(r.id);
    if (r.request_key != 0) restored_keys_[{r.session, r.request_key}].push_back(r.id);
  }
  table_.AdvanceIdsPast(max_id);
  {
    absl::MutexLock lock(&restore_mu_);
    for (auto& [key, ids] : restored_keys_) std::sort(ids.begin(), ids.end());
    any_restored_keys_.store(!restored_keys_.empty(), std::memory_order_release);
  }

  // 4. Who holds which slab's handle.
  for (const state::HolderRecord& r : previous.holders) {
    auto slab = slabs.find(r.slab_id);
    if (slab == slabs.end() || !sessions.contains(r.session)) {
      out.dropped_holders.emplace_back(r.slab_id, r.session);
      continue;
    }
    pools_.pool(slab->second.device).AdoptHolder(r.slab_id, r.session);
  }

  {
    absl::MutexLock lock(&restore_mu_);
    closed_ = out.closed;
    closed_session_ = std::move(closed_session);
    restore_deadline_ = absl::Now() + options_.restore_grace;
  }
  return out;
}

absl::StatusOr<v1::ResumeResponse> MemoryBroker::Resume(const PeerCred& caller,
                                                        const v1::ResumeRequest& request) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  absl::StatusOr<std::shared_ptr<Session>> session = sessions_->Attach(caller);
  if (!session.ok()) return session.status();
  Session& s = **session;
  v1::ResumeResponse out;
  out.set_session_id(s.id());
  const bool same_session = request.session_id() == s.id();
  absl::flat_hash_set<uint64_t> claimed;
  absl::flat_hash_set<uint64_t> awaiting_slabs;
  for (uint32_t d = 0; d < pools_.size(); ++d) {
    for (const SlabFacts& f : pools_.pool(d).SlabsAwaitingHandles()) {
      awaiting_slabs.insert(f.slab_id);
    }
  }
  absl::flat_hash_set<uint64_t> needs_handle;
  // What the table has for each claimed id, looked up under its lock.
  struct Found {
    bool live = false;
    bool ours = false;
    bool matches = false;
  };
  absl::flat_hash_map<uint64_t, Found> found;
  absl::flat_hash_map<uint64_t, const v1::Allocation*> claims;
  for (const v1::Allocation& a : request.allocations()) claims[a.id()] = &a;
  table_.ForEach([&](uint64_t id, const AllocationRecord& r) {
    auto c = claims.find(id);
    if (c == claims.end()) return;
    Found& f = found[id];
    f.live = true;
    f.ours = r.session == &s;
    f.matches = r.block.slab_id == c->second->slab_id() &&
                r.block.offset == c->second->offset() &&
                r.block.size == c->second->size_bytes();
  });
  // Why a claimed allocation was closed at the restart, told only to its
  // own session (and admins): to anyone else it is one the daemon has no
  // record of.
  std::map<uint64_t, std::string> closed;
  const bool told_all = IsAdmin(caller);
  {
    absl::MutexLock lock(&restore_mu_);
    for (const auto& [id, a] : claims) {
      auto why = closed_.find(id);
      if (why == closed_.end()) continue;
      auto owner = closed_session_.find(id);
      if (told_all || (owner != closed_session_.end() && owner->second == s.id())) {
        closed.emplace(id, why->second);
      }
    }
  }
  auto lost = [&out](uint64_t id, absl::Status why) {
    v1::LostAllocation* l = out.add_lost();
    l->set_id(id);
    l->mutable_status()->set_code(static_cast<int32_t>(why.code()));
    l->mutable_status()->set_message(std::string(why.message()));
  };
  const bool admin = IsAdmin(caller);
  for (const auto& [id, a] : claims) {
    auto f = found.find(id);
    if (f == found.end() || !f->second.live) {
      auto why = closed.find(id);
      lost(id, absl::NotFoundError(absl::StrCat(
                   "allocation ", id, " did not survive the restart: ",
                   why != closed.end() ? why->second
                                       : (same_session ? "the daemon has no such allocation"
                                                       : "the daemon did not keep this session"))));
      continue;
    }
    if (!f->second.ours) {
      // Another session's: to a non-admin, as an id the daemon does not have.
      if (!admin) {
        lost(id, absl::NotFoundError(absl::StrCat(
                     "allocation ", id, " did not survive the restart: ",
                     same_session ? "the daemon has no such allocation"
                                  : "the daemon did not keep this session")));
        continue;
      }
      lost(id, absl::PermissionDeniedError(absl::StrCat(
                   "allocation ", id, " is not this session's: it is not given to it")));
      continue;
    }
    if (!f->second.matches) {
      lost(id, absl::FailedPreconditionError(absl::StrCat(
                   "allocation ", id, " is not where the claim says (another slab, offset or "
                   "size): the daemon keeps its own record")));
      continue;
    }
    claimed.insert(id);
    out.add_kept(id);
    if (awaiting_slabs.contains(a->slab_id())) needs_handle.insert(a->slab_id());
  }
  // Slabs it holds open that wait for their handle.
  for (uint64_t slab : awaiting_slabs) {
    for (uint32_t d = 0; d < pools_.size(); ++d) {
      if (pools_.pool(d).IsHolder(slab, s.id())) needs_handle.insert(slab);
    }
  }
  for (uint64_t slab : needs_handle) out.add_needs_handle(slab);
  // Restored blocks of this session no Resume has claimed yet. Several
  // clients of one process share its session, each claiming its own; what
  // none claims by the end of the grace time (an Allocate answered to
  // nobody, a block let go of) is freed then (FinishRestore).
  {
    absl::MutexLock lock(&restore_mu_);
    auto it = unconfirmed_.find(s.id());
    if (it != unconfirmed_.end()) {
      for (uint64_t id : claimed) it->second.erase(id);
      out.set_unclaimed(static_cast<uint32_t>(it->second.size()));
      if (it->second.empty()) unconfirmed_.erase(it);
    }
  }
  return out;
}

std::optional<v1::AllocateResponse> MemoryBroker::RetakeByKey(Session& session,
                                                             const Prepared& prepared) {
  if (!any_restored_keys_.load(std::memory_order_acquire)) return std::nullopt;
  const std::pair<uint64_t, uint64_t> key{session.id(), prepared.request_key};
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&restore_mu_);
    auto it = restored_keys_.find(key);
    if (it == restored_keys_.end()) return std::nullopt;
    ids = it->second;
  }
  // The records, looked up without restore_mu_ (the table's lock is taken
  // before it: events name tenants through TenantName). A record in the
  // table does not change; it may only leave it. Each must be just what the
  // request asks: as many shards, each of the size asked (what it was
  // charged), of the kind asked, at the alignment asked.
  const std::vector<uint64_t>& sizes = prepared.placement.plan.sizes;
  if (ids.size() != sizes.size()) return std::nullopt;
  std::vector<AllocationRecord> records;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<AllocationRecord> r = table_.Find(ids[i]);
    if (!r.has_value() || r->session != &session || r->charged != sizes[i] ||
        r->block.kind != prepared.kind || r->block.kind == HandleKind::kCudaIpc ||
        (prepared.placement.plan.alignment > 1 &&
         r->block.offset % prepared.placement.plan.alignment != 0)) {
      return std::nullopt;
    }
    records.push_back(*std::move(r));
  }
  {
    // Claimed all at once, and only if none was claimed (by a Resume or
    // another retry) or closed (the grace time's end) meanwhile.
    absl::MutexLock lock(&restore_mu_);
    auto u = unconfirmed_.find(session.id());
    if (u == unconfirmed_.end()) return std::nullopt;
    for (uint64_t id : ids) {
      if (!u->second.contains(id)) return std::nullopt;
    }
    for (uint64_t id : ids) u->second.erase(id);
    if (u->second.empty()) unconfirmed_.erase(u);
    restored_keys_.erase(key);
    if (restored_keys_.empty()) any_restored_keys_.store(false, std::memory_order_relaxed);
  }
  v1::AllocateResponse response;
  for (size_t i = 0; i < ids.size(); ++i) Describe(ids[i], records[i], response.add_allocations());
  return response;
}

absl::Status MemoryBroker::AcceptSlabHandle(const PeerCred& caller, uint64_t slab_id, int fd) {
  auto refuse = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return refuse(ShuttingDown());
  absl::StatusOr<std::shared_ptr<Session>> session = sessions_->Attach(caller);
  if (!session.ok()) return refuse(session.status());
  absl::StatusOr<tenants::TenantRef> tenant = TenantOfSession(**session, caller);
  if (!tenant.ok()) return refuse(tenant.status());
  for (uint32_t d = 0; d < pools_.size(); ++d) {
    SlabPool& pool = pools_.pool(d);
    for (const SlabFacts& f : pool.SlabsAwaitingHandles()) {
      if (f.slab_id != slab_id) continue;
      if (f.tenant != tenant->id && f.tenant != kNoTenant) {
        // To a non-admin, another tenant's slab is one that does not exist.
        if (!IsAdmin(caller)) return refuse(absl::NotFoundError(absl::StrCat("no slab ", slab_id)));
        return refuse(absl::PermissionDeniedError(absl::StrCat(
            "slab ", slab_id, " is not tenant \"", tenant->name, "\"'s")));
      }
      // Only a session the last daemon gave this slab's handle to may give it
      // back: what the backend can check of a handle (on cuda, its size and
      // device) would not tell another allocation of the same shape apart.
      if (!pool.IsHolder(slab_id, (*session)->id())) {
        return refuse(absl::PermissionDeniedError(absl::StrCat(
            "session ", (*session)->id(), " was never given slab ", slab_id,
            "'s handle: only a process that had it open may give it back")));
      }
      absl::StatusOr<std::unique_ptr<Slab>> slab =
          backend_->AdoptSlab(f.device, f.size, f.kind, fd, f.identity);
      if (!slab.ok()) {
        return absl::PermissionDeniedError(absl::StrCat(
            "not slab ", slab_id, "'s handle: ", slab.status().message()));
      }
      return pool.CompleteSlab(slab_id, *std::move(slab));
    }
    if (pool.HasSlab(slab_id)) {
      // Its handle is back already; said only of the caller's own slabs.
      bool own = IsAdmin(caller);
      for (const SlabStats& s : pool.Slabs()) {
        if (s.slab_id == slab_id) own = own || s.tenant == tenant->id || s.tenant == kNoTenant;
      }
      if (own) return refuse(absl::OkStatus());
      break;
    }
  }
  return refuse(absl::NotFoundError(absl::StrCat("no slab ", slab_id)));
}

absl::StatusOr<std::shared_ptr<Session>> MemoryBroker::RebindConnection(
    const PeerCred& caller, absl::string_view token) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  return sessions_->RebindConnection(token, caller);
}

void MemoryBroker::FinishRestoreSlabs() {
  const std::string why = absl::StrCat(
      "its slab's handle did not come back within ",
      absl::FormatDuration(options_.restore_grace), " of the restart");
  for (uint32_t d = 0; d < pools_.size(); ++d) {
    SlabPool& pool = pools_.pool(d);
    for (const SlabFacts& f : pool.SlabsAwaitingHandles()) {
      std::vector<uint64_t> ids;
      table_.ForEach([&](uint64_t id, const AllocationRecord& r) {
        if (r.block.slab_id == f.slab_id) ids.push_back(id);
      });
      Return(table_.TakeAll(ids, ledger::EventKind::kDaemonRestart, why));
      // Held by live sessions it stays counted (retained) until they let go.
      pool.DropAwaitingSlab(f.slab_id);
    }
  }
}

void MemoryBroker::FinishRestore() {
  {
    absl::ReaderMutexLock gate(&gate_);
    if (shut_down_) return;
    FinishRestoreSlabs();
  }
  // Without the gate: each session's end takes it (OnSessionEnd); taken
  // again by a thread that holds it shared, it deadlocks once a writer
  // (Shutdown) waits between the two.
  sessions_->ExpireUnbound();
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return;
  // Blocks no client of their (live) session re-presented in time.
  std::vector<uint64_t> unclaimed;
  {
    absl::MutexLock lock(&restore_mu_);
    for (const auto& [session, ids] : unconfirmed_) {
      unclaimed.insert(unclaimed.end(), ids.begin(), ids.end());
    }
    unconfirmed_.clear();
    restored_keys_.clear();
    any_restored_keys_.store(false, std::memory_order_relaxed);
  }
  if (!unclaimed.empty()) {
    Return(table_.TakeAll(unclaimed, ledger::EventKind::kFree,
                          absl::StrCat("not re-presented by its session within ",
                                       absl::FormatDuration(options_.restore_grace),
                                       " of the restart")));
  }
}

}  // namespace gpumem
