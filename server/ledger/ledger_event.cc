#include "server/ledger/ledger_event.h"

namespace gpumem {
namespace ledger {
namespace {

constexpr absl::string_view kNames[] = {
    "ALLOCATE",   "FREE",           "SESSION_END", "DAEMON_STOP",   "DAEMON_RESTART",
    "QUOTA_SET",  "LEDGER_GAP",     "DAEMON_RESUMED", "TENANT_PUT", "TENANT_DELETE",
};

}  // namespace

absl::string_view KindName(EventKind kind) { return kNames[static_cast<int>(kind)]; }

std::optional<EventKind> KindFromName(absl::string_view name) {
  for (int i = 0; i < static_cast<int>(sizeof(kNames) / sizeof(kNames[0])); ++i) {
    if (kNames[i] == name) return static_cast<EventKind>(i);
  }
  return std::nullopt;
}

}  // namespace ledger
}  // namespace gpumem
