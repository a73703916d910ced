#include "client/lib/device_uuids.h"

namespace gpumem {
namespace client {

absl::StatusOr<std::vector<std::string>> DeviceUuids(CachingPool* pool) {
  absl::StatusOr<Client*> daemon = pool->Daemon();
  if (!daemon.ok()) return daemon.status();
  absl::StatusOr<v1::GetStatsResponse> st = (*daemon)->GetStats(false);
  if (!st.ok()) return st.status();
  std::vector<std::string> out;
  for (const v1::DeviceStats& d : st->devices()) {
    if (d.index() >= out.size()) out.resize(d.index() + 1);
    out[d.index()] = d.uuid();
  }
  return out;
}

}  // namespace client
}  // namespace gpumem
