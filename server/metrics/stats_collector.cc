// See stats_collector.h. One gauge family per figure; families are built in
// a fixed order so the exposition is stable between scrapes.
#include "server/metrics/stats_collector.h"

#include <functional>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Gauge(std::string name, std::string help) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = MetricType::Gauge;
  return f;
}

void AddSample(MetricFamily* f, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  f->metric.push_back(std::move(m));
}

struct DeviceFigure {
  const char* name;
  const char* help;
  std::function<double(const v1::DeviceStats&)> value;
};

}  // namespace

std::vector<MetricFamily> StatsCollector::FromStats(const v1::GetStatsResponse& stats) {
  const DeviceFigure figures[] = {
      {"gpumemd_device_total_bytes", "Device memory size",
       [](const v1::DeviceStats& d) { return double(d.total_bytes()); }},
      {"gpumemd_device_used_bytes", "Bytes in live allocations",
       [](const v1::DeviceStats& d) { return double(d.used_bytes()); }},
      {"gpumemd_device_pooled_bytes", "Bytes held as pool slabs",
       [](const v1::DeviceStats& d) { return double(d.pooled_bytes()); }},
      {"gpumemd_device_free_bytes", "Bytes not in live allocations",
       [](const v1::DeviceStats& d) { return double(d.free_bytes()); }},
      {"gpumemd_device_largest_free_block_bytes", "Largest block Allocate could serve now",
       [](const v1::DeviceStats& d) { return double(d.largest_free_block_bytes()); }},
      {"gpumemd_device_fragmentation", "1 - largest free range / free pooled bytes",
       [](const v1::DeviceStats& d) { return d.fragmentation(); }},
      {"gpumemd_device_slabs", "Slabs held",
       [](const v1::DeviceStats& d) { return double(d.slab_count()); }},
      {"gpumemd_device_allocations", "Live allocations",
       [](const v1::DeviceStats& d) { return double(d.allocation_count()); }},
  };
  std::vector<MetricFamily> out;
  for (const DeviceFigure& fig : figures) {
    MetricFamily f = Gauge(fig.name, fig.help);
    for (const v1::DeviceStats& d : stats.devices()) {
      AddSample(&f, {{"device", absl::StrCat(d.index())}, {"uuid", d.uuid()}},
                fig.value(d));
    }
    out.push_back(std::move(f));
  }

  struct TenantLoad {
    uint64_t bytes = 0;
    uint64_t allocations = 0;
  };
  std::map<uint32_t, TenantLoad> tenants;
  for (const v1::SessionStats& s : stats.sessions()) {
    TenantLoad& t = tenants[s.uid()];
    t.bytes += s.used_bytes();
    t.allocations += s.allocation_count();
  }
  MetricFamily used = Gauge("gpumemd_tenant_used_bytes",
                            "Bytes in live allocations of the tenant's sessions");
  MetricFamily count = Gauge("gpumemd_tenant_allocations",
                             "Live allocations of the tenant's sessions");
  for (const auto& [uid, load] : tenants) {
    const std::string tenant = absl::StrCat("uid:", uid);
    AddSample(&used, {{"tenant", tenant}}, double(load.bytes));
    AddSample(&count, {{"tenant", tenant}}, double(load.allocations));
  }
  out.push_back(std::move(used));
  out.push_back(std::move(count));
  MetricFamily sessions = Gauge("gpumemd_sessions", "Live client sessions");
  AddSample(&sessions, {}, double(stats.sessions_size()));
  out.push_back(std::move(sessions));
  return out;
}

std::vector<MetricFamily> StatsCollector::Collect() const {
  return FromStats(broker_->Stats());
}

}  // namespace gpumem
