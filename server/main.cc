// gpumemd: the daemon's entry point.
//
// Reads flags and the optional textproto config (flags win), makes the
// backend, the broker and the gRPC server (no listening port of its own:
// connections arrive through SocketListener, which knows who the caller
// is), and then waits for SIGTERM/SIGINT. Shutdown order: stop accepting
// and remove the socket, drain gRPC, release every allocation and slab,
// exit 0. Start-up errors are one line on stderr and exit status 1.
#include <signal.h>
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <google/protobuf/text_format.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/backend/cuda_backend.h"
#include "server/backend/sim_backend.h"
#include "server/backend/sim_topology.h"
#include "server/ledger/tenant_ledger.h"
#include "server/quota/quota_book.h"
#include "server/service/gpumem_service.h"
#include "server/service/health_service.h"
#include "server/service/memory_broker.h"
#include "server/service/socket_listener.h"
#include "server/service/stream_service.h"
#include "server/session/peer_credentials.h"
#include "server/tenants/tenant_admin.h"
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
ABSL_FLAG(std::string, ledger, "",
          "the ledger file (SQLite; directory created), or none to keep no ledger "
          "(default /var/lib/gpumemd/ledger.db)");
ABSL_FLAG(int, stream_threads, 1,
          "threads (one completion queue each) serving the Stream RPC");

namespace gpumem {
namespace {

[[noreturn]] void Die(const absl::Status& s) {
  std::cerr << "gpumemd: " << s.message() << std::endl;
  std::exit(1);
}

// `locations` records where each field was, for the tenant checks' errors.
absl::StatusOr<v1::DaemonConfig> LoadConfig(
    const std::string& path, google::protobuf::TextFormat::ParseInfoTree* locations) {
  v1::DaemonConfig config;
  if (path.empty()) return config;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::Status parsed = tenants::ParseConfigText(text.str(), path, &config, locations);
  if (!parsed.ok()) return parsed;
  return config;
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

int Run() {
  google::protobuf::TextFormat::ParseInfoTree config_locations;
  absl::StatusOr<v1::DaemonConfig> config =
      LoadConfig(absl::GetFlag(FLAGS_config), &config_locations);
  if (!config.ok()) Die(config.status());

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
  double release = absl::GetFlag(FLAGS_empty_slab_release_seconds);
  if (release < 0) {
    release = config->pool().empty_slab_release_seconds() > 0
                  ? config->pool().empty_slab_release_seconds() : 30;
  }
  options.pool.empty_release_after = absl::Seconds(release);
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
    backend = std::make_unique<SimBackend>(*sizes, *links);
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
  absl::StatusOr<tenants::TenantDirectory> tenant_directory = tenants::TenantDirectory::Build(
      *config, &config_locations, absl::GetFlag(FLAGS_config), device_views);
  if (!tenant_directory.ok()) Die(tenant_directory.status());
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
  options.tenants = &*tenant_directory;
  options.quotas = &quotas;
  options.ledger = ledger.get();

  MemoryBroker broker(backend.get(), options);
  absl::Status started = broker.Start();
  if (!started.ok()) Die(started);
  PeerTable peers;
  tenants::TenantAdmin tenant_admin(
      &*tenant_directory, &quotas, ledger.get(), device_views,
      [&broker](const PeerCred& c) { return broker.IsAdmin(c); },
      [&broker] { broker.ServeWaiters(); });
  GpuMemoryService service(&broker, &peers, &tenant_admin);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  // Our own health service: gRPC's default one adds polling threads that
  // double the cost of a stream round trip (health_service.h).
  HealthService health;
  builder.RegisterService(&health);
  StreamServiceOptions stream_options;
  stream_options.threads = absl::GetFlag(FLAGS_stream_threads);
  if (stream_options.threads < 1 || stream_options.threads > 64) {
    Die(absl::InvalidArgumentError("--stream_threads must be in [1, 64]"));
  }
  StreamService streams(&broker, &peers, &service, stream_options);
  streams.AddCompletionQueues(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) Die(absl::InternalError("gRPC server failed to start"));
  streams.Start();
  health.Start(streams.shared_queue());

  SocketListener listener(socket_path, &broker, &peers);
  absl::Status bound = listener.Bind();
  if (!bound.ok()) Die(bound);
  absl::Status listening = listener.Start(server.get());
  if (!listening.ok()) Die(listening);

  std::cerr << "gpumemd: serving " << backend->devices().size() << " "
            << backend->name() << " device(s) on " << socket_path << "\n";
  for (const DeviceInfo& d : backend->devices()) {
    std::cerr << "gpumemd:   device " << d.index << " " << d.uuid << " "
              << FormatBytes(d.total_bytes) << " " << d.name << "\n";
  }
  std::cerr << "gpumemd: slab handle kinds offered:";
  for (HandleKind k : broker.handle_kinds()) std::cerr << " " << HandleKindName(k);
  std::cerr << "\n";
  if (tenant_directory->configured()) {
    std::cerr << "gpumemd: " << tenant_directory->tenants().size() << " tenant(s)";
    if (!config->default_tenant().empty()) {
      std::cerr << "; unlisted uids go to \"" << config->default_tenant() << "\"";
    } else {
      std::cerr << "; unlisted uids are refused";
    }
    std::cerr << "\n";
  }

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    std::cerr << "gpumemd: SIGHUP ignored (restart to reload the config)\n";
  }
  std::cerr << "gpumemd: signal " << sig << ", shutting down\n";
  health.SetNotServing();
  listener.Stop();
  broker.StopWaiting();  // waiting Allocates answer now, not at their deadline
  // In-flight calls are sub-millisecond; idle client connections would
  // otherwise hold Shutdown until the deadline.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
  streams.Shutdown();
  broker.Shutdown();
  ledger->Close();  // commits the DAEMON_STOP events of the release above
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
  return gpumem::Run();
}
