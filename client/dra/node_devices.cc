// GetStats -> NodeDevice rows: one per device, in the daemon's index order.
#include "client/dra/node_devices.h"

#include <cctype>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace dra {

std::string DeviceNameForUuid(absl::string_view uuid, uint32_t index) {
  std::string out;
  for (char c : uuid) {
    const unsigned char u = static_cast<unsigned char>(c);
    out.push_back(std::isalnum(u) ? static_cast<char>(std::tolower(u)) : '-');
  }
  if (out.size() > 63) out.resize(63);
  while (!out.empty() && out.back() == '-') out.pop_back();
  size_t start = 0;
  while (start < out.size() && out[start] == '-') ++start;
  out = out.substr(start);
  if (out.empty()) return absl::StrCat("gpu-", index);
  return out;
}

std::vector<NodeDevice> DevicesFromStats(const v1::GetStatsResponse& stats) {
  // Bytes per device index held by tenants that are not claims.
  absl::flat_hash_map<uint32_t, uint64_t> held;
  for (const v1::TenantStats& t : stats.tenants()) {
    if (absl::StartsWith(t.name(), kClaimTenantPrefix)) continue;
    for (const v1::TenantDeviceStats& d : t.devices()) {
      held[d.device_index()] += d.used_bytes() + d.retained_bytes();
    }
  }
  std::vector<NodeDevice> out;
  for (const v1::DeviceStats& d : stats.devices()) {
    NodeDevice n;
    n.index = d.index();
    n.uuid = d.uuid();
    n.name = DeviceNameForUuid(d.uuid(), d.index());
    n.model = d.name();
    n.pci_bus_id = d.pci_bus_id();
    n.total_bytes = d.total_bytes();
    uint64_t taken = held[d.index()];
    if (d.has_driver_total_bytes() && d.has_driver_free_bytes() &&
        d.driver_total_bytes() > d.driver_free_bytes()) {
      const uint64_t busy = d.driver_total_bytes() - d.driver_free_bytes();
      if (busy > d.pooled_bytes()) taken += busy - d.pooled_bytes();
    }
    n.leasable_bytes = taken >= n.total_bytes ? 0 : n.total_bytes - taken;
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace dra
}  // namespace gpumem
