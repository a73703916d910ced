// StatsView: what MemoryBroker::Stats shows one caller, as plain figures.
//
// The core decides what a caller may see (device figures for everyone;
// sessions, tenants and slab owners only of the caller's own uid unless the
// caller is an administrator); the transports render it (service/
// stats_proto.h turns it into a GetStatsResponse). Every figure of one view
// is read in one call, each device's under its pool's lock.
#ifndef GPUMEMD_SERVER_CORE_STATS_VIEW_H_
#define GPUMEMD_SERVER_CORE_STATS_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/backend/backend.h"
#include "server/pool/slab_pool.h"
#include "server/session/session.h"
#include "server/tenants/tenant.h"

namespace gpumem {

struct DeviceStatsView {
  DeviceInfo info;
  PoolStats pool;  // free_bytes within the device's room (Backend::NewSlabRoom)
  uint64_t granularity_bytes = 0;
  std::optional<DriverMemInfo> driver;   // the backend's own view, if it has one
  std::vector<PeerLink> peers;           // [to]
  std::vector<SlabStats> slabs;          // only when asked for
  std::vector<bool> slab_owner_visible;  // per slab: tenant and holders shown
};

struct TenantStatsView {
  uint32_t id = 0;
  std::string name;
  std::optional<tenants::Quota> quota;   // absent: no limit of any kind
  std::vector<TenantPoolStats> devices;  // by device index
  uint64_t peak_bytes = 0;
  uint32_t waiting_requests = 0;
};

struct SessionStatsView {
  uint64_t id = 0;
  PeerCred cred;
  Session::Figures figures;
  uint64_t retained_bytes = 0;
};

// Counts since the daemon started (v1::DaemonCounters).
struct CounterView {
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t refused_capacity = 0;
  uint64_t refused_fragmentation = 0;
  uint64_t refused_quota = 0;
  uint64_t refused_other = 0;
  uint64_t waiting_requests = 0;
  double uptime_seconds = 0;
  uint64_t restart_lost_allocations = 0;
};

struct StatsView {
  std::string backend;
  std::vector<DeviceStatsView> devices;
  std::vector<TenantStatsView> tenants;    // by id
  std::vector<SessionStatsView> sessions;  // by id
  CounterView counters;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CORE_STATS_VIEW_H_
