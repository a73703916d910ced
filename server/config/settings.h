// Settings: every setting of the daemon, resolved once: a command-line flag
// wins over the config file, the file over the built-in default.
//
// The defaults live here and only here, in the initializers of Settings'
// members; flag help and the README name them, nothing else decides them.
// ResolveSettings is the one place the three sources meet, both at start
// and on a reload (flags given at start keep winning over a reloaded file),
// so start and reload cannot disagree.
//
// Guarantees: ResolveSettings returns settings only if every value parses
// and is in range; otherwise INVALID_ARGUMENT naming the flag (--name) or
// the file's field and saying why. Each setting remembers where its value
// came from, for the daemon's start and reload lines ("(flag)", "(config)",
// "(default)"). The tenant section is not here: it is the tenant
// directory's (server/tenants/tenant_directory.h), built from the file.
#ifndef GPUMEMD_SERVER_CONFIG_SETTINGS_H_
#define GPUMEMD_SERVER_CONFIG_SETTINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/backend/backend.h"

namespace gpumem {

// What the command line said; nullopt: not given.
struct CommandLine {
  std::optional<std::string> config;
  std::optional<std::string> backend;
  std::optional<std::string> sim_devices;
  std::optional<std::string> sim_topology;
  std::optional<std::string> sim_slab_create_delay;
  std::optional<std::string> socket;
  std::optional<std::string> tenant_socket_dir;
  std::optional<std::string> slab_size;
  std::optional<std::string> min_slab_size;
  std::optional<std::string> max_alignment;
  std::optional<double> empty_slab_release_seconds;
  std::optional<double> reserve_fraction;
  std::optional<std::string> admin_group;
  std::optional<std::string> handle_kinds;
  std::optional<double> drain_seconds;
  std::optional<std::string> metrics_listen;
  std::optional<std::string> ledger;
  std::optional<std::string> state;
  std::optional<double> restore_grace_seconds;
  std::optional<int> stream_threads;
  std::optional<int> stream_backend_threads;
  std::optional<int> query_threads;
  std::optional<int> reclaim_wait_ms;
  std::optional<int> wait_bypass_limit;
  std::optional<int> wait_reserve_ms;
  std::optional<int64_t> max_wait_ms;
  std::optional<std::string> max_waiting_bytes_per_tenant;
  std::optional<int64_t> ledger_max_pages;
  std::optional<int64_t> ledger_retain_events;
  // Connection limits (server/service/connection_limits.h).
  std::optional<int> max_connections_per_uid;
  std::optional<int> max_connections_per_tenant_socket;
  std::optional<int> fd_reserve;
  std::optional<int> max_concurrent_streams;
  std::optional<std::string> max_receive_message_size;
  std::optional<std::string> grpc_memory_limit;
  std::optional<int> max_reflection_streams_per_uid;
};

enum class Source { kDefault, kConfig, kFlag };
// "default", "config", "flag".
const char* SourceName(Source source);

template <typename T>
struct Setting {
  T value;
  Source source = Source::kDefault;
};

struct Settings {
  // The config file ("" for none) and what it said (validated as a whole by
  // LoadDaemonConfig).
  std::string config_path;
  v1::DaemonConfig file;

  // Fixed for the daemon's life (a reload reports a change and keeps them).
  Setting<std::string> backend{"sim"};
  Setting<std::string> sim_devices{"4x16GiB"};
  std::vector<uint64_t> sim_device_sizes;  // parsed sim_devices
  Setting<std::string> sim_topology{""};
  std::vector<PeerLink> sim_links;  // parsed sim_topology
  // sim: slab creation on these devices sleeps first (tests, benchmarks).
  std::vector<std::pair<uint32_t, absl::Duration>> sim_slab_create_delays;
  Setting<std::string> socket{"/run/gpumemd/gpumemd.sock"};
  Setting<std::string> tenant_socket_dir{"/run/gpumemd/tenants"};
  Setting<uint64_t> slab_size{uint64_t{1} << 30};
  // A tenant's first slab on a device (slabs grow with its use up to
  // slab_size: server/pool/slab_pool.h).
  Setting<uint64_t> min_slab_size{uint64_t{2} << 20};
  // The largest alignment an Allocate may ask for.
  Setting<uint64_t> max_alignment{uint64_t{2} << 20};
  Setting<double> reserve_fraction{0.0};
  // Empty: every kind the backend makes, its preferred first.
  Setting<std::vector<HandleKind>> handle_kinds{{}};
  Setting<std::string> ledger{"/var/lib/gpumemd/ledger.db"};  // "none": off
  // What a restart needs (server/state/durable_state.h): "none" keeps
  // nothing; empty (the default) is the socket's path with ".state".
  Setting<std::string> state{""};
  // After a restart, how long clients have to come back (re-present their
  // blocks, give back a slab's handle) before what they held is closed.
  Setting<absl::Duration> restore_grace{absl::Seconds(30)};
  // Tests: the ledger file may grow to this many pages (0: no limit), so
  // that SQLite answers "database or disk is full" (the soak's small disk
  // where it cannot mount one).
  Setting<int64_t> ledger_max_pages{0};
  // Ledger retention: the newest events kept; older ones are folded into
  // per-tenant summaries and deleted by the writer (0: keep every event).
  Setting<int64_t> ledger_retain_events{10'000'000};
  Setting<std::string> metrics_listen{""};                    // "": off
  Setting<double> drain_seconds{0.0};
  Setting<int> queue_threads{1};    // completion queues, one thread each
  Setting<int> backend_threads{2};  // requests that need backend work
  Setting<int> query_threads{1};    // GetStats, the ledger and tenant RPCs
  // Bounded waiters (server/admission/admission.h): the longest wait_ms a
  // request may ask for, and the bytes one tenant's waiters may hold (0: no
  // limit).
  Setting<absl::Duration> max_wait{absl::Seconds(60)};
  Setting<uint64_t> max_waiting_bytes_per_tenant{uint64_t{16} << 20};

  // Reloadable (SIGHUP).
  Setting<absl::Duration> empty_slab_release{absl::Seconds(30)};
  Setting<std::string> admin_group{""};  // "": root only
  // Reclaim before refusing: how long a request is held while other
  // sessions give back idle leases (zero: not held).
  Setting<absl::Duration> reclaim_wait{absl::Milliseconds(300)};
  // Fair waiting (server/admission/admission.h).
  Setting<uint32_t> wait_bypass_limit{8};
  Setting<absl::Duration> wait_reserve{absl::Seconds(2)};
  // Connection limits (server/service/connection_limits.h): per uid over
  // every socket (root and the admin group not counted), per tenant socket,
  // and the fds kept for the daemon's own work.
  Setting<uint32_t> max_connections_per_uid{256};
  Setting<uint32_t> max_connections_per_tenant_socket{1024};
  Setting<uint32_t> fd_reserve{256};
  // Per gRPC connection, fixed for the daemon's life: streams in flight
  // (SETTINGS_MAX_CONCURRENT_STREAMS), the largest request message, and
  // the memory gRPC's buffers may take in all (its ResourceQuota).
  Setting<uint32_t> max_concurrent_streams{100};
  Setting<uint64_t> max_receive_message_size{uint64_t{1} << 20};
  Setting<uint64_t> grpc_memory_limit{uint64_t{256} << 20};
  // Server reflection streams one uid may hold open at once, fixed for the
  // daemon's life (server/service/reflection_service.h).
  Setting<uint32_t> max_reflection_streams_per_uid{4};
};

// `file` as LoadDaemonConfig accepted it, from `path`.
absl::StatusOr<Settings> ResolveSettings(const CommandLine& flags, const std::string& path,
                                         const v1::DaemonConfig& file);

// The defaults, as `gpumemd --help` prints them ("--slab_size=1GiB ...").
std::string DefaultsText();

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_SETTINGS_H_
