// See daemon.h. StartParts is the wiring list: each part is made from the
// settings and the parts made before it, in the order they depend on each
// other. Stop takes them down in the reverse order of what could still
// reach what: no new connection, no new call, no task left on a worker, no
// event left on a queue, then the core, then the ledger.
#include "server/daemon/daemon.h"

#include <signal.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "server/backend/cuda_backend.h"
#include "server/backend/sim_backend.h"
#include "server/config/daemon_config.h"
#include "server/config/reloadable.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/metrics/call_metrics.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/stats_collector.h"
#include "server/quota/quota_book.h"
#include "server/service/async_service.h"
#include "server/service/event_queues.h"
#include "server/service/gpumem_service.h"
#include "server/service/health_service.h"
#include "server/service/socket_listener.h"
#include "server/service/stream_service.h"
#include "server/service/tenant_admin.h"
#include "server/service/worker_pool.h"
#include "server/session/peer_credentials.h"
#include "server/systemd/listen_fds.h"
#include "server/systemd/notifier.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

namespace {

// The one gRPC method still served synchronously is reflection's stream
// (grpc::reflection's own service); a ResourceQuota bounds the threads gRPC
// may start for it, so opening many reflection streams cannot grow the
// daemon's threads without bound (calls past it are refused).
constexpr int kMaxSyncThreads = 4;

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const Settings& s) {
  if (s.backend.value == "cuda") return CudaBackend::Create();
  auto sim = std::make_unique<SimBackend>(s.sim_device_sizes, s.sim_links);
  for (const auto& [device, delay] : s.sim_slab_create_delays) sim->SetCreateDelay(device, delay);
  return std::unique_ptr<Backend>(std::move(sim));
}

// The ledger at `path` ("none": off), its directory created if missing.
absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> OpenLedger(const std::string& path) {
  ledger::LedgerOptions options;
  if (path != "none") {
    options.path = path;
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::error_code error;
    if (!dir.empty()) std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path, ": cannot create directory ", dir.string(), ": ", error.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> opened =
      ledger::TenantLedger::Open(options);
  if (!opened.ok()) return opened.status();
  if (!(*opened)->enabled()) {
    std::cerr << "gpumemd: ledger off (--ledger=none): no events are recorded and usage "
                 "history lasts only while this daemon runs\n";
  } else {
    std::cerr << "gpumemd: ledger " << path << "; first allocation id "
              << (*opened)->first_allocation_id() << "; "
              << (*opened)->restart_event_count()
              << " allocation(s) live at the last unclean stop closed with DAEMON_RESTART\n";
  }
  return opened;
}

}  // namespace

struct Daemon::Parts {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ledger::TenantLedger> ledger;
  tenants::TenantDirectoryHolder directory{tenants::TenantDirectory()};
  std::unique_ptr<quota::QuotaBook> quotas;
  std::unique_ptr<MemoryBroker> broker;
  PeerTable peers;
  std::unique_ptr<TenantAdmin> tenant_admin;
  std::unique_ptr<CallMetrics> call_metrics;
  std::unique_ptr<MetricsEndpoint> metrics;
  AsyncGpuMemory service;
  HealthService health;
  std::unique_ptr<EventQueues> queues;
  std::unique_ptr<WorkerPool> backend_workers;
  std::unique_ptr<WorkerPool> query_workers;
  std::unique_ptr<GpuMemoryService> unary;
  std::unique_ptr<StreamService> streams;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<SocketListener> listener;
  SystemdNotifier notifier;
  std::string serving;  // the status line
};

Daemon::Daemon(CommandLine flags, Settings settings,
               std::unique_ptr<google::protobuf::TextFormat::ParseInfoTree> locations)
    : flags_(std::move(flags)),
      settings_(std::move(settings)),
      locations_(std::move(locations)),
      parts_(std::make_unique<Parts>()) {}

Daemon::~Daemon() { Stop(); }

absl::Status Daemon::Start() {
  absl::Status started = StartParts();
  if (!started.ok()) Stop();
  return started;
}

absl::Status Daemon::StartParts() {
  Parts& p = *parts_;
  const Settings& s = settings_;

  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(s);
  if (!backend.ok()) return backend.status();
  p.backend = *std::move(backend);

  absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> ledger = OpenLedger(s.ledger.value);
  if (!ledger.ok()) return ledger.status();
  p.ledger = *std::move(ledger);
  p.quotas = std::make_unique<quota::QuotaBook>(
      static_cast<uint32_t>(p.backend->devices().size()));

  BrokerOptions options;
  options.pool.slab_size = s.slab_size.value;
  options.pool.empty_release_after = s.empty_slab_release.value;
  options.pool.reserve_fraction = s.reserve_fraction.value;
  if (s.backend.value == "sim") options.pool.granularity = 4096;
  options.handle_kinds = s.handle_kinds.value;
  options.tenants = &p.directory;
  options.quotas = p.quotas.get();
  options.ledger = p.ledger.get();
  p.broker = std::make_unique<MemoryBroker>(p.backend.get(), options);

  // The reloadable settings and the tenant section, as every reload applies
  // them (the admin group, the directory and its quotas).
  ReloadTargets targets{p.broker.get(), &p.broker->devices(), &p.directory, p.quotas.get(),
                        p.ledger.get()};
  absl::StatusOr<ReloadOutcome> applied =
      ApplyReloadableConfig(s, locations_.get(), targets, /*at_start=*/true);
  if (!applied.ok()) return applied.status();
  for (const std::string& line : applied->applied) std::cerr << "gpumemd: " << line << "\n";
  if (absl::Status broker_started = p.broker->Start(); !broker_started.ok()) {
    return broker_started;
  }

  MemoryBroker* broker = p.broker.get();
  p.tenant_admin = std::make_unique<TenantAdmin>(
      &p.directory, p.quotas.get(), p.ledger.get(), p.broker->devices(),
      [broker](const PeerCred& c) { return broker->IsAdmin(c); },
      [broker] { broker->QuotasChanged(); });
  // The listener serves socket tenants' sockets too (issue 24); made here,
  // before any thread could serve a tenant RPC, bound and started below.
  p.listener = std::make_unique<SocketListener>(s.socket.value, broker, &p.peers);
  p.tenant_admin->ServeSocketTenants(
      {&p.directory, broker, p.listener.get(), s.tenant_socket_dir.value});

  // Metrics are opt-in: without --metrics_listen nothing is counted.
  if (!s.metrics_listen.value.empty()) {
    p.call_metrics = std::make_unique<CallMetrics>();
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(
        s.metrics_listen.value,
        {p.call_metrics->registry(), std::make_shared<StatsCollector>(broker)});
    if (!endpoint.ok()) return endpoint.status();
    p.metrics = *std::move(endpoint);
  }

  // gRPC: every GpuMemory method and the health Watch on shared completion
  // queues (no thread per call); requests that need backend work, and
  // queries, on small worker pools.
  p.queues = std::make_unique<EventQueues>(s.queue_threads.value);
  p.backend_workers = std::make_unique<WorkerPool>(s.backend_threads.value);
  p.query_workers = std::make_unique<WorkerPool>(s.query_threads.value);
  GpuMemoryService::Parts unary;
  unary.broker = broker;
  unary.peers = &p.peers;
  unary.tenants = p.tenant_admin.get();
  unary.service = &p.service;
  unary.backend_workers = p.backend_workers.get();
  unary.query_workers = p.query_workers.get();
  unary.observer = p.call_metrics.get();
  p.unary = std::make_unique<GpuMemoryService>(unary);
  p.streams = std::make_unique<StreamService>(broker, &p.peers, &p.service,
                                              p.backend_workers.get(), p.call_metrics.get());

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(&p.service);
  // Our own health service: gRPC's default one adds polling threads
  // (health_service.h).
  builder.RegisterService(&p.health);
  grpc::ResourceQuota quota("gpumemd");
  quota.SetMaxThreads(kMaxSyncThreads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1);
  p.queues->AddTo(&builder);
  p.server = builder.BuildAndStart();
  if (!p.server) return absl::InternalError("gRPC server failed to start");
  p.unary->Start(p.queues->queues());
  p.streams->Start(p.queues->queues());
  p.health.Start(p.queues->first());
  p.queues->Start();

  absl::StatusOr<std::optional<int>> activation = TakeActivationSocket();
  if (!activation.ok()) return activation.status();
  absl::Status bound =
      activation->has_value() ? p.listener->Adopt(**activation) : p.listener->Bind();
  if (!bound.ok()) return bound;
  if (absl::Status listening = p.listener->Start(p.server.get()); !listening.ok()) {
    return listening;
  }
  // The ledger's socket tenants come back with their sockets; the config's
  // tenant sockets are made (one that cannot be is a start-up error).
  for (const std::string& line : p.tenant_admin->RestoreSocketTenants()) {
    std::cerr << "gpumemd: " << line << "\n";
  }
  if (std::vector<std::string> unmade = p.tenant_admin->SyncConfigSockets(); !unmade.empty()) {
    return absl::FailedPreconditionError(absl::StrJoin(unmade, "; "));
  }

  p.serving = absl::StrCat("serving ", p.backend->devices().size(), " ", p.backend->name(),
                           " device(s) on ", p.listener->path(),
                           activation->has_value() ? " (socket from systemd)" : "");
  std::cerr << "gpumemd: " << p.serving << "\n";
  for (const DeviceInfo& d : p.backend->devices()) {
    std::cerr << "gpumemd:   device " << d.index << " " << d.uuid << " "
              << FormatBytes(d.total_bytes) << " " << d.name << "\n";
  }
  std::cerr << "gpumemd: slab handle kinds offered:";
  for (HandleKind k : broker->handle_kinds()) std::cerr << " " << HandleKindName(k);
  std::cerr << "\n";
  if (p.metrics != nullptr) {
    std::cerr << "gpumemd: metrics on http://"
              << s.metrics_listen.value.substr(0, s.metrics_listen.value.rfind(':')) << ":"
              << p.metrics->port() << "/metrics\n";
  }
  const std::shared_ptr<const tenants::TenantDirectory> dir = p.directory.Get();
  if (dir->configured()) {
    std::cerr << "gpumemd: " << dir->tenants().size() << " tenant(s)";
    if (!s.file.default_tenant().empty()) {
      std::cerr << "; unlisted uids go to \"" << s.file.default_tenant() << "\"";
    } else {
      std::cerr << "; unlisted uids are refused";
    }
    std::cerr << "\n";
  }

  p.notifier.Ready(p.serving);
  // The watchdog pings only while the core's table lock can be taken: a
  // daemon whose core is stuck stops pinging and systemd restarts it.
  p.notifier.StartWatchdog([broker] {
    broker->live_allocations();
    return true;
  });
  if (SystemdNotifier::WatchdogInterval() > absl::ZeroDuration()) {
    std::cerr << "gpumemd: systemd watchdog every " << SystemdNotifier::WatchdogInterval() / 2
              << "\n";
  }
  return absl::OkStatus();
}

absl::Status Daemon::Reload() {
  Parts& p = *parts_;
  if (settings_.config_path.empty()) {
    std::cerr << "gpumemd: SIGHUP: no --config file, nothing to reload\n";
    return absl::OkStatus();
  }
  p.notifier.Reloading(absl::StrCat("reloading ", settings_.config_path));
  auto locations = std::make_unique<google::protobuf::TextFormat::ParseInfoTree>();
  absl::Status result;
  absl::StatusOr<v1::DaemonConfig> file =
      LoadDaemonConfig(settings_.config_path, locations.get());
  absl::StatusOr<Settings> next = file.ok()
                                      ? ResolveSettings(flags_, settings_.config_path, *file)
                                      : absl::StatusOr<Settings>(file.status());
  absl::StatusOr<ReloadOutcome> outcome = absl::UnknownError("not applied");
  if (next.ok()) {
    ReloadTargets targets{p.broker.get(), &p.broker->devices(), &p.directory, p.quotas.get(),
                          p.ledger.get()};
    next->tenant_socket_dir = settings_.tenant_socket_dir;  // restart-only
    outcome = ApplyReloadableConfig(*next, locations.get(), targets, /*at_start=*/false);
    if (outcome.ok()) {  // the config's tenant sockets follow the directory
      for (const std::string& line : p.tenant_admin->SyncConfigSockets()) {
        std::cerr << "gpumemd: reload: " << line << "\n";
      }
    }
  } else {
    outcome = next.status();
  }
  if (!outcome.ok()) {
    result = outcome.status();
    std::cerr << "gpumemd: reload refused, the config in force is unchanged: "
              << result.message() << "\n";
  } else {
    std::vector<std::string> restart_only = RestartOnlyChanges(settings_, *next);
    restart_only.insert(restart_only.end(), outcome->restart_only.begin(),
                        outcome->restart_only.end());
    if (!restart_only.empty()) {
      std::cerr << "gpumemd: reload: " << absl::StrJoin(restart_only, ", ")
                << " changed; these take effect at the next start\n";
    }
    // The settings in force: the reloaded ones, but those that wait for a
    // restart keep their running values.
    Settings running = *std::move(next);
    running.backend = settings_.backend;
    running.sim_devices = settings_.sim_devices;
    running.sim_device_sizes = settings_.sim_device_sizes;
    running.sim_topology = settings_.sim_topology;
    running.sim_links = settings_.sim_links;
    running.socket = settings_.socket;
    running.tenant_socket_dir = settings_.tenant_socket_dir;
    running.handle_kinds = settings_.handle_kinds;
    running.slab_size = settings_.slab_size;
    running.ledger = settings_.ledger;
    settings_ = std::move(running);
    locations_ = std::move(locations);
    std::cerr << "gpumemd: reloaded " << settings_.config_path << ": "
              << absl::StrJoin(outcome->applied, "; ") << "\n";
  }
  p.notifier.Ready(absl::StrCat(p.serving, result.ok() ? "; config reloaded"
                                                       : "; last reload refused: ",
                                result.message()));
  return result;
}

void Daemon::Drain(const std::string& why, const std::function<bool()>& cut_short) {
  Parts& p = *parts_;
  if (p.broker == nullptr) return;
  MemoryBroker& broker = *p.broker;
  broker.BeginDrain();
  broker.StopWaiting();  // waiting Allocates answer now, not at their deadline
  // Health checks (gpumemd_probe, Kubernetes readiness) see NOT_SERVING from
  // now on, so nothing new is sent here while the daemon drains.
  p.health.SetNotServing();
  std::cerr << "gpumemd: " << why << ": stopping; new allocations are refused\n";
  p.notifier.Stopping(absl::StrCat("draining: ", broker.live_allocations(),
                                   " allocation(s) live"));
  const absl::Duration limit = absl::Seconds(settings_.drain_seconds.value);
  const absl::Time deadline = absl::Now() + limit;
  while (broker.live_allocations() > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      std::cerr << "gpumemd: drain time over; releasing " << broker.live_allocations()
                << " live allocation(s)\n";
      return;
    }
    if (broker.WaitUntilNoAllocations(std::min(left, absl::Milliseconds(200)))) break;
    if (cut_short()) {
      std::cerr << "gpumemd: second signal; releasing " << broker.live_allocations()
                << " live allocation(s) now\n";
      return;
    }
    p.notifier.Status(absl::StrCat("draining: ", broker.live_allocations(),
                                   " allocation(s) live, ",
                                   absl::ToInt64Seconds(deadline - absl::Now()), " s left"));
  }
  if (limit > absl::ZeroDuration()) std::cerr << "gpumemd: drained: no live allocations\n";
}

void Daemon::Stop() {
  if (stopped_ || parts_ == nullptr) return;
  stopped_ = true;
  Parts& p = *parts_;
  if (p.broker != nullptr) p.broker->StopWaiting();  // nobody answers waiters after
  if (p.listener != nullptr) p.listener->Stop();
  if (p.server != nullptr) {
    // In-flight calls are sub-millisecond; idle client connections would
    // otherwise hold Shutdown until the deadline.
    p.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
  }
  p.metrics.reset();  // no scrape may reach the broker after this
  // Tasks still queued run now: their answers go to queues still drained.
  if (p.backend_workers != nullptr) p.backend_workers->Shutdown();
  if (p.query_workers != nullptr) p.query_workers->Shutdown();
  if (p.streams != nullptr) p.streams->Close();
  if (p.queues != nullptr) p.queues->Shutdown();
  const bool served = p.broker != nullptr;
  if (p.broker != nullptr) p.broker->Shutdown();
  if (p.ledger != nullptr) p.ledger->Close();  // commits the DAEMON_STOP events
  p.notifier.StopWatchdog();
  if (served && p.server != nullptr) std::cerr << "gpumemd: stopped; every slab released\n";
}

}  // namespace gpumem
