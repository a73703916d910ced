#include "server/service/stats_proto.h"

#include <algorithm>

#include "server/service/quota_proto.h"

namespace gpumem {
namespace {

v1::PeerLink ToWire(PeerLink link) {
  switch (link) {
    case PeerLink::kSelf: return v1::PEER_LINK_SELF;
    case PeerLink::kNvLink: return v1::PEER_LINK_NVLINK;
    case PeerLink::kPcie: return v1::PEER_LINK_PCIE;
    case PeerLink::kHost: return v1::PEER_LINK_HOST;
  }
  return v1::PEER_LINK_UNSPECIFIED;
}

void RenderDevice(const DeviceStatsView& dv, v1::DeviceStats* ds) {
  const DeviceInfo& d = dv.info;
  const PoolStats& stats = dv.pool;
  ds->set_index(d.index);
  ds->set_uuid(d.uuid);
  ds->set_name(d.name);
  ds->set_pci_bus_id(d.pci_bus_id);
  ds->set_numa_node(d.numa_node);
  ds->set_total_bytes(d.total_bytes);
  ds->set_pooled_bytes(stats.pooled_bytes);
  ds->set_used_bytes(stats.used_bytes);
  ds->set_retained_bytes(stats.retained_bytes);
  ds->set_free_bytes(stats.free_bytes);  // within the device's room (NewSlabRoom)
  ds->set_largest_free_block_bytes(stats.largest_carvable);
  ds->set_fragmentation(stats.fragmentation);
  ds->set_slab_count(stats.slab_count);
  ds->set_allocation_count(stats.live_blocks);
  ds->set_granularity_bytes(dv.granularity_bytes);
  if (dv.driver.has_value()) {
    ds->set_driver_free_bytes(dv.driver->free_bytes);
    ds->set_driver_total_bytes(dv.driver->total_bytes);
  }
  for (PeerLink link : dv.peers) ds->add_peers(ToWire(link));
  for (size_t i = 0; i < dv.slabs.size(); ++i) {
    const SlabStats& slab = dv.slabs[i];
    // Slab figures are device figures, but whose slab it is, and its id,
    // are not: to a non-admin another tenant's slab has no id (0), so its
    // id is answered as one no slab has.
    const bool owner_visible = i < dv.slab_owner_visible.size() && dv.slab_owner_visible[i];
    v1::SlabStats* out = ds->add_slabs();
    if (owner_visible) out->set_slab_id(slab.slab_id);
    out->set_size_bytes(slab.size);
    out->set_used_bytes(slab.used_bytes);
    out->set_free_bytes(slab.free_bytes);
    out->set_largest_free_bytes(slab.largest_free);
    out->set_fragmentation(slab.fragmentation);
    out->set_live_blocks(slab.live_blocks);
    out->set_dedicated(slab.dedicated);
    out->set_reserved(slab.reserved);
    out->set_retained(slab.retained);
    if (owner_visible) {
      out->set_tenant(slab.tenant);
      out->set_holders(slab.holders);
    }
  }
}

void RenderTenant(const TenantStatsView& tv, v1::TenantStats* ts) {
  ts->set_tenant(tv.id);
  ts->set_name(tv.name);
  if (tv.quota.has_value()) QuotaToProto(*tv.quota, ts->mutable_quota());
  uint64_t used = 0, retained = 0, blocks = 0, footprint = 0;
  for (size_t i = 0; i < tv.devices.size(); ++i) {
    const TenantPoolStats& t = tv.devices[i];
    if (t.used_bytes == 0 && t.retained_bytes == 0 && t.slab_count == 0) continue;
    v1::TenantDeviceStats* td = ts->add_devices();
    td->set_device_index(static_cast<uint32_t>(i));
    td->set_used_bytes(t.used_bytes);
    td->set_retained_bytes(t.retained_bytes);
    td->set_slab_count(t.slab_count);
    td->set_footprint_bytes(t.footprint_bytes());
    footprint += t.footprint_bytes();
    used += t.used_bytes;
    retained += t.retained_bytes;
    blocks += t.live_blocks;
  }
  ts->set_used_bytes(used);
  ts->set_retained_bytes(retained);
  ts->set_footprint_bytes(footprint);
  ts->set_allocation_count(blocks);
  ts->set_peak_bytes(std::max(tv.peak_bytes, used));
  ts->set_waiting_requests(tv.waiting_requests);
}

void RenderSession(const SessionStatsView& sv, v1::SessionStats* ss) {
  ss->set_session_id(sv.id);
  ss->set_pid(sv.cred.pid);
  ss->set_uid(sv.cred.uid);
  ss->set_gid(sv.cred.gid);
  const Session::Figures& f = sv.figures;
  ss->set_allocation_count(f.allocations);
  ss->set_used_bytes(f.used_bytes);
  // A report is the client's word: never show more leased than it holds.
  const uint64_t leased = f.usage.has_value() ? std::min(f.usage->leased_bytes, f.used_bytes) : 0;
  ss->set_leased_bytes(leased);
  ss->set_in_use_bytes(f.usage.has_value() ? std::min(f.usage->in_use_bytes, leased) : 0);
  ss->set_retained_bytes(sv.retained_bytes);
}

}  // namespace

v1::GetStatsResponse RenderStats(const StatsView& view) {
  v1::GetStatsResponse out;
  out.set_backend(view.backend);
  for (const DeviceStatsView& dv : view.devices) RenderDevice(dv, out.add_devices());
  for (const TenantStatsView& tv : view.tenants) RenderTenant(tv, out.add_tenants());
  for (const SessionStatsView& sv : view.sessions) RenderSession(sv, out.add_sessions());
  v1::DaemonCounters* c = out.mutable_counters();
  c->set_allocations(view.counters.allocations);
  c->set_frees(view.counters.frees);
  c->set_refused_capacity(view.counters.refused_capacity);
  c->set_refused_fragmentation(view.counters.refused_fragmentation);
  c->set_refused_quota(view.counters.refused_quota);
  c->set_refused_other(view.counters.refused_other);
  c->set_waiting_requests(view.counters.waiting_requests);
  c->set_uptime_seconds(view.counters.uptime_seconds);
  c->set_restart_lost_allocations(view.counters.restart_lost_allocations);
  return out;
}

v1::LedgerStatus RenderLedgerStatus(const ledger::TenantLedger* ledger) {
  v1::LedgerStatus out;
  const bool enabled = ledger != nullptr && ledger->enabled();
  out.set_enabled(enabled);
  const ledger::WriterStats s = enabled ? ledger->stats() : ledger::WriterStats();
  if (enabled) out.set_path(ledger->path());
  out.set_failing(s.failing);
  if (s.failing) out.set_last_error(s.last_error);
  out.set_held_events(s.held_events);
  out.set_dropped_events(s.dropped_events);
  out.set_committed_events(s.committed_events);
  out.set_commits(s.commits);
  out.set_failed_commits(s.failed_commits);
  out.set_wal_pages(static_cast<uint64_t>(std::max<int64_t>(s.wal_pages, 0)));
  out.set_blocked_checkpoints(s.blocked_checkpoints);
  return out;
}

}  // namespace gpumem
