// gpumemd: the daemon's entry point, a wiring list.
//
// Reads the command line and the optional config file into Settings (flags
// over file over defaults, server/config/settings.h), builds the Daemon
// (server/daemon/daemon.h), and turns signals into its steps:
//  - SIGHUP: Reload (a bad file is logged with FILE:LINE:COLUMN and changes
//    nothing);
//  - SIGTERM/SIGINT: Drain (a second one cuts the wait short), then Stop,
//    exit 0.
//  - SIGUSR2: StopForRestart, exit kRestartExitStatus (75): everything is
//    kept for the next daemon (deploy/gpumemd.service sends it for stop and
//    restart, and restarts on this status).
// Start-up errors are one line on stderr and exit status 1.
#include <signal.h>
#include <sys/resource.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <google/protobuf/text_format.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/config/daemon_config.h"
#include "server/config/settings.h"
#include "server/daemon/daemon.h"

// Every flag is optional: not given, the config file decides, then the
// built-in default (listed by --help, decided in server/config/settings.h).
ABSL_FLAG(std::optional<std::string>, config, std::nullopt,
          "daemon config file, protobuf text format (gpumem.v1.DaemonConfig)");
ABSL_FLAG(std::optional<std::string>, backend, std::nullopt, "device backend: sim or cuda");
ABSL_FLAG(std::optional<std::string>, sim_devices, std::nullopt,
          "simulated devices, e.g. 4x16GiB or 80GiB,80GiB,40GiB");
ABSL_FLAG(std::optional<std::string>, sim_topology, std::nullopt,
          "simulated NVLink groups, e.g. nvlink:0-1,2-3 (default: all through the host)");
ABSL_FLAG(std::optional<std::string>, sim_slab_create_delay, std::nullopt,
          "sim backend: slab creation on these devices sleeps first, as a slow "
          "driver's would, e.g. 0:300ms,2:50ms (for tests and benchmarks)");
ABSL_FLAG(std::optional<std::string>, socket, std::nullopt, "Unix socket path");
ABSL_FLAG(std::optional<std::string>, tenant_socket_dir, std::nullopt,
          "where socket tenants' sockets are made");
ABSL_FLAG(std::optional<std::string>, slab_size, std::nullopt, "size of pool slabs");
ABSL_FLAG(std::optional<std::string>, min_slab_size, std::nullopt,
          "a tenant's first slab on a device; slabs grow with its use up to --slab_size");
ABSL_FLAG(std::optional<std::string>, max_alignment, std::nullopt,
          "the largest alignment an Allocate may ask for");
ABSL_FLAG(std::optional<double>, empty_slab_release_seconds, std::nullopt,
          "seconds an empty slab is kept before it goes back");
ABSL_FLAG(std::optional<double>, reserve_fraction, std::nullopt,
          "fraction of each device taken as slabs at start and kept");
ABSL_FLAG(std::optional<std::string>, admin_group, std::nullopt,
          "Unix group whose members (besides root) see every session and "
          "tenant and may change quotas and tenants");
ABSL_FLAG(std::optional<std::string>, handle_kinds, std::nullopt,
          "slab handle kinds offered to clients, the first the default: memfd (sim), "
          "cuda_vmm_fd, cuda_ipc (cuda)");
ABSL_FLAG(std::optional<double>, drain_seconds, std::nullopt,
          "on SIGTERM, wait up to this long for live allocations to be freed "
          "(new allocations are refused meanwhile) before releasing everything");
ABSL_FLAG(std::optional<std::string>, metrics_listen, std::nullopt,
          "serve Prometheus metrics over HTTP on HOST:PORT, e.g. 127.0.0.1:9464");
ABSL_FLAG(std::optional<std::string>, ledger, std::nullopt,
          "the ledger file (SQLite; directory created), or none to keep no ledger");
ABSL_FLAG(std::optional<std::string>, state, std::nullopt,
          "where what a restart needs is kept (a file, on tmpfs), or none to keep "
          "nothing (a restart then closes every allocation)");
ABSL_FLAG(std::optional<double>, restore_grace_seconds, std::nullopt,
          "after a restart, how long clients have to come back before what they "
          "held is closed");
ABSL_FLAG(std::optional<int>, stream_threads, std::nullopt,
          "completion queues (one thread each) serving every gRPC call");
ABSL_FLAG(std::optional<int>, stream_backend_threads, std::nullopt,
          "threads that run the requests needing backend work (a new slab), so a "
          "slow device holds up no other call");
ABSL_FLAG(std::optional<int>, query_threads, std::nullopt,
          "threads that answer GetStats and the ledger and tenant RPCs");
ABSL_FLAG(std::optional<int>, reclaim_wait_ms, std::nullopt,
          "hold an Allocate refused for room that other sessions' idle leases "
          "could cover at most this long while they give them back (0: off)");
ABSL_FLAG(std::optional<int>, wait_bypass_limit, std::nullopt,
          "fair waiting: a waiting request bypassed this many times reserves "
          "the room that frees up on its devices");
ABSL_FLAG(std::optional<int>, wait_reserve_ms, std::nullopt,
          "fair waiting: how long one such reservation lasts at most");
ABSL_FLAG(std::optional<int64_t>, max_wait_ms, std::nullopt,
          "the longest wait_ms an Allocate may ask for; more is refused "
          "INVALID_ARGUMENT");
ABSL_FLAG(std::optional<std::string>, max_waiting_bytes_per_tenant, std::nullopt,
          "the bytes one tenant's waiting requests may hold in the daemon at once, "
          "e.g. 16MiB (0: no limit); one more waiter is refused RESOURCE_EXHAUSTED");
ABSL_FLAG(std::optional<int64_t>, ledger_retain_events, std::nullopt,
          "ledger retention: the newest events kept (default 10000000); older ones are "
          "folded into per-tenant summaries (the ledger's retained table) and deleted; "
          "0: keep every event");
ABSL_FLAG(std::optional<int64_t>, ledger_max_pages, std::nullopt,
          "tests: the ledger file may grow to this many pages (SQLite then answers "
          "\"database or disk is full\"); 0: no limit");
ABSL_FLAG(std::optional<int>, max_connections_per_uid, std::nullopt,
          "connections one uid may hold at once over every socket; one more is "
          "closed at accept (root and the admin group are not counted)");
ABSL_FLAG(std::optional<int>, max_connections_per_tenant_socket, std::nullopt,
          "connections one tenant socket may hold at once");
ABSL_FLAG(std::optional<int>, fd_reserve, std::nullopt,
          "file descriptors kept for the daemon's own work: client connections "
          "are refused at accept when fewer are free (root and the admin group "
          "may use the upper half)");
ABSL_FLAG(std::optional<int>, max_concurrent_streams, std::nullopt,
          "gRPC calls in flight at once per connection (SETTINGS_MAX_CONCURRENT_STREAMS)");
ABSL_FLAG(std::optional<std::string>, max_receive_message_size, std::nullopt,
          "the largest request message gRPC takes, e.g. 1MiB; a larger one is "
          "refused RESOURCE_EXHAUSTED");
ABSL_FLAG(std::optional<int>, max_reflection_streams_per_uid, std::nullopt,
          "server reflection streams (grpcurl, buf curl) one uid may hold open "
          "at once; one more is refused RESOURCE_EXHAUSTED, an idle one closed "
          "after 10 s");
ABSL_FLAG(std::optional<std::string>, grpc_memory_limit, std::nullopt,
          "the memory gRPC's buffers may take in all (its ResourceQuota), e.g. 256MiB");
ABSL_FLAG(bool, check_config, false,
          "read the config file and flags as a start would, say what is wrong "
          "(FILE:LINE:COLUMN) or \"config ok\", and exit (1 or 0) without starting");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Abseil's lock-order checking on every absl::Mutex (gRPC's own locks "
          "included): a debugging aid that costs a global lock per acquisition in "
          "Debian's Abseil build; the test fixtures turn it on");

namespace gpumem {
namespace {

CommandLine FromFlags() {
  CommandLine c;
  c.config = absl::GetFlag(FLAGS_config);
  c.backend = absl::GetFlag(FLAGS_backend);
  c.sim_devices = absl::GetFlag(FLAGS_sim_devices);
  c.sim_topology = absl::GetFlag(FLAGS_sim_topology);
  c.sim_slab_create_delay = absl::GetFlag(FLAGS_sim_slab_create_delay);
  c.socket = absl::GetFlag(FLAGS_socket);
  c.tenant_socket_dir = absl::GetFlag(FLAGS_tenant_socket_dir);
  c.slab_size = absl::GetFlag(FLAGS_slab_size);
  c.min_slab_size = absl::GetFlag(FLAGS_min_slab_size);
  c.max_alignment = absl::GetFlag(FLAGS_max_alignment);
  c.empty_slab_release_seconds = absl::GetFlag(FLAGS_empty_slab_release_seconds);
  c.reserve_fraction = absl::GetFlag(FLAGS_reserve_fraction);
  c.admin_group = absl::GetFlag(FLAGS_admin_group);
  c.handle_kinds = absl::GetFlag(FLAGS_handle_kinds);
  c.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.ledger = absl::GetFlag(FLAGS_ledger);
  c.state = absl::GetFlag(FLAGS_state);
  c.restore_grace_seconds = absl::GetFlag(FLAGS_restore_grace_seconds);
  c.stream_threads = absl::GetFlag(FLAGS_stream_threads);
  c.stream_backend_threads = absl::GetFlag(FLAGS_stream_backend_threads);
  c.query_threads = absl::GetFlag(FLAGS_query_threads);
  c.reclaim_wait_ms = absl::GetFlag(FLAGS_reclaim_wait_ms);
  c.wait_bypass_limit = absl::GetFlag(FLAGS_wait_bypass_limit);
  c.wait_reserve_ms = absl::GetFlag(FLAGS_wait_reserve_ms);
  c.max_wait_ms = absl::GetFlag(FLAGS_max_wait_ms);
  c.max_waiting_bytes_per_tenant = absl::GetFlag(FLAGS_max_waiting_bytes_per_tenant);
  c.ledger_max_pages = absl::GetFlag(FLAGS_ledger_max_pages);
  c.ledger_retain_events = absl::GetFlag(FLAGS_ledger_retain_events);
  c.max_connections_per_uid = absl::GetFlag(FLAGS_max_connections_per_uid);
  c.max_connections_per_tenant_socket = absl::GetFlag(FLAGS_max_connections_per_tenant_socket);
  c.fd_reserve = absl::GetFlag(FLAGS_fd_reserve);
  c.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  c.max_receive_message_size = absl::GetFlag(FLAGS_max_receive_message_size);
  c.grpc_memory_limit = absl::GetFlag(FLAGS_grpc_memory_limit);
  c.max_reflection_streams_per_uid = absl::GetFlag(FLAGS_max_reflection_streams_per_uid);
  return c;
}

// EX_TEMPFAIL: stopped for a restart (deploy/gpumemd.service restarts on it).
constexpr int kRestartExitStatus = 75;

int Fail(const absl::Status& s) {
  std::cerr << "gpumemd: " << s.message() << std::endl;
  return 1;
}

int Run() {
  const CommandLine flags = FromFlags();
  const std::string path = flags.config.value_or("");
  auto locations = std::make_unique<google::protobuf::TextFormat::ParseInfoTree>();
  absl::StatusOr<v1::DaemonConfig> file = LoadDaemonConfig(path, locations.get());
  if (!file.ok()) return Fail(file.status());
  absl::StatusOr<Settings> settings = ResolveSettings(flags, path, *file);
  if (!settings.ok()) return Fail(settings.status());
  if (absl::GetFlag(FLAGS_check_config)) {
    std::cout << "gpumemd: config ok" << (path.empty() ? "" : ": ") << path << std::endl;
    return 0;
  }

  // Signals are handled by sigwait below; every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // The soft RLIMIT_NOFILE is raised to the hard one by Daemon::Start,
  // which says so.

  Daemon daemon(flags, *std::move(settings), std::move(locations));
  if (absl::Status started = daemon.Start(); !started.ok()) return Fail(started);

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) daemon.Reload().IgnoreError();
  if (sig == SIGUSR2) {
    daemon.StopForRestart();
    return kRestartExitStatus;
  }

  // A second SIGTERM/SIGINT ends the drain at once; SIGHUP stays pending (a
  // reload while stopping means nothing).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  daemon.Drain(absl::StrCat("signal ", sig), [&stop_signals] {
    struct timespec now = {0, 0};
    return sigtimedwait(&stop_signals, nullptr, &now) > 0;
  });
  daemon.Stop();
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(absl::StrCat(
      "gpumemd: lends the memory of every GPU on this machine to client processes.\n"
      "Usage: gpumemd [--config=FILE] [--flag=value ...]; flags win over the config "
      "file, which wins over the defaults:\n  ",
      gpumem::DefaultsText()));
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
