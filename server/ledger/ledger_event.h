// LedgerEvent: one line of the ledger, as the broker hands it over at a
// commit point and as the `events` table stores it.
//
// Which kinds change a tenant's usage: ALLOCATE adds `bytes` on `device`;
// FREE (an explicit Free), SESSION_END (the owning process ended),
// DAEMON_STOP (released at a clean shutdown) and DAEMON_RESTART (live when
// the daemon died, closed at the next start) take them away. QUOTA_SET,
// TENANT_PUT, TENANT_DELETE and LEDGER_GAP are records only (device -1;
// bytes is the new total quota, or the count of events lost; TENANT_PUT's
// detail names the socket tenant's socket and quota), and so is
// DAEMON_RESUMED (a daemon started again and carried on with what the one
// before it left: bytes is the number of allocations that survived, detail
// says what did not).
#ifndef GPUMEMD_SERVER_LEDGER_LEDGER_EVENT_H_
#define GPUMEMD_SERVER_LEDGER_LEDGER_EVENT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gpumem {
namespace ledger {

enum class EventKind : uint8_t {
  kAllocate,
  kFree,
  kSessionEnd,
  kDaemonStop,
  kDaemonRestart,
  kQuotaSet,
  kLedgerGap,
  kDaemonResumed,
  kTenantPut,     // a socket tenant made or changed (PutTenant)
  kTenantDelete,  // a socket tenant removed (DeleteTenant)
};

// "ALLOCATE", "FREE", ... as stored in events.kind.
absl::string_view KindName(EventKind kind);
std::optional<EventKind> KindFromName(absl::string_view name);

// +1 for ALLOCATE, -1 for the four kinds that end an allocation, 0 else.
inline int UsageSign(EventKind kind) {
  switch (kind) {
    case EventKind::kAllocate: return 1;
    case EventKind::kFree:
    case EventKind::kSessionEnd:
    case EventKind::kDaemonStop:
    case EventKind::kDaemonRestart: return -1;
    default: return 0;
  }
}

struct LedgerEvent {
  uint64_t seq = 0;      // assigned by the ledger, increasing, never reused
  int64_t time_ns = 0;   // Unix time, nanoseconds
  EventKind kind = EventKind::kAllocate;
  std::string tenant;
  uint32_t uid = 0;
  int32_t pid = 0;
  uint64_t session = 0;
  int32_t device = -1;
  uint64_t bytes = 0;
  uint64_t allocation_id = 0;
  std::string detail;
};

}  // namespace ledger
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_LEDGER_LEDGER_EVENT_H_
