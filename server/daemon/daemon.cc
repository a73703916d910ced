// See daemon.h. StartParts is the wiring list: each part is made from the
// settings and the parts made before it, in the order they depend on each
// other. Stop takes them down in the reverse order of what could still
// reach what: no new connection, no new call, no task left on a worker, no
// event left on a queue, then the core, then the ledger.
#include "server/daemon/daemon.h"

#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <iostream>
#include <optional>

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
#include "server/metrics/ledger_collector.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/stats_collector.h"
#include "server/pool/slab_pool.h"
#include "server/quota/quota_book.h"
#include "server/restart/durable_slab_keeper.h"
#include "server/service/async_service.h"
#include "server/service/event_queues.h"
#include "server/service/gpumem_service.h"
#include "server/service/health_service.h"
#include "server/service/reflection_service.h"
#include "server/service/ring_transport.h"
#include "server/service/socket_listener.h"
#include "server/service/stream_service.h"
#include "server/service/tenant_admin.h"
#include "server/service/worker_pool.h"
#include "server/session/peer_credentials.h"
#include "server/state/durable_state.h"
#include "server/systemd/fd_store.h"
#include "server/systemd/listen_fds.h"
#include "server/systemd/notifier.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

namespace {

// The soft RLIMIT_NOFILE raised to the hard one (every client connection
// costs an fd; the fd reserve is counted under it), said in one line.
void RaiseFdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t before = rl.rlim_cur;
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      std::cerr << "gpumemd: open files: cannot raise the soft limit " << before
                << " to the hard limit " << rl.rlim_max << ": " << strerror(errno) << "\n";
      return;
    }
  }
  std::cerr << "gpumemd: open files: limit " << rl.rlim_cur;
  if (before != rl.rlim_cur) std::cerr << " (soft limit raised from " << before << ")";
  std::cerr << "\n";
}

ConnectionLimitSettings ConnectionLimitsOf(const Settings& s) {
  ConnectionLimitSettings l;
  l.per_uid = s.max_connections_per_uid.value;
  l.per_tenant_socket = s.max_connections_per_tenant_socket.value;
  l.fd_reserve = s.fd_reserve.value;
  l.streams_per_connection = s.max_concurrent_streams.value;
  return l;
}

std::string ConnectionLimitsLine(const Settings& s) {
  return absl::StrCat(
      "connections: at most ", s.max_connections_per_uid.value, " per uid (",
      SourceName(s.max_connections_per_uid.source), "), ",
      s.max_connections_per_tenant_socket.value, " per tenant socket (",
      SourceName(s.max_connections_per_tenant_socket.source), "); ", s.fd_reserve.value,
      " fds reserved (", SourceName(s.fd_reserve.source), ")");
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const Settings& s) {
  if (s.backend.value == "cuda") return CudaBackend::Create("libcuda.so.1", s.device_headroom_bytes);
  auto sim = std::make_unique<SimBackend>(s.sim_device_sizes, s.sim_links);
  for (const auto& [device, delay] : s.sim_slab_create_delays) sim->SetCreateDelay(device, delay);
  return std::unique_ptr<Backend>(std::move(sim));
}

// The ledger at `path` ("none": off), its directory created if missing.
absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> OpenLedger(const std::string& path,
                                                                  bool defer_recovery,
                                                                  int64_t max_pages,
                                                                  int64_t retain_events) {
  ledger::LedgerOptions options;
  options.defer_recovery = defer_recovery;
  options.max_page_count = max_pages;
  options.retain_events = static_cast<uint64_t>(retain_events);
  options.churn_pairs_per_second = ledger::kChurnPairsPerSecond;
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
  } else if (defer_recovery) {
    std::cerr << "gpumemd: ledger " << path << "; first allocation id "
              << (*opened)->first_allocation_id() << "; "
              << (*opened)->deferred_live().size()
              << " allocation(s) live at the last stop, reconciled with what survived\n";
  } else {
    std::cerr << "gpumemd: ledger " << path << "; first allocation id "
              << (*opened)->first_allocation_id() << "; "
              << (*opened)->restart_event_count()
              << " allocation(s) live at the last unclean stop closed with DAEMON_RESTART\n";
  }
  return opened;
}

// The socket file at `path` is there (a kept listening socket is reachable
// only through it).
bool SocketFileIsThere(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace

struct Daemon::Parts {
  ListenedFds passed;  // what systemd passed at start (until taken)
  FdStore fd_store;
  std::unique_ptr<state::DurableState> state;
  state::Snapshot previous;  // what the last daemon kept (until restored)
  std::unique_ptr<DurableSlabKeeper> keeper;
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
  std::unique_ptr<ReflectionService> reflection;
  std::unique_ptr<EventQueues> queues;
  std::unique_ptr<WorkerPool> backend_workers;
  std::unique_ptr<WorkerPool> query_workers;
  std::unique_ptr<GpuMemoryService> unary;
  std::unique_ptr<StreamService> streams;
  std::unique_ptr<RingTransport> rings;  // outlives the listener, which lends
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<SocketListener> listener;
  SystemdNotifier notifier;
  std::string serving;  // the status line
  bool listener_stored = false;  // the listening socket is in the fd store
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
  if (!started.ok()) {
    // What the last daemon kept stays kept for the next try.
    if (parts_->state != nullptr) {
      StopKeeping(/*quiet=*/true);
    } else {
      Stop();
    }
  }
  return started;
}

absl::Status Daemon::StartParts() {
  Parts& p = *parts_;
  const Settings& s = settings_;
  // The heap, before any thread: glibc's arena per busy thread and an mmap
  // threshold that rises with every large chunk freed leave what a burst of
  // clients took spread over arenas that no trim empties; two arenas and a
  // fixed threshold give it back once it is freed.
  mallopt(M_ARENA_MAX, 2);
  mallopt(M_MMAP_THRESHOLD, 128 << 10);

  // What systemd passed (an activation socket, what the last daemon kept in
  // the fd store), taken before anything else can inherit or close it.
  absl::StatusOr<ListenedFds> passed = TakeListenFds();
  if (!passed.ok()) return passed.status();
  p.passed = *std::move(passed);
  for (const std::string& line : p.passed.dropped) std::cerr << "gpumemd: " << line << "\n";

  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(s);
  if (!backend.ok()) return backend.status();
  p.backend = *std::move(backend);
  // After the backend: a daemon that cannot start says one line, the reason.
  RaiseFdLimit();

  // Slab ids never repeat across daemons of this machine (a client may still
  // map a slab of an earlier daemon, known by its id): each daemon starts
  // numbering at its start millisecond << 12, above any earlier one's (which
  // would need 4096 slabs a millisecond to catch up; two daemons of one
  // second are told apart). The ids stay below 2^53, exact in JSON.
  SlabPool::AdvanceSlabIdsPast(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())) << 12);

  // What a restart needs, and what the last daemon left there.
  if (s.state.value != "none") {
    std::string note;
    absl::StatusOr<std::unique_ptr<state::DurableState>> opened =
        state::DurableState::Open(s.state.value, &p.previous, &note);
    if (!opened.ok()) return opened.status();
    p.state = *std::move(opened);
    std::cerr << "gpumemd: state " << s.state.value << ": " << note << "\n";
  } else {
    std::cerr << "gpumemd: state off (--state=none): a restart closes every allocation\n";
  }

  absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> ledger =
      OpenLedger(s.ledger.value, /*defer_recovery=*/p.state != nullptr,
                 s.ledger_max_pages.value, s.ledger_retain_events.value);
  if (!ledger.ok()) return ledger.status();
  p.ledger = *std::move(ledger);
  p.quotas = std::make_unique<quota::QuotaBook>(
      static_cast<uint32_t>(p.backend->devices().size()));

  BrokerOptions options;
  options.pool.slab_size = s.slab_size.value;
  options.pool.min_slab_size = s.min_slab_size.value;
  options.max_alignment = s.max_alignment.value;
  options.pool.empty_release_after = s.empty_slab_release.value;
  options.pool.reserve_fraction = s.reserve_fraction.value;
  if (s.backend.value == "sim") options.pool.granularity = 4096;
  options.handle_kinds = s.handle_kinds.value;
  options.tenants = &p.directory;
  options.quotas = p.quotas.get();
  options.ledger = p.ledger.get();
  options.restore_grace = s.restore_grace.value;
  options.admission.max_wait = s.max_wait.value;
  options.admission.max_waiting_bytes_per_tenant = s.max_waiting_bytes_per_tenant.value;
  if (p.state != nullptr) {
    options.state = p.state.get();
    // The keeper names tenants through the broker, made just below; it is
    // called only once the broker serves.
    p.keeper = std::make_unique<DurableSlabKeeper>(
        p.state.get(), p.fd_store.enabled() ? &p.fd_store : nullptr,
        [&p](uint32_t tenant) { return p.broker->TenantName(tenant); });
    options.slab_keeper = p.keeper.get();
  }
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
  // The listener serves socket tenants' sockets too; made here, before any
  // thread could serve a tenant RPC, bound and started below.
  p.listener = std::make_unique<SocketListener>(s.socket.value, broker, &p.peers);
  p.listener->SetConnectionLimits(ConnectionLimitsOf(s));
  std::cerr << "gpumemd: " << ConnectionLimitsLine(s) << "\n";
  p.tenant_admin->ServeSocketTenants(
      {&p.directory, broker, p.listener.get(), s.tenant_socket_dir.value});
  // The ledger's socket tenants are listed again before the restore, whose
  // sessions and slabs may be theirs (their sockets come once the listener
  // runs).
  for (const std::string& line : p.tenant_admin->RestoreSocketTenants()) {
    std::cerr << "gpumemd: " << line << "\n";
  }
  if (p.state != nullptr) RestoreFromPrevious();

  // Metrics are opt-in: without --metrics_listen nothing is counted.
  if (!s.metrics_listen.value.empty()) {
    p.call_metrics = std::make_unique<CallMetrics>();
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(
        s.metrics_listen.value,
        {p.call_metrics->registry(), std::make_shared<StatsCollector>(broker),
         std::make_shared<LedgerCollector>(p.ledger.get())});
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
  unary.ledger = p.ledger.get();
  unary.service = &p.service;
  unary.backend_workers = p.backend_workers.get();
  unary.query_workers = p.query_workers.get();
  unary.observer = p.call_metrics.get();
  p.unary = std::make_unique<GpuMemoryService>(unary);
  p.streams = std::make_unique<StreamService>(broker, &p.peers, &p.service,
                                              p.backend_workers.get(), p.call_metrics.get());
  // Request rings, lent over the slab channel and served by their own
  // workers; the per-uid bound is the connections' (each ring needs a
  // session, and its memory and fds are the daemon's).
  RingTransportOptions ring_options;
  ring_options.enabled = s.request_rings.value;
  ring_options.workers = s.ring_workers.value;
  ring_options.max_rings_per_uid = s.max_connections_per_uid.value;
  absl::StatusOr<std::unique_ptr<RingTransport>> rings = RingTransport::Create(
      broker, p.backend_workers.get(), p.call_metrics.get(), ring_options);
  if (!rings.ok()) return rings.status();
  p.rings = *std::move(rings);
  if (s.request_rings.value) p.listener->SetRingLender(p.rings.get());
  std::cerr << "gpumemd: request rings "
            << (s.request_rings.value
                    ? absl::StrCat("on, served by ", s.ring_workers.value, " worker(s)")
                    : std::string("off (--request_rings=false)"))
            << "\n";

  grpc::ServerBuilder builder;
  builder.RegisterService(&p.service);
  // Our own health service: gRPC's default one adds polling threads
  // (health_service.h); our own reflection: gRPC's is synchronous, a
  // thread held per open stream (reflection_service.h).
  builder.RegisterService(&p.health);
  ReflectionLimits reflection_limits;
  reflection_limits.max_streams_per_uid = static_cast<int>(s.max_reflection_streams_per_uid.value);
  p.reflection = std::make_unique<ReflectionService>(
      &p.peers,
      std::vector<std::string>{v1::GpuMemory::service_full_name(),
                               "grpc.health.v1.Health",
                               "grpc.reflection.v1.ServerReflection"},
      reflection_limits);
  p.reflection->AddTo(&builder);
  grpc::ResourceQuota quota("gpumemd");
  quota.Resize(static_cast<size_t>(s.grpc_memory_limit.value));
  builder.SetResourceQuota(quota);
  // Per connection: streams in flight (a client past it waits for one to
  // end; HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS), and the largest request.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(s.max_concurrent_streams.value));
  builder.SetMaxReceiveMessageSize(static_cast<int>(s.max_receive_message_size.value));
  std::cerr << "gpumemd: grpc: " << s.max_concurrent_streams.value
            << " streams per connection (" << SourceName(s.max_concurrent_streams.source)
            << "), requests up to " << FormatBytes(s.max_receive_message_size.value) << " ("
            << SourceName(s.max_receive_message_size.source) << "), buffers up to "
            << FormatBytes(s.grpc_memory_limit.value) << " ("
            << SourceName(s.grpc_memory_limit.source) << ")\n";
  p.queues->AddTo(&builder);
  p.server = builder.BuildAndStart();
  if (!p.server) return absl::InternalError("gRPC server failed to start");
  p.unary->Start(p.queues->queues());
  p.streams->Start(p.queues->queues());
  p.health.Start(p.queues->first());
  p.reflection->Start(p.queues->queues());
  p.queues->Start();

  // The listening socket: systemd's (socket activation), else the one the
  // last daemon kept in the fd store (clients' connects waited in its
  // backlog meanwhile), else a new one, kept in the fd store from now on.
  absl::Status bound;
  const bool from_activation = p.passed.socket.has_value() && p.passed.socket_from_activation;
  bool from_store = p.passed.socket.has_value() && !from_activation;
  if (from_store && !SocketFileIsThere(s.socket.value)) {
    // Its file was removed meanwhile: nobody can reach it any more.
    std::cerr << "gpumemd: the kept listening socket's file " << s.socket.value
              << " is gone: binding a new socket\n";
    close(*p.passed.socket);
    p.fd_store.Remove(kStoredListenName);
    from_store = false;
  }
  if (from_activation) {
    bound = p.listener->Adopt(*p.passed.socket);
  } else if (from_store) {
    bound = p.listener->Adopt(*p.passed.socket, /*owns_path=*/true);
  } else {
    bound = p.listener->Bind();
  }
  p.passed.socket.reset();
  if (!bound.ok()) return bound;
  if (from_store) {
    p.listener_stored = true;
  } else if (!from_activation && p.fd_store.enabled()) {
    p.listener_stored = p.fd_store.Deposit(kStoredListenName, p.listener->listen_fd()).ok();
  }
  if (absl::Status listening = p.listener->Start(p.server.get()); !listening.ok()) {
    return listening;
  }
  // The restored socket tenants' sockets; the config's tenant sockets are
  // made (one that cannot be is a start-up error).
  for (const std::string& line : p.tenant_admin->ServeRestoredSockets()) {
    std::cerr << "gpumemd: " << line << "\n";
  }
  if (std::vector<std::string> unmade = p.tenant_admin->SyncConfigSockets(); !unmade.empty()) {
    return absl::FailedPreconditionError(absl::StrJoin(unmade, "; "));
  }

  p.serving = absl::StrCat("serving ", p.backend->devices().size(), " ", p.backend->name(),
                           " device(s) on ", p.listener->path(),
                           from_activation ? " (socket from systemd)"
                           : from_store    ? " (socket kept over the restart)"
                                           : "");
  std::cerr << "gpumemd: " << p.serving << "\n";
  for (const DeviceInfo& d : p.backend->devices()) {
    std::cerr << "gpumemd:   device " << d.index << " " << d.uuid << " "
              << FormatBytes(d.total_bytes) << " " << d.name;
    if (const std::string origin = p.backend->HeadroomOrigin(d.index); !origin.empty()) {
      std::cerr << ", headroom " << FormatBytes(p.backend->Headroom(d.index)) << " (" << origin
                << ")";
    }
    std::cerr << "\n";
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

void Daemon::RestoreFromPrevious() {
  Parts& p = *parts_;
  // The slab handles the fd store gave back, by slab id; other names of
  // ours that are not slabs' are dropped here, saying so.
  std::map<uint64_t, int> slab_fds;
  for (const auto& [name, fd] : p.passed.stored) {
    std::optional<uint64_t> id = SlabIdOfFdName(name);
    if (!id.has_value() || slab_fds.count(*id) != 0) {
      std::cerr << "gpumemd: fd store: dropped \"" << name << "\": not a name gpumemd gives\n";
      close(fd);
      p.fd_store.Remove(name);
      continue;
    }
    slab_fds[*id] = fd;
  }
  p.passed.stored.clear();
  std::set<uint64_t> handed;  // slabs whose handle came from the store
  for (const auto& [id, fd] : slab_fds) handed.insert(id);

  const size_t ledger_live = p.ledger->deferred_live().size();
  if (p.previous.empty() && slab_fds.empty()) {
    // Nothing carried over: the ledger closes what it had open, if anything
    // (ended before the stop, if the last daemon's records say so).
    if (ledger_live > 0) {
      p.ledger->Resume({}, {},
                       p.previous.adopted ? "nothing was live at the last stop"
                                          : "nothing survived: the last daemon kept no state",
                       p.previous.adopted ? std::max<int64_t>(p.previous.last_change_ns, 1) : 0);
    }
    return;
  }
  MemoryBroker::RestoreOutcome out = p.broker->Restore(p.previous, std::move(slab_fds));

  // The keeper takes over what it keeps from the last daemon's records; what
  // did not survive leaves the state file and the fd store.
  std::set<uint64_t> dropped(out.dropped_slabs.begin(), out.dropped_slabs.end());
  std::set<uint64_t> refused(out.refused_handles.begin(), out.refused_handles.end());
  for (const state::SlabRecord& r : p.previous.slabs) {
    const bool stored = handed.count(r.slab_id) != 0;
    if (dropped.count(r.slab_id) != 0) {
      p.state->RemoveSlab(r.slot);
      if (stored) p.fd_store.Remove(SlabFdName(r.slab_id));
      continue;
    }
    if (stored && refused.count(r.slab_id) != 0) p.fd_store.Remove(SlabFdName(r.slab_id));
    p.keeper->AdoptSlabRecord(r, stored && refused.count(r.slab_id) == 0);
  }
  std::set<std::pair<uint64_t, uint64_t>> dropped_holders(out.dropped_holders.begin(),
                                                           out.dropped_holders.end());
  for (const state::HolderRecord& r : p.previous.holders) {
    if (dropped_holders.count({r.slab_id, r.session}) != 0) {
      p.state->RemoveHolder(r.slot);
    } else {
      p.keeper->AdoptHolderRecord(r);
    }
  }
  const size_t closures = p.ledger->Resume(
      out.survivors, out.closed, out.Summary(),
      p.previous.adopted ? std::max<int64_t>(p.previous.last_change_ns, 1) : 0);
  // The restart's record is on disk before anything is served: a daemon
  // killed again at once must not lose it.
  if (absl::Status flushed = p.ledger->Flush(); !flushed.ok()) {
    std::cerr << "gpumemd: ledger: " << flushed.message() << "\n";
  }
  std::cerr << "gpumemd: restart: " << out.Summary() << "; the ledger had " << ledger_live
            << " open, closed " << closures << " with DAEMON_RESTART\n";
  for (const std::string& line : out.notes) std::cerr << "gpumemd:   " << line << "\n";
  if (out.slabs_awaiting_handle > 0) {
    std::cerr << "gpumemd: clients have " << absl::FormatDuration(settings_.restore_grace.value)
              << " to give back the handles of " << out.slabs_awaiting_handle << " slab(s)\n";
  }
  p.previous = state::Snapshot();
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
    // What waits for a restart keeps its running value (the table's
    // restart-only rows), so `next` says what is in force.
    KeepRestartOnly(settings_, &*next);
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
    p.listener->SetConnectionLimits(ConnectionLimitsOf(*next));
    if (p.rings != nullptr) p.rings->SetMaxRingsPerUid(next->max_connections_per_uid.value);
    outcome->applied.push_back(ConnectionLimitsLine(*next));
    settings_ = *std::move(next);
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
  // Everything is released: the next daemon starts afresh, on a new socket.
  if (p.listener_stored) p.fd_store.Remove(kStoredListenName);
  // Connected clients hear gRPC's shutdown through the listener: it stops
  // only after.
  if (p.listener != nullptr) p.listener->StopAccepting();
  if (p.server != nullptr) {
    // In-flight calls are sub-millisecond; idle client connections would
    // otherwise hold Shutdown until the deadline.
    p.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
  }
  if (p.listener != nullptr) p.listener->Stop();
  if (p.rings != nullptr) p.rings->Close();  // every ring ends; no more are lent
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

void Daemon::StopForRestart() { StopKeeping(/*quiet=*/false); }

void Daemon::StopKeeping(bool quiet) {
  if (stopped_ || parts_ == nullptr) return;
  stopped_ = true;
  Parts& p = *parts_;
  if (!quiet) {
    std::cerr << "gpumemd: stopping for a restart: every allocation, slab and session is "
                 "kept for the next daemon\n";
    p.notifier.Stopping("stopping for a restart: state kept");
  }
  p.health.SetNotServing();
  // First, while every call is answered and recorded: from now on nothing
  // kept changes (no release, no event, no record removed).
  if (p.broker != nullptr) p.broker->ShutdownForRestart();
  if (p.listener != nullptr) p.listener->StopAccepting();
  if (p.server != nullptr) {
    p.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
  }
  if (p.listener != nullptr) {
    p.listener->StopForRestart();  // the socket lives on in the fd store
  }
  if (p.rings != nullptr) p.rings->Close();  // clients ask the next daemon for new ones
  p.metrics.reset();
  if (p.backend_workers != nullptr) p.backend_workers->Shutdown();
  if (p.query_workers != nullptr) p.query_workers->Shutdown();
  if (p.streams != nullptr) p.streams->Close();
  if (p.queues != nullptr) p.queues->Shutdown();
  if (p.ledger != nullptr) p.ledger->Close();  // what was recorded is committed
  p.notifier.StopWatchdog();
  // The broker is not shut down further: its slabs' handles close with the
  // process, which the fd store's copies and the clients' mappings outlive.
  if (!quiet) std::cerr << "gpumemd: stopped for a restart\n";
}

}  // namespace gpumem
