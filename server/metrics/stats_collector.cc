// See stats_collector.h. One gauge family per figure; families are built in
// a fixed order so the exposition is stable between scrapes.
#include "server/metrics/stats_collector.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/service/stats_proto.h"

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
      {"gpumemd_device_free_bytes", "Bytes neither in live allocations nor retained",
       [](const v1::DeviceStats& d) { return double(d.free_bytes()); }},
      {"gpumemd_device_retained_bytes",
       "Bytes of released slabs a live session may still hold",
       [](const v1::DeviceStats& d) { return double(d.retained_bytes()); }},
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

  MetricFamily used = Gauge("gpumemd_tenant_used_bytes",
                            "Bytes in the tenant's live allocations");
  MetricFamily retained = Gauge("gpumemd_tenant_retained_bytes",
                                "Bytes of the tenant's retained slabs");
  MetricFamily footprint = Gauge("gpumemd_tenant_footprint_bytes",
                                 "Bytes of the tenant's slabs (what it pins), retained included");
  MetricFamily count = Gauge("gpumemd_tenant_allocations", "The tenant's live allocations");
  MetricFamily peak = Gauge("gpumemd_tenant_peak_bytes",
                            "The most bytes the tenant held at once since the daemon started");
  MetricFamily waiting = Gauge("gpumemd_tenant_waiting_requests",
                               "The tenant's Allocate requests waiting for memory now");
  MetricFamily dev_used = Gauge("gpumemd_tenant_device_used_bytes",
                                "Bytes in the tenant's live allocations on a device");
  MetricFamily dev_retained = Gauge("gpumemd_tenant_device_retained_bytes",
                                    "Bytes of the tenant's retained slabs on a device");
  MetricFamily dev_footprint = Gauge("gpumemd_tenant_device_footprint_bytes",
                                     "Bytes of the tenant's slabs on a device, retained included");
  MetricFamily dev_slabs = Gauge("gpumemd_tenant_device_slabs",
                                 "Slabs the tenant owns on a device (not retained)");
  // Quotas: a sample only for a limit that is set (no sample: no limit).
  MetricFamily quota = Gauge("gpumemd_tenant_quota_bytes",
                             "The tenant's total_bytes quota (no sample: no limit)");
  MetricFamily dev_quota = Gauge("gpumemd_tenant_device_quota_bytes",
                                 "The tenant's quota on a device (no sample: no limit)");
  MetricFamily quota_count = Gauge("gpumemd_tenant_quota_allocations",
                                   "The tenant's max_allocations quota (no sample: no limit)");
  for (const v1::TenantStats& t : stats.tenants()) {
    // The name says who; the id keeps two rows apart when a tenant removed
    // by a reload and one added under its name both still hold memory.
    const std::vector<ClientMetric::Label> who = {{"tenant", t.name()},
                                                  {"tenant_id", absl::StrCat(t.tenant())}};
    auto with = [&who](std::string key, std::string value) {
      std::vector<ClientMetric::Label> labels = who;
      labels.push_back({std::move(key), std::move(value)});
      return labels;
    };
    AddSample(&used, who, double(t.used_bytes()));
    AddSample(&retained, who, double(t.retained_bytes()));
    AddSample(&footprint, who, double(t.footprint_bytes()));
    AddSample(&count, who, double(t.allocation_count()));
    AddSample(&peak, who, double(t.peak_bytes()));
    AddSample(&waiting, who, double(t.waiting_requests()));
    if (t.has_quota()) {
      const v1::Quota& q = t.quota();
      if (q.has_total_bytes()) AddSample(&quota, who, double(q.total_bytes()));
      if (q.has_max_allocations()) AddSample(&quota_count, who, double(q.max_allocations()));
      for (const v1::DeviceQuota& dq : q.devices()) {
        AddSample(&dev_quota, with("device", dq.device()), double(dq.bytes()));
      }
    }
    for (const v1::TenantDeviceStats& d : t.devices()) {
      std::vector<ClientMetric::Label> labels = with("device", absl::StrCat(d.device_index()));
      AddSample(&dev_used, labels, double(d.used_bytes()));
      AddSample(&dev_retained, labels, double(d.retained_bytes()));
      AddSample(&dev_slabs, labels, double(d.slab_count()));
      AddSample(&dev_footprint, labels, double(d.footprint_bytes()));
    }
  }
  for (MetricFamily* f : {&used, &retained, &footprint, &count, &peak, &waiting, &dev_used,
                          &dev_retained, &dev_footprint, &dev_slabs, &quota, &dev_quota,
                          &quota_count}) {
    out.push_back(std::move(*f));
  }
  MetricFamily sessions = Gauge("gpumemd_sessions", "Live client sessions");
  AddSample(&sessions, {}, double(stats.sessions_size()));
  out.push_back(std::move(sessions));
  MetricFamily all_waiting = Gauge("gpumemd_waiting_requests",
                                   "Allocate requests waiting for memory now, all tenants");
  AddSample(&all_waiting, {}, double(stats.counters().waiting_requests()));
  out.push_back(std::move(all_waiting));
  MetricFamily uptime = Gauge("gpumemd_uptime_seconds", "Seconds since the daemon started serving");
  AddSample(&uptime, {}, stats.counters().uptime_seconds());
  out.push_back(std::move(uptime));
  MetricFamily lost = Gauge("gpumemd_restart_lost_allocations",
                            "Allocations of the previous daemon's this one did not keep across "
                            "its restart (closed at the restore or at the grace time's end)");
  AddSample(&lost, {}, double(stats.counters().restart_lost_allocations()));
  out.push_back(std::move(lost));
  return out;
}

std::vector<MetricFamily> StatsCollector::Collect() const {
  // As root: the endpoint shows every tenant (see metrics_endpoint.h on
  // who may reach it).
  const PeerCred root{/*pid=*/0, /*uid=*/0, /*gid=*/0};
  return FromStats(RenderStats(broker_->Stats(root)));
}

}  // namespace gpumem
