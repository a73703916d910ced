// MemoryBroker::Stats: one caller's view of the devices, tenants, sessions
// and counters (stats_view.h). Visibility is decided here, in the core: device
// figures and counters for everyone; tenants, sessions and slab owners only
// of the caller's own uid (its tenant in the directory in force, and those
// its live sessions are charged to), unless the caller is an administrator.
// A caller through a tenant's socket is that tenant, not its uid: it sees
// that tenant and the sessions opened through that socket, never others of
// its uid (SamePrincipal). Socket tenants are listed even while they hold
// nothing, so their existence and quota show.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "server/core/memory_broker.h"

namespace gpumem {

StatsView MemoryBroker::Stats(const PeerCred& caller, bool include_slabs) const {
  const std::vector<DeviceInfo>& devices = backend_->devices();
  const bool admin = IsAdmin(caller);
  // One snapshot of the directory for the whole answer (names, own tenant).
  const std::shared_ptr<const tenants::TenantDirectory> dir = tenants_->Get();
  const std::vector<std::shared_ptr<Session>> sessions = sessions_->List();
  // The caller's own tenants: the one the directory in force gives it, and
  // those its uid's live sessions are charged to (they may differ after a
  // reload). A caller the config gives no tenant, and no session, sees no
  // tenant's figures.
  absl::flat_hash_set<uint32_t> own_tenants;
  if (!admin) {
    absl::StatusOr<tenants::TenantRef> mine =
        dir->ResolveCaller(caller.uid, caller.gid, caller.socket_tenant);
    if (mine.ok()) own_tenants.insert(mine->id);
    for (const std::shared_ptr<Session>& s : sessions) {
      if (!SamePrincipal(s->cred(), caller)) continue;
      if (std::optional<tenants::TenantRef> t = s->tenant()) own_tenants.insert(t->id);
    }
  }
  auto visible = [&](uint32_t tenant) { return admin || own_tenants.contains(tenant); };

  StatsView out;
  out.backend = backend_->name();
  out.counters = counters_.View();
  out.counters.waiting_requests = admission_.waiting();
  out.counters.restart_lost_allocations = restorer_->LostAllocations();
  const absl::flat_hash_map<uint32_t, uint32_t> waiting = admission_.waiting_by_tenant();
  absl::ReaderMutexLock gate(&gate_);
  // tenant -> device -> figures; session -> retained bytes.
  absl::flat_hash_map<uint32_t, std::vector<TenantPoolStats>> tenants;
  absl::flat_hash_map<uint64_t, uint64_t> session_retained;
  for (const DeviceInfo& d : devices) {
    DeviceStatsView& dv = out.devices.emplace_back();
    dv.info = d;
    // The driver's own view first (no pool lock is held here): asking also
    // tells the backend what room the device has, which the pool's free
    // figure below is held within (Backend::NewSlabRoom).
    absl::StatusOr<DriverMemInfo> driver = backend_->DriverMemory(d.index);
    if (driver.ok()) dv.driver = *driver;
    dv.pool.total_bytes = d.total_bytes;
    dv.pool.largest_carvable = d.total_bytes;  // after Shutdown: all free
    dv.pool.free_bytes = d.total_bytes;
    if (!shut_down_) {
      const SlabPool& pool = pools_.pool(d.index);
      dv.pool = pool.Stats();
      if (include_slabs) {
        dv.slabs = pool.Slabs();
        for (const SlabStats& slab : dv.slabs) {
          dv.slab_owner_visible.push_back(visible(slab.tenant));
        }
      }
      for (const auto& [tenant, t] : pool.TenantStats()) {
        if (!visible(tenant)) continue;
        auto& row = tenants[tenant];
        row.resize(devices.size());
        row[d.index] = t;
      }
      for (const auto& [session, bytes] : pool.SessionRetained()) {
        session_retained[session] += bytes;
      }
    }
    dv.granularity_bytes = backend_->Granularity(d.index);
    dv.peers = peer_rows_[d.index];
  }
  // Tenants that only wait hold nothing yet, but are shown with their
  // waiting requests; socket tenants are shown as they are.
  for (const auto& [tenant, count] : waiting) {
    if (visible(tenant) && !shut_down_) tenants[tenant].resize(devices.size());
  }
  for (const tenants::Tenant& t : dir->tenants()) {
    if (!t.socket.empty() && visible(t.id) && !shut_down_) tenants[t.id].resize(devices.size());
  }
  for (auto& [id, rows] : tenants) {
    TenantStatsView& tv = out.tenants.emplace_back();
    tv.id = id;
    tv.name = dir->NameOf(id);
    if (options_.quotas != nullptr) {  // absent: no quota
      tenants::Quota quota = options_.quotas->GetQuota(id);
      if (!quota.unlimited()) tv.quota = std::move(quota);
      // The most it held at once in committed allocations (quota_book.h).
      tv.peak_bytes = options_.quotas->Holdings(id).peak_total_bytes;
    }
    tv.devices = std::move(rows);
    if (auto w = waiting.find(id); w != waiting.end()) tv.waiting_requests = w->second;
  }
  std::sort(out.tenants.begin(), out.tenants.end(),
            [](const TenantStatsView& a, const TenantStatsView& b) { return a.id < b.id; });
  if (shut_down_) return out;
  for (const std::shared_ptr<Session>& s : sessions) {
    if (!admin && !SamePrincipal(s->cred(), caller)) continue;
    Session::Figures f = s->figures();
    if (f.ended) continue;
    SessionStatsView& sv = out.sessions.emplace_back();
    sv.id = s->id();
    sv.cred = s->cred();
    sv.figures = std::move(f);
    auto r = session_retained.find(s->id());
    sv.retained_bytes = r == session_retained.end() ? 0 : r->second;
  }
  std::sort(out.sessions.begin(), out.sessions.end(),
            [](const SessionStatsView& a, const SessionStatsView& b) { return a.id < b.id; });
  return out;
}

}  // namespace gpumem
