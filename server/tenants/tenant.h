// Tenant and Quota: who memory is charged to, and the limits it has.
//
// A tenant id is what the pool stamps on a slab (a slab belongs to one tenant
// for life) and what the quota book is keyed by; the ledger keys on names.
// With tenants in the config, ids are 1..N in config order at start, kept
// by name across reloads, and a tenant added by a reload gets an id never
// used before in the daemon's life (tenant_directory.h); without, each uid
// is its own tenant and the id is the uid (no quota unless SetQuota).
// Socket tenants made at run time (PutTenant) take ids from
// kFirstRuntimeTenantId up, in either mode, so they never meet a uid's id
// (uids from 2^31 up are refused when no tenants are configured) nor a
// configured tenant's. No tenant has id 0 on a tenant socket: 0 in
// PeerCred::socket_tenant means the main socket.
#ifndef GPUMEMD_SERVER_TENANTS_TENANT_H_
#define GPUMEMD_SERVER_TENANTS_TENANT_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/defaults/defaults.h"

namespace gpumem {
namespace tenants {

// Limits; nullopt means no limit of that kind.
struct Quota {
  std::optional<uint64_t> total_bytes;
  // By device index; shorter than the device list (or nullopt) = no limit.
  std::vector<std::optional<uint64_t>> device_bytes;
  std::optional<uint64_t> max_allocations;

  std::optional<uint64_t> device_limit(uint32_t device) const {
    return device < device_bytes.size() ? device_bytes[device] : std::nullopt;
  }
  bool unlimited() const {
    if (total_bytes || max_allocations) return false;
    for (const auto& d : device_bytes) if (d) return false;
    return true;
  }
};

// Who a caller is charged as: a tenant's id, name and waiting priority.
struct TenantRef {
  uint32_t id = 0;
  std::string name;
  int32_t priority = 0;
  // Allocate requests of this tenant that may wait at once.
  uint32_t max_waiting_requests = 0;
  // Live sessions this tenant may have (0: no limit).
  uint32_t max_sessions = 0;
};

// The first id of socket tenants made at run time (2^31).
inline constexpr uint32_t kFirstRuntimeTenantId = uint32_t{1} << 31;

// The daemon's max_waiting_requests when the config sets none.
inline constexpr uint32_t kDefaultMaxWaitingRequests = defaults::kMaxWaitingRequests;

// The name of uid `uid`'s own tenant when no tenants are configured
// ("uid-1000"), and the uid such a name stands for.
std::string UidTenantName(uint32_t uid);
std::optional<uint32_t> UidOfTenantName(absl::string_view name);

// Who may connect to a tenant's socket: the socket file's owner, group and
// mode (socket_path.h: CheckSocketMode, DefaultSocketAccess).
struct SocketAccess {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t mode = 0600;
  bool operator==(const SocketAccess& o) const {
    return uid == o.uid && gid == o.gid && mode == o.mode;
  }
  bool operator!=(const SocketAccess& o) const { return !(*this == o); }
};

struct Tenant {
  uint32_t id = 0;
  std::string name;
  int32_t priority = 0;
  uint32_t max_waiting_requests = kDefaultMaxWaitingRequests;
  uint32_t max_sessions = 0;  // 0: no limit
  Quota quota;
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  // Its own socket's absolute path (inside tenant_socket_dir), or empty:
  // every connection through it is charged to this tenant.
  std::string socket;
  // Who may connect to `socket`.
  SocketAccess socket_access;
  // Made at run time by PutTenant (kept in the ledger), not by the config.
  bool runtime = false;
};

}  // namespace tenants
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_TENANTS_TENANT_H_
