// gpumemd: the daemon's entry point.
//
// Reads flags and the optional textproto config (flags win), makes the
// backend, the broker and the gRPC server (no listening port of its own:
// connections arrive through SocketListener, which knows who the caller
// is, on a socket it binds or one systemd passed with LISTEN_FDS), tells
// systemd it is ready (sd_notify; nothing without NOTIFY_SOCKET), and then
// waits for signals:
//  - SIGHUP: reload the config file. The whole file is parsed and validated
//    first; a bad one is logged with file:line:column and reason and the
//    config in force stays; a good one goes through ApplyReloadableConfig
//    (server/config/reloadable.h) and affects new requests only (tenants:
//    new sessions; live ones keep their tenant).
//  - SIGTERM/SIGINT: drain, then stop. Allocate answers UNAVAILABLE, other
//    calls keep working, and the daemon waits up to --drain_seconds for live
//    allocations to be freed (a second SIGTERM/SIGINT cuts the wait short).
//    Then: stop accepting (and remove the socket unless systemd owns it),
//    finish in-flight gRPC calls, release every allocation and slab, exit 0.
// Start-up errors are one line on stderr and exit status 1.
#include <signal.h>
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "absl/strings/str_join.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/backend/cuda_backend.h"
#include "server/backend/sim_backend.h"
#include "server/backend/sim_topology.h"
#include "server/config/daemon_config.h"
#include "server/config/reloadable.h"
#include "server/metrics/call_metrics.h"
#include "server/metrics/metered_service.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/stats_collector.h"
#include "server/ledger/tenant_ledger.h"
#include "server/quota/quota_book.h"
#include "server/service/gpumem_service.h"
#include "server/service/health_service.h"
#include "server/service/memory_broker.h"
#include "server/service/socket_listener.h"
#include "server/service/stream_service.h"
#include "server/session/peer_credentials.h"
#include "server/systemd/listen_fds.h"
#include "server/systemd/notifier.h"
#include "server/service/tenant_admin.h"
#include "server/tenants/tenant_directory.h"

// Empty string / negative number = not given (then the config file, then
// the built-in default, decides).
ABSL_FLAG(std::string, backend, "", "device backend: sim or cuda (default sim)");
ABSL_FLAG(std::string, sim_devices, "",
          "simulated devices, e.g. 4x16GiB or 80GiB,80GiB,40GiB (default 4x16GiB)");
ABSL_FLAG(std::string, sim_topology, "",
          "simulated NVLink groups, e.g. nvlink:0-1,2-3 (default: all through the host)");
ABSL_FLAG(std::string, socket, "",
          "Unix socket path (default /run/gpumemd/gpumemd.sock)");
ABSL_FLAG(std::string, config, "", "daemon config file, protobuf text format "
          "(gpumem.v1.DaemonConfig)");
ABSL_FLAG(std::string, slab_size, "", "size of pool slabs (default 1GiB)");
ABSL_FLAG(double, empty_slab_release_seconds, -1,
          "seconds an empty slab is kept before it goes back (default 30)");
ABSL_FLAG(std::string, admin_group, "",
          "Unix group whose members (besides root) see every session and "
          "tenant in GetStats (default: root only)");
ABSL_FLAG(std::string, handle_kinds, "",
          "slab handle kinds offered to clients, the first the default: memfd (sim), "
          "cuda_vmm_fd, cuda_ipc (cuda); default: all the backend makes");
ABSL_FLAG(double, reserve_fraction, -1,
          "fraction of each device taken as slabs at start and kept (default 0)");
ABSL_FLAG(double, drain_seconds, 0,
          "on SIGTERM, wait up to this long for live allocations to be freed "
          "(new allocations are refused meanwhile) before releasing everything");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics over HTTP on HOST:PORT, e.g. 127.0.0.1:9464 "
          "(default: off)");
ABSL_FLAG(std::string, ledger, "",
          "the ledger file (SQLite; directory created), or none to keep no ledger "
          "(default /var/lib/gpumemd/ledger.db)");
ABSL_FLAG(int, stream_threads, 1,
          "threads (one completion queue each) serving the Stream RPC");
ABSL_FLAG(std::string, sim_slab_create_delay, "",
          "sim backend: slab creation on these devices sleeps first, as a slow "
          "driver's would, e.g. 0:300ms,2:50ms (for tests and benchmarks)");
ABSL_FLAG(int, stream_backend_threads, 2,
          "threads that run the Stream's Allocates needing backend work (a new "
          "slab), so a slow device holds up no stream");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Abseil's lock-order checking on every absl::Mutex (gRPC's own locks "
          "included): a debugging aid that costs a global lock per acquisition in "
          "Debian's Abseil build; the test fixtures turn it on");

namespace gpumem {
namespace {

[[noreturn]] void Die(const absl::Status& s) {
  std::cerr << "gpumemd: " << s.message() << std::endl;
  std::exit(1);
}

// The ledger at `path` ("none": off), its directory created if missing.
std::unique_ptr<ledger::TenantLedger> OpenLedger(const std::string& path) {
  ledger::LedgerOptions options;
  if (path != "none") {
    options.path = path;
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::error_code error;
    if (!dir.empty()) std::filesystem::create_directories(dir, error);
    if (error) {
      Die(absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path, ": cannot create directory ", dir.string(), ": ", error.message())));
    }
  }
  absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> opened =
      ledger::TenantLedger::Open(options);
  if (!opened.ok()) Die(opened.status());
  if (!(*opened)->enabled()) {
    std::cerr << "gpumemd: ledger off (--ledger=none): no events are recorded and usage "
                 "history lasts only while this daemon runs\n";
  } else {
    std::cerr << "gpumemd: ledger " << path << "; first allocation id "
              << (*opened)->first_allocation_id() << "; "
              << (*opened)->restart_event_count()
              << " allocation(s) live at the last unclean stop closed with DAEMON_RESTART\n";
  }
  return std::move(*opened);
}

std::string Pick(const std::string& flag, const std::string& config,
                 const char* fallback) {
  if (!flag.empty()) return flag;
  if (!config.empty()) return config;
  return fallback;
}

// Waits up to `limit` for live allocations to be freed (by their sessions,
// or by their processes ending), keeping systemd's STATUS= current; a second
// SIGTERM/SIGINT ends the wait at once.
void Drain(MemoryBroker* broker, SystemdNotifier* notifier, absl::Duration limit) {
  // SIGHUP stays pending (a reload while stopping means nothing).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  const absl::Time deadline = absl::Now() + limit;
  while (broker->live_allocations() > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      std::cerr << "gpumemd: drain time over; releasing " << broker->live_allocations()
                << " live allocation(s)\n";
      return;
    }
    if (broker->WaitUntilNoAllocations(std::min(left, absl::Milliseconds(200)))) break;
    struct timespec now = {0, 0};
    if (sigtimedwait(&stop_signals, nullptr, &now) > 0) {
      std::cerr << "gpumemd: second signal; releasing " << broker->live_allocations()
                << " live allocation(s) now\n";
      return;
    }
    notifier->Status(absl::StrCat("draining: ", broker->live_allocations(),
                                  " allocation(s) live, ",
                                  absl::ToInt64Seconds(deadline - absl::Now()), " s left"));
  }
  if (limit > absl::ZeroDuration()) std::cerr << "gpumemd: drained: no live allocations\n";
}

// SIGHUP: the whole file is loaded and checked (the tenant section too,
// with its lines), then its reloadable settings applied; `running` becomes
// the new config only if both succeed.
absl::Status Reload(const std::string& path, const ReloadableFlags& flags,
                    const std::vector<placement::DeviceView>& devices,
                    tenants::TenantDirectoryHolder* directory, quota::QuotaBook* quotas,
                    ledger::TenantLedger* ledger, MemoryBroker* broker,
                    v1::DaemonConfig* running) {
  google::protobuf::TextFormat::ParseInfoTree locations;
  absl::StatusOr<v1::DaemonConfig> next = LoadDaemonConfig(path, &locations);
  if (!next.ok()) return next.status();
  std::vector<std::string> restart_only = RestartOnlyChanges(*running, *next);
  TenantTargets tenant_targets;
  tenant_targets.devices = &devices;
  tenant_targets.directory = directory;
  tenant_targets.quotas = quotas;
  tenant_targets.ledger = ledger;
  tenant_targets.locations = &locations;
  tenant_targets.config_path = path;
  absl::StatusOr<ReloadOutcome> outcome =
      ApplyReloadableConfig(*next, flags, broker, &tenant_targets);
  if (!outcome.ok()) return outcome.status();
  restart_only.insert(restart_only.end(), outcome->restart_only.begin(),
                      outcome->restart_only.end());
  if (!restart_only.empty()) {
    std::cerr << "gpumemd: reload: " << absl::StrJoin(restart_only, ", ")
              << " changed; these take effect at the next start\n";
  }
  *running = *std::move(next);
  std::cerr << "gpumemd: reloaded " << path << ": " << absl::StrJoin(outcome->applied, "; ")
            << "\n";
  return absl::OkStatus();
}

int Run() {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  google::protobuf::TextFormat::ParseInfoTree config_locations;
  absl::StatusOr<v1::DaemonConfig> config = LoadDaemonConfig(config_path, &config_locations);
  if (!config.ok()) Die(config.status());
  const double drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  if (!(drain_seconds >= 0)) {
    Die(absl::InvalidArgumentError("--drain_seconds must be >= 0"));
  }

  const std::string backend_name =
      Pick(absl::GetFlag(FLAGS_backend), config->backend(), "sim");
  const std::string socket_path =
      Pick(absl::GetFlag(FLAGS_socket), config->socket(), "/run/gpumemd/gpumemd.sock");

  BrokerOptions options;
  absl::StatusOr<uint64_t> slab = ParseByteSize(
      Pick(absl::GetFlag(FLAGS_slab_size), config->pool().slab_size(), "1GiB"));
  if (!slab.ok()) Die(slab.status());
  if (*slab == 0) Die(absl::InvalidArgumentError("--slab_size must be > 0"));
  options.pool.slab_size = *slab;
  // empty_slab_release_seconds and admin_group are reloadable:
  // ApplyReloadableConfig sets them (the broker's Start checks the group).
  ReloadableFlags reloadable_flags;
  reloadable_flags.empty_slab_release_seconds =
      absl::GetFlag(FLAGS_empty_slab_release_seconds);
  reloadable_flags.admin_group = absl::GetFlag(FLAGS_admin_group);
  double reserve = absl::GetFlag(FLAGS_reserve_fraction);
  options.pool.reserve_fraction = reserve < 0 ? 0 : reserve;
  options.admin_group = Pick(absl::GetFlag(FLAGS_admin_group), config->admin_group(), "");
  if (options.pool.reserve_fraction > 1) {
    Die(absl::InvalidArgumentError("--reserve_fraction must be in [0, 1]"));
  }

  std::vector<std::string> kind_names(config->handle_kinds().begin(),
                                      config->handle_kinds().end());
  if (!absl::GetFlag(FLAGS_handle_kinds).empty()) {
    kind_names = absl::StrSplit(absl::GetFlag(FLAGS_handle_kinds), ',');
  }
  for (const std::string& name : kind_names) {
    absl::StatusOr<HandleKind> kind = ParseHandleKind(name);
    if (!kind.ok()) Die(kind.status());
    options.handle_kinds.push_back(*kind);
  }

  std::unique_ptr<Backend> backend;
  if (backend_name == "sim") {
    absl::StatusOr<std::vector<uint64_t>> sizes = ParseDeviceSizes(
        Pick(absl::GetFlag(FLAGS_sim_devices), config->sim_devices(), "4x16GiB"));
    if (!sizes.ok()) Die(sizes.status());
    absl::StatusOr<std::vector<PeerLink>> links = ParseSimTopology(
        Pick(absl::GetFlag(FLAGS_sim_topology), config->sim_topology(), ""),
        static_cast<uint32_t>(sizes->size()));
    if (!links.ok()) Die(links.status());
    auto sim = std::make_unique<SimBackend>(*sizes, *links);
    for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_sim_slab_create_delay),
                                                 ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
      uint32_t device = 0;
      absl::Duration delay;
      if (!absl::SimpleAtoi(kv.first, &device) || device >= sizes->size() ||
          !absl::ParseDuration(kv.second, &delay) || delay < absl::ZeroDuration()) {
        Die(absl::InvalidArgumentError(absl::StrCat(
            "--sim_slab_create_delay: bad entry \"", item,
            "\" (want DEVICE:DURATION with a device below ", sizes->size(),
            ", e.g. 0:300ms)")));
      }
      sim->SetCreateDelay(device, delay);
    }
    backend = std::move(sim);
    options.pool.granularity = 4096;
  } else if (backend_name == "cuda") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CudaBackend::Create();
    if (!cuda.ok()) Die(cuda.status());
    backend = std::move(*cuda);
  } else {
    Die(absl::InvalidArgumentError(absl::StrCat(
        "unknown --backend=", backend_name, " (use sim or cuda)")));
  }

  // Signals are handled by sigwait below; every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Every client holds a connection or two: allow as many fds as the hard
  // limit does, not the soft default of 1024.
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  // Tenants and quotas from the config; the ledger.
  std::vector<placement::DeviceView> device_views;
  for (const DeviceInfo& d : backend->devices()) {
    placement::DeviceView v;
    v.index = d.index;
    v.uuid = d.uuid;
    v.total_bytes = d.total_bytes;
    device_views.push_back(std::move(v));
  }
  absl::StatusOr<tenants::TenantDirectory> built_directory = tenants::TenantDirectory::Build(
      *config, &config_locations, absl::GetFlag(FLAGS_config), device_views);
  if (!built_directory.ok()) Die(built_directory.status());
  // The directory in force; SIGHUP replaces it (Reload).
  tenants::TenantDirectoryHolder tenant_directories(*std::move(built_directory));
  const std::shared_ptr<const tenants::TenantDirectory> tenant_directory =
      tenant_directories.Get();
  std::unique_ptr<ledger::TenantLedger> ledger = OpenLedger(
      Pick(absl::GetFlag(FLAGS_ledger), config->ledger(), "/var/lib/gpumemd/ledger.db"));
  quota::QuotaBook quotas(static_cast<uint32_t>(device_views.size()));
  std::vector<ledger::QuotaRow> quota_rows;
  for (const tenants::Tenant& t : tenant_directory->tenants()) {
    quotas.SetQuota(t.id, t.quota);
    if (!t.quota.unlimited()) {
      quota_rows.push_back({t.name, t.quota, "config", absl::GetCurrentTimeNanos()});
    }
  }
  if (absl::Status s = ledger->ReplaceQuotas(quota_rows); !s.ok()) Die(s);
  options.tenants = &tenant_directories;
  options.quotas = &quotas;
  options.ledger = ledger.get();

  MemoryBroker broker(backend.get(), options);
  absl::Status started = broker.Start();
  if (!started.ok()) Die(started);
  absl::StatusOr<ReloadOutcome> applied_at_start =
      ApplyReloadableConfig(*config, reloadable_flags, &broker);
  if (!applied_at_start.ok()) Die(applied_at_start.status());
  for (const std::string& line : applied_at_start->applied) {
    std::cerr << "gpumemd: " << line << "\n";
  }
  PeerTable peers;
  TenantAdmin tenant_admin(
      &tenant_directories, &quotas, ledger.get(), device_views,
      [&broker](const PeerCred& c) { return broker.IsAdmin(c); },
      [&broker] { broker.ServeWaiters(); });

  // Metrics are opt-in: without --metrics_listen the plain service is
  // registered and nothing is counted.
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  std::unique_ptr<CallMetrics> call_metrics;
  std::unique_ptr<GpuMemoryService> service;
  std::unique_ptr<MetricsEndpoint> metrics;
  if (!metrics_listen.empty()) {
    call_metrics = std::make_unique<CallMetrics>();
    service = std::make_unique<MeteredGpuMemoryService>(&broker, &peers, &tenant_admin,
                                                         call_metrics.get());
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(
        metrics_listen, {call_metrics->registry(),
                         std::make_shared<StatsCollector>(&broker)});
    if (!endpoint.ok()) Die(endpoint.status());
    metrics = std::move(*endpoint);
  } else {
    service = std::make_unique<GpuMemoryService>(&broker, &peers, &tenant_admin);
  }

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(service.get());
  // Our own health service: gRPC's default one adds polling threads that
  // double the cost of a stream round trip (health_service.h).
  HealthService health;
  builder.RegisterService(&health);
  StreamServiceOptions stream_options;
  stream_options.threads = absl::GetFlag(FLAGS_stream_threads);
  if (stream_options.threads < 1 || stream_options.threads > 64) {
    Die(absl::InvalidArgumentError("--stream_threads must be in [1, 64]"));
  }
  stream_options.backend_threads = absl::GetFlag(FLAGS_stream_backend_threads);
  if (stream_options.backend_threads < 1 || stream_options.backend_threads > 64) {
    Die(absl::InvalidArgumentError("--stream_backend_threads must be in [1, 64]"));
  }
  if (call_metrics != nullptr) {  // the stream is metered like the unary calls
    CallMetrics* m = call_metrics.get();
    stream_options.on_allocate = [m](const absl::Status& s, const v1::AllocateResponse& r,
                                     absl::Duration d) { m->RecordAllocate(ToGrpcStatus(s), r, d); };
    stream_options.on_free = [m](const absl::Status& s) { m->RecordFree(ToGrpcStatus(s)); };
  }
  StreamService streams(&broker, &peers, service.get(), stream_options);
  streams.AddCompletionQueues(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) Die(absl::InternalError("gRPC server failed to start"));
  streams.Start();
  health.Start(streams.shared_queue());

  absl::StatusOr<std::optional<int>> activation = TakeActivationSocket();
  if (!activation.ok()) Die(activation.status());
  SocketListener listener(socket_path, &broker, &peers);
  absl::Status bound = activation->has_value() ? listener.Adopt(**activation)
                                               : listener.Bind();
  if (!bound.ok()) Die(bound);
  absl::Status listening = listener.Start(server.get());
  if (!listening.ok()) Die(listening);

  const std::string serving = absl::StrCat(
      "serving ", backend->devices().size(), " ", backend->name(), " device(s) on ",
      listener.path(), activation->has_value() ? " (socket from systemd)" : "");
  std::cerr << "gpumemd: " << serving << "\n";
  for (const DeviceInfo& d : backend->devices()) {
    std::cerr << "gpumemd:   device " << d.index << " " << d.uuid << " "
              << FormatBytes(d.total_bytes) << " " << d.name << "\n";
  }
  std::cerr << "gpumemd: slab handle kinds offered:";
  for (HandleKind k : broker.handle_kinds()) std::cerr << " " << HandleKindName(k);
  std::cerr << "\n";
  if (metrics != nullptr) {
    std::cerr << "gpumemd: metrics on http://" << metrics_listen.substr(
                     0, metrics_listen.rfind(':'))
              << ":" << metrics->port() << "/metrics\n";
  }
  if (tenant_directory->configured()) {
    std::cerr << "gpumemd: " << tenant_directory->tenants().size() << " tenant(s)";
    if (!config->default_tenant().empty()) {
      std::cerr << "; unlisted uids go to \"" << config->default_tenant() << "\"";
    } else {
      std::cerr << "; unlisted uids are refused";
    }
    std::cerr << "\n";
  }

  SystemdNotifier notifier;
  notifier.Ready(serving);
  // The watchdog pings only while the broker's lock can be taken: a daemon
  // whose core is stuck stops pinging and systemd restarts it.
  notifier.StartWatchdog([&broker] {
    broker.live_allocations();
    return true;
  });
  if (SystemdNotifier::WatchdogInterval() > absl::ZeroDuration()) {
    std::cerr << "gpumemd: systemd watchdog every "
              << SystemdNotifier::WatchdogInterval() / 2 << "\n";
  }

  v1::DaemonConfig running = *config;
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    if (config_path.empty()) {
      std::cerr << "gpumemd: SIGHUP: no --config file, nothing to reload\n";
      continue;
    }
    notifier.Reloading(absl::StrCat("reloading ", config_path));
    absl::Status reloaded =
        Reload(config_path, reloadable_flags, device_views, &tenant_directories, &quotas,
               ledger.get(), &broker, &running);
    if (!reloaded.ok()) {
      std::cerr << "gpumemd: reload refused, the config in force is unchanged: "
                << reloaded.message() << "\n";
    }
    notifier.Ready(absl::StrCat(serving, reloaded.ok() ? "; config reloaded"
                                                       : "; last reload refused: ",
                                reloaded.message()));
  }

  broker.BeginDrain();
  broker.StopWaiting();  // waiting Allocates answer now, not at their deadline
  // Health checks (gpumemd_probe, Kubernetes readiness) see NOT_SERVING from
  // now on, so nothing new is sent here while the daemon drains.
  health.SetNotServing();
  std::cerr << "gpumemd: signal " << sig << ": stopping; new allocations are refused\n";
  notifier.Stopping(absl::StrCat("draining: ", broker.live_allocations(),
                                 " allocation(s) live"));
  Drain(&broker, &notifier, absl::Seconds(drain_seconds));
  listener.Stop();
  // In-flight calls are sub-millisecond; idle client connections would
  // otherwise hold Shutdown until the deadline.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
  metrics.reset();  // no scrape may reach the broker after this
  streams.Shutdown();
  broker.Shutdown();
  ledger->Close();  // commits the DAEMON_STOP events of the release above
  notifier.StopWatchdog();
  std::cerr << "gpumemd: stopped; every slab released\n";
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gpumemd: lends the memory of every GPU on this machine to client processes.\n"
      "Usage: gpumemd [--backend=sim|cuda] [--sim_devices=4x16GiB] "
      "[--sim_topology=nvlink:0-1,...] [--socket=PATH] [--config=FILE] "
      "[--slab_size=1GiB] [--empty_slab_release_seconds=30] "
      "[--reserve_fraction=0] [--handle_kinds=cuda_vmm_fd,cuda_ipc] [--admin_group=GROUP] "
      "[--drain_seconds=0] [--metrics_listen=HOST:PORT] "
      "[--ledger=/var/lib/gpumemd/ledger.db|none] [--stream_threads=1]");
  // --help lists the flags of this file (Abseil's default looks for a file
  // named after the program, gpumemd.cc, and found none).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "gpumemd: unexpected argument \"" << rest[1] << "\" (see --help)\n";
    return 1;
  }
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  return gpumem::Run();
}
