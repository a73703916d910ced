// Restore walks the records in dependency order (sessions, slabs,
// allocations, holders), each step adopting into the room that owns it.
// Resume walks downhill from the claims: one table lookup each, then the
// window's books once (under mu_), then the pools only for the slabs that
// may still wait for a handle. mu_ is never held across a call into a room:
// the table and the pools call back into RestoredTenantName under their own
// locks.
#include "server/restart/restorer.h"

#include <unistd.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gpumem {

namespace {

// Ids for restored tenants the directory in force no longer has: above any
// configured tenant's (which start at 1 and grow by one per new tenant).
constexpr uint32_t kRestoredTenantIds = 0x40000000u;

}  // namespace

std::string RestoreOutcome::Summary() const {
  return absl::StrCat(allocations, " allocation(s) in ", slabs, " slab(s) of ", sessions,
                      " session(s) survived the restart; ", slabs_awaiting_handle,
                      " slab(s) wait for a client to give their handle back; closed: ",
                      allocations_closed, " allocation(s), ", slabs_dropped, " slab(s), ",
                      sessions_gone, " session(s) whose process is gone");
}

Restorer::Restorer(Rooms rooms, absl::Duration grace) : rooms_(std::move(rooms)), grace_(grace) {}

// One Restore's working state: what each step adopted, for the steps after
// it, and what the window will keep once all are done.
struct Restorer::Pass {
  struct Adopted {
    uint32_t device = 0;
    uint32_t tenant = 0;
    std::string tenant_name;
  };

  const state::Snapshot& previous;
  RestoreOutcome& out;
  const std::shared_ptr<const tenants::TenantDirectory> dir;
  // Ids given here to tenants the directory no longer has, by name.
  uint32_t next_restored_id = kRestoredTenantIds;
  absl::flat_hash_map<std::string, uint32_t> retired;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions;  // by record id
  absl::flat_hash_map<uint64_t, Adopted> slabs;                      // by slab id
  absl::flat_hash_map<uint64_t, std::string> slab_dropped_why;
  // For the window.
  absl::flat_hash_map<uint64_t, AwaitingSlab> awaiting;
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> awaiting_held;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> unconfirmed;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>> keys;
  // The session each closed allocation was of.
  std::map<uint64_t, uint64_t> closed_session;
};

// Sessions first (a process-bound one only if the very same process still
// runs), then slabs (each adopted from its kept handle, which the backend
// checks is that slab's, or left waiting for a client to give the handle
// back), then every allocation in its exact place in its slab
// (OffsetAllocator::AllocateAt) with its id and its charge, then who holds
// which slab. Anything that does not fit (its session gone, its slab not
// restored, its range not free) is closed, saying why.
RestoreOutcome Restorer::Restore(const state::Snapshot& previous,
                                 std::map<uint64_t, int> slab_fds) {
  RestoreOutcome out;
  Pass pass{previous, out, rooms_.directory->Get()};
  RestoreSessions(pass);
  RestoreSlabs(pass, std::move(slab_fds));
  RestoreAllocations(pass);
  RestoreHolders(pass);

  for (auto& [key, ids] : pass.keys) std::sort(ids.begin(), ids.end());
  // The window opens (a restorer restores once: what it had is replaced).
  absl::MutexLock lock(&mu_);
  unconfirmed_ = std::move(pass.unconfirmed);
  restored_keys_ = std::move(pass.keys);
  any_restored_keys_.store(!restored_keys_.empty(), std::memory_order_release);
  awaiting_ = std::move(pass.awaiting);
  awaiting_held_ = std::move(pass.awaiting_held);
  closed_ = out.closed;
  lost_.fetch_add(out.allocations_closed, std::memory_order_relaxed);
  closed_session_ = std::move(pass.closed_session);
  deadline_ = absl::Now() + grace_;
  return out;
}

// The same name in the directory in force, or (a tenant the config no
// longer has) an id of its own here.
std::optional<tenants::TenantRef> Restorer::TenantNamed(Pass& pass, const std::string& name) {
  if (name.empty()) return std::nullopt;
  const tenants::TenantDirectory& dir = *pass.dir;
  // A listed tenant (configured, or a socket tenant in either mode).
  if (const tenants::Tenant* t = dir.Find(name)) {
    return tenants::TenantRef{t->id, name, t->priority, t->max_waiting_requests, t->max_sessions};
  }
  if (!dir.configured()) {
    std::optional<uint32_t> uid = tenants::UidOfTenantName(name);
    if (!uid.has_value()) return std::nullopt;
    return dir.Resolve(*uid, *uid).value_or(tenants::TenantRef{*uid, name});
  }
  if (std::optional<uint32_t> id = dir.IdOf(name)) {
    const tenants::Tenant* t = dir.FindId(*id);
    return tenants::TenantRef{*id, name, t->priority, t->max_waiting_requests, t->max_sessions};
  }
  auto [it, fresh] = pass.retired.try_emplace(name, pass.next_restored_id);
  if (fresh) {
    ++pass.next_restored_id;
    absl::MutexLock lock(&mu_);
    restored_names_[it->second] = name;
    any_restored_names_.store(true, std::memory_order_release);
  }
  return tenants::TenantRef{it->second, name, 0, tenants::kDefaultMaxWaitingRequests};
}

void Restorer::RestoreSessions(Pass& pass) {
  uint64_t max_session = 0;
  for (const state::SessionRecord& r : pass.previous.sessions) {
    max_session = std::max(max_session, r.id);
    std::optional<tenants::TenantRef> tenant;
    if (r.tenant_fixed) tenant = TenantNamed(pass, r.tenant_name_string());
    if (r.via_socket) {
      // Through a tenant's socket: that tenant must still be one with a
      // socket (socket tenants are back in the directory before this).
      const tenants::Tenant* t = tenant.has_value() ? pass.dir->FindId(tenant->id) : nullptr;
      if (t == nullptr || t->socket.empty()) tenant.reset();
    }
    absl::StatusOr<std::shared_ptr<Session>> s = rooms_.sessions->Restore(r, tenant);
    if (!s.ok()) {
      ++pass.out.sessions_gone;
      if (rooms_.state != nullptr) rooms_.state->RemoveSession(r.slot);
      continue;
    }
    pass.sessions[r.id] = *s;
    ++pass.out.sessions;
  }
  rooms_.sessions->AdvanceIdsPast(max_session);
}

void Restorer::RestoreSlabs(Pass& pass, std::map<uint64_t, int> slab_fds) {
  RestoreOutcome& out = pass.out;
  uint64_t max_slab = 0;
  for (const state::SlabRecord& r : pass.previous.slabs) {
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
      pass.slab_dropped_why[r.slab_id] = why;
      ++out.slabs_dropped;
      out.notes.push_back(absl::StrCat("slab ", r.slab_id, " dropped: ", why));
    };
    if (r.device >= rooms_.pools->size()) {
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
      std::optional<tenants::TenantRef> t = TenantNamed(pass, r.tenant_name_string());
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
          rooms_.backend->AdoptSlab(r.device, r.size, kind, fd, f.identity);
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
    const bool awaits = slab == nullptr;
    if (absl::Status s = rooms_.pools->pool(r.device).AdoptSlab(f, std::move(slab)); !s.ok()) {
      drop(std::string(s.message()));
      continue;
    }
    pass.slabs[r.slab_id] = Pass::Adopted{r.device, f.tenant, tenant_name};
    ++out.slabs;
    if (awaits) {
      ++out.slabs_awaiting_handle;
      pass.awaiting[r.slab_id].device = r.device;
    }
  }
  for (const auto& [id, fd] : slab_fds) {
    close(fd);
    out.notes.push_back(absl::StrCat("a kept handle named for slab ", id,
                                     " matches no recorded slab: dropped"));
  }
  SlabPool::AdvanceSlabIdsPast(max_slab);
}

// Each in its exact place, in increasing offset order (which AllocateAt
// restores in O(1) each), and unconfirmed until a client claims it.
void Restorer::RestoreAllocations(Pass& pass) {
  RestoreOutcome& out = pass.out;
  auto close_record = [&](const state::AllocationRecordData& r, const std::string& why) {
    out.closed[r.id] = why;
    pass.closed_session[r.id] = r.session;
    ++out.allocations_closed;
    if (rooms_.state != nullptr) rooms_.state->RemoveAllocation(r.slot);
  };
  std::vector<const state::AllocationRecordData*> allocations;
  for (const state::AllocationRecordData& r : pass.previous.allocations) allocations.push_back(&r);
  std::sort(allocations.begin(), allocations.end(), [](const auto* a, const auto* b) {
    return std::tie(a->slab_id, a->offset) < std::tie(b->slab_id, b->offset);
  });
  uint64_t max_id = 0;
  for (const state::AllocationRecordData* rp : allocations) {
    const state::AllocationRecordData& r = *rp;
    max_id = std::max(max_id, r.id);
    auto s = pass.sessions.find(r.session);
    if (s == pass.sessions.end()) {
      close_record(r, "its process ended while the daemon was down");
      continue;
    }
    auto slab = pass.slabs.find(r.slab_id);
    if (slab == pass.slabs.end()) {
      auto why = pass.slab_dropped_why.find(r.slab_id);
      close_record(r, why != pass.slab_dropped_why.end()
                          ? absl::StrCat("its slab did not survive the restart: ", why->second)
                          : "its slab did not survive the restart (no record of it)");
      continue;
    }
    if (slab->second.device != r.device) {
      close_record(r, "its record disagrees with its slab's device");
      continue;
    }
    SlabPool& pool = rooms_.pools->pool(r.device);
    absl::StatusOr<PoolBlock> block = pool.AdoptBlock(r.slab_id, r.offset, r.size);
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
    if (absl::Status t = rooms_.table->Restore(r.id, a, *s->second); !t.ok()) {
      pool.Release(*block);
      close_record(r, std::string(t.message()));
      continue;
    }
    if (rooms_.quotas != nullptr) rooms_.quotas->Charge(a.tenant, a.device, a.charged);
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
    pass.unconfirmed[r.session].insert(r.id);
    if (r.request_key != 0) pass.keys[{r.session, r.request_key}].push_back(r.id);
    if (auto w = pass.awaiting.find(r.slab_id); w != pass.awaiting.end()) {
      w->second.allocations.push_back(r.id);
    }
  }
  rooms_.table->AdvanceIdsPast(max_id);
}

void Restorer::RestoreHolders(Pass& pass) {
  for (const state::HolderRecord& r : pass.previous.holders) {
    auto slab = pass.slabs.find(r.slab_id);
    if (slab == pass.slabs.end() || !pass.sessions.contains(r.session)) {
      pass.out.dropped_holders.emplace_back(r.slab_id, r.session);
      continue;
    }
    rooms_.pools->pool(slab->second.device).AdoptHolder(r.slab_id, r.session);
    if (pass.awaiting.contains(r.slab_id)) pass.awaiting_held[r.session].push_back(r.slab_id);
  }
}

absl::StatusOr<v1::ResumeResponse> Restorer::Resume(const PeerCred& caller,
                                                    const v1::ResumeRequest& request) {
  absl::StatusOr<std::shared_ptr<Session>> session = rooms_.sessions->Attach(caller);
  if (!session.ok()) return session.status();
  const Session& s = **session;
  v1::ResumeResponse out;
  out.set_session_id(s.id());
  const bool same_session = request.session_id() == s.id();
  // One entry per id claimed (the last claim of an id counts).
  absl::flat_hash_map<uint64_t, const v1::Allocation*> claims;
  for (const v1::Allocation& a : request.allocations()) claims[a.id()] = &a;

  // 1. Each claim against the table: one lookup each.
  enum class Verdict { kKept, kNotLive, kOthers, kMisplaced };
  std::vector<std::pair<uint64_t, Verdict>> verdicts;
  verdicts.reserve(claims.size());
  absl::flat_hash_map<uint64_t, uint32_t> kept_slabs;  // slab -> device
  for (const auto& [id, a] : claims) {
    std::optional<AllocationRecord> r = rooms_.table->Find(id);
    Verdict v = Verdict::kKept;
    if (!r.has_value()) {
      v = Verdict::kNotLive;
    } else if (r->session != &s) {
      v = Verdict::kOthers;
    } else if (r->block.slab_id != a->slab_id() || r->block.offset != a->offset() ||
               r->block.size != a->size_bytes()) {
      v = Verdict::kMisplaced;
    } else {
      kept_slabs.emplace(r->block.slab_id, r->device);
    }
    verdicts.emplace_back(id, v);
  }

  // Why a claimed allocation was closed at the restart is told only to its
  // own session (and admins): to anyone else it is one the daemon never had.
  const bool told_all =
      std::any_of(verdicts.begin(), verdicts.end(),
                  [](const auto& v) { return v.second == Verdict::kNotLive; }) &&
      rooms_.admins->IsAdmin(caller);

  // 2. The window's books, once: why the claims not live were closed, the
  // kept ones confirmed, and which of the slabs this session claims or holds
  // may still wait for their handle.
  absl::flat_hash_map<uint64_t, std::string> closed_why;
  std::vector<std::pair<uint64_t, uint32_t>> maybe_claimed, maybe_held;  // (slab, device)
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, v] : verdicts) {
      if (v != Verdict::kNotLive) continue;
      auto why = closed_.find(id);
      if (why == closed_.end()) continue;
      auto owner = closed_session_.find(id);
      if (told_all || (owner != closed_session_.end() && owner->second == s.id())) {
        closed_why[id] = why->second;
      }
    }
    // Restored blocks of this session no Resume has claimed yet. Several
    // clients of one process share its session, each claiming its own; what
    // none claims by the end of the grace time (an Allocate answered to
    // nobody, a block let go of) is freed then.
    if (auto u = unconfirmed_.find(s.id()); u != unconfirmed_.end()) {
      for (const auto& [id, v] : verdicts) {
        if (v == Verdict::kKept) u->second.erase(id);
      }
      out.set_unclaimed(static_cast<uint32_t>(u->second.size()));
      if (u->second.empty()) unconfirmed_.erase(u);
    }
    if (!awaiting_.empty()) {
      for (const auto& [slab, device] : kept_slabs) {
        if (awaiting_.contains(slab)) maybe_claimed.emplace_back(slab, device);
      }
      if (auto h = awaiting_held_.find(s.id()); h != awaiting_held_.end()) {
        for (uint64_t slab : h->second) {
          if (auto w = awaiting_.find(slab); w != awaiting_.end()) {
            maybe_held.emplace_back(slab, w->second.device);
          }
        }
      }
    }
  }

  // 3. The answer.
  auto lost = [&out](uint64_t id, absl::Status why) {
    v1::LostAllocation* l = out.add_lost();
    l->set_id(id);
    l->mutable_status()->set_code(static_cast<int32_t>(why.code()));
    l->mutable_status()->set_message(std::string(why.message()));
  };
  const std::string not_kept =
      same_session ? "the daemon has no such allocation" : "the daemon did not keep this session";
  std::optional<bool> admin;
  for (const auto& [id, v] : verdicts) {
    switch (v) {
      case Verdict::kKept:
        out.add_kept(id);
        break;
      case Verdict::kNotLive: {
        auto why = closed_why.find(id);
        lost(id, absl::NotFoundError(absl::StrCat("allocation ", id,
                                                  " did not survive the restart: ",
                                                  why != closed_why.end() ? why->second
                                                                          : not_kept)));
        break;
      }
      case Verdict::kOthers:
        // Another session's: to a non-admin, as an id the daemon does not have.
        if (!admin.has_value()) admin = rooms_.admins->IsAdmin(caller);
        lost(id, *admin ? absl::PermissionDeniedError(absl::StrCat(
                              "allocation ", id, " is not this session's: it is not given to it"))
                        : absl::NotFoundError(absl::StrCat(
                              "allocation ", id, " did not survive the restart: ", not_kept)));
        break;
      case Verdict::kMisplaced:
        lost(id, absl::FailedPreconditionError(absl::StrCat(
                     "allocation ", id, " is not where the claim says (another slab, offset or "
                     "size): the daemon keeps its own record")));
        break;
    }
  }
  // Slabs it claims blocks of, or holds open, that still wait for their handle.
  absl::flat_hash_set<uint64_t> needs_handle;
  for (const auto& [slab, device] : maybe_claimed) {
    std::optional<SlabPool::SlabState> st = rooms_.pools->pool(device).FindSlab(slab);
    if (st.has_value() && st->awaiting_handle) needs_handle.insert(slab);
  }
  for (const auto& [slab, device] : maybe_held) {
    if (needs_handle.contains(slab)) continue;
    SlabPool& pool = rooms_.pools->pool(device);
    std::optional<SlabPool::SlabState> st = pool.FindSlab(slab);
    if (st.has_value() && st->awaiting_handle && pool.IsHolder(slab, s.id())) {
      needs_handle.insert(slab);
    }
  }
  for (uint64_t slab : needs_handle) out.add_needs_handle(slab);
  return out;
}

std::optional<std::vector<std::pair<uint64_t, AllocationRecord>>> Restorer::RetakeByKey(
    const Session& session, uint64_t request_key, const std::vector<uint64_t>& sizes,
    HandleKind kind, uint64_t alignment) {
  if (!any_restored_keys_.load(std::memory_order_acquire)) return std::nullopt;
  const std::pair<uint64_t, uint64_t> key{session.id(), request_key};
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    auto it = restored_keys_.find(key);
    if (it == restored_keys_.end()) return std::nullopt;
    ids = it->second;
  }
  // The records, looked up without mu_. A record in the table does not
  // change; it may only leave it. Each must be just what the request asks:
  // as many shards, each of the size asked (what it was charged), of the
  // kind asked, at the alignment asked.
  if (ids.size() != sizes.size()) return std::nullopt;
  std::vector<std::pair<uint64_t, AllocationRecord>> records;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<AllocationRecord> r = rooms_.table->Find(ids[i]);
    if (!r.has_value() || r->session != &session || r->charged != sizes[i] ||
        r->block.kind != kind || r->block.kind == HandleKind::kCudaIpc ||
        (alignment > 1 && r->block.offset % alignment != 0)) {
      return std::nullopt;
    }
    records.emplace_back(ids[i], *std::move(r));
  }
  // Claimed all at once, and only if none was claimed (by a Resume or
  // another retry) or closed (the grace time's end) meanwhile.
  absl::MutexLock lock(&mu_);
  auto u = unconfirmed_.find(session.id());
  if (u == unconfirmed_.end()) return std::nullopt;
  for (uint64_t id : ids) {
    if (!u->second.contains(id)) return std::nullopt;
  }
  for (uint64_t id : ids) u->second.erase(id);
  if (u->second.empty()) unconfirmed_.erase(u);
  restored_keys_.erase(key);
  if (restored_keys_.empty()) any_restored_keys_.store(false, std::memory_order_relaxed);
  return records;
}

absl::Status Restorer::AcceptSlabHandle(const PeerCred& caller, uint64_t slab_id, int fd) {
  auto refuse = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  absl::StatusOr<std::shared_ptr<Session>> session = rooms_.sessions->Attach(caller);
  if (!session.ok()) return refuse(session.status());
  absl::StatusOr<tenants::TenantRef> tenant = rooms_.session_tenants->Charge(**session, caller);
  if (!tenant.ok()) return refuse(tenant.status());
  SlabPool* pool = rooms_.pools->PoolOfSlab(slab_id);
  std::optional<SlabPool::SlabState> slab;
  if (pool != nullptr) slab = pool->FindSlab(slab_id);
  if (!slab.has_value()) return refuse(absl::NotFoundError(absl::StrCat("no slab ", slab_id)));
  const SlabFacts& f = slab->facts;
  const bool own = f.tenant == tenant->id || f.tenant == kNoTenant;
  if (!slab->awaiting_handle) {
    // Its handle is back already; said only of the caller's own slabs.
    if (own || rooms_.admins->IsAdmin(caller)) return refuse(absl::OkStatus());
    return refuse(absl::NotFoundError(absl::StrCat("no slab ", slab_id)));
  }
  if (!own) {
    // To a non-admin, another tenant's slab is one that does not exist.
    if (!rooms_.admins->IsAdmin(caller)) {
      return refuse(absl::NotFoundError(absl::StrCat("no slab ", slab_id)));
    }
    return refuse(absl::PermissionDeniedError(
        absl::StrCat("slab ", slab_id, " is not tenant \"", tenant->name, "\"'s")));
  }
  // Only a session the last daemon gave this slab's handle to may give it
  // back: what the backend can check of a handle (on cuda, its size and
  // device) would not tell another allocation of the same shape apart.
  if (!pool->IsHolder(slab_id, (*session)->id())) {
    return refuse(absl::PermissionDeniedError(absl::StrCat(
        "session ", (*session)->id(), " was never given slab ", slab_id,
        "'s handle: only a process that had it open may give it back")));
  }
  absl::StatusOr<std::unique_ptr<Slab>> adopted =
      rooms_.backend->AdoptSlab(f.device, f.size, f.kind, fd, f.identity);
  if (!adopted.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("not slab ", slab_id, "'s handle: ", adopted.status().message()));
  }
  absl::Status completed = pool->CompleteSlab(slab_id, *std::move(adopted));
  if (completed.ok()) {
    absl::MutexLock lock(&mu_);
    awaiting_.erase(slab_id);
  }
  return completed;
}

absl::StatusOr<std::shared_ptr<Session>> Restorer::RebindConnection(const PeerCred& caller,
                                                                    absl::string_view token) {
  return rooms_.sessions->RebindConnection(token, caller);
}

std::optional<std::string> Restorer::RestoredTenantName(uint32_t id) const {
  if (!any_restored_names_.load(std::memory_order_acquire)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = restored_names_.find(id);
  if (it == restored_names_.end()) return std::nullopt;
  return it->second;
}

bool Restorer::GraceOver(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (now < deadline_) return false;
  deadline_ = absl::InfiniteFuture();
  return true;
}

void Restorer::CloseSlabsWithoutHandle() {
  absl::flat_hash_map<uint64_t, AwaitingSlab> awaiting;
  {
    absl::MutexLock lock(&mu_);
    awaiting.swap(awaiting_);
    awaiting_held_.clear();
  }
  // Device by device, each in slab order, as the pools list their slabs.
  std::vector<std::pair<uint32_t, uint64_t>> order;
  for (const auto& [slab, a] : awaiting) order.emplace_back(a.device, slab);
  std::sort(order.begin(), order.end());
  const std::string why = absl::StrCat("its slab's handle did not come back within ",
                                       absl::FormatDuration(grace_), " of the restart");
  for (const auto& [device, slab] : order) {
    SlabPool& pool = rooms_.pools->pool(device);
    std::optional<SlabPool::SlabState> st = pool.FindSlab(slab);
    if (!st.has_value() || !st->awaiting_handle) continue;
    const std::vector<AllocationRecord> lost =
        rooms_.table->TakeAll(awaiting[slab].allocations, ledger::EventKind::kDaemonRestart, why);
    lost_.fetch_add(lost.size(), std::memory_order_relaxed);
    rooms_.give_back(lost);
    // Held by live sessions it stays counted (retained) until they let go.
    pool.DropAwaitingSlab(slab);
  }
}

void Restorer::EndUnboundSessions() { rooms_.sessions->ExpireUnbound(); }

void Restorer::FreeUnclaimed() {
  std::vector<uint64_t> unclaimed;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [session, ids] : unconfirmed_) {
      unclaimed.insert(unclaimed.end(), ids.begin(), ids.end());
    }
    unconfirmed_.clear();
    restored_keys_.clear();
    any_restored_keys_.store(false, std::memory_order_relaxed);
  }
  if (unclaimed.empty()) return;
  const std::vector<AllocationRecord> lost = rooms_.table->TakeAll(
      unclaimed, ledger::EventKind::kFree,
      absl::StrCat("not re-presented by its session within ", absl::FormatDuration(grace_),
                   " of the restart"));
  lost_.fetch_add(lost.size(), std::memory_order_relaxed);
  rooms_.give_back(lost);
}

}  // namespace gpumem
