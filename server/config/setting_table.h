// The daemon's settings, one row each: the only place a setting's flag, its
// config field, default, rule, reloadability, help text and how --help
// shows its default are written. Everything else is made from it: the
// flags (server/main.cc), CommandLine and Settings' members, resolving and
// checking (settings.cc), --help's defaults line, which settings a reload
// applies and which wait for a restart, and the README check
// (tests/service_ops/settings_table_test.cc).
//
// GPUMEMD_SETTINGS(X) calls X(FLAG, MEMBER, KIND, FIELD, DEFAULT, RULE, WHEN,
// SHOWN, HELP) once per row, in the order settings resolve (a Finish may
// read rows above it) and --help lists defaults. Columns: setting_row.h.
// MEMBER is the Settings member; DEFAULT a value of KIND's Value (a
// defaults:: constant where an option struct shares it). A new setting is a
// row here, its DaemonConfig field, its README row, and the code that uses
// it.
#ifndef GPUMEMD_SERVER_CONFIG_SETTING_TABLE_H_
#define GPUMEMD_SERVER_CONFIG_SETTING_TABLE_H_

#include "server/config/setting_row.h"
#include "server/defaults/defaults.h"

// clang-format off
#define GPUMEMD_SETTINGS(X)                                                                      \
  /* Devices and sockets. */                                                                     \
  X(backend, backend, Text, "backend", "sim", Checked(KnownBackend), kStart, ShowValue(),        \
    "device backend: sim or cuda")                                                               \
  X(sim_devices, sim_devices, Text, "sim_devices", "4x16GiB", Checked(SimDeviceSizes), kStart,   \
    ShowValue(), "simulated devices, e.g. 4x16GiB or 80GiB,80GiB,40GiB")                         \
  X(sim_topology, sim_topology, Text, "sim_topology", "", Checked(SimLinks), kStart, Hidden(),   \
    "simulated NVLink groups, e.g. nvlink:0-1,2-3 (default: all through the host)")              \
  X(sim_slab_create_delay, sim_slab_create_delay, Text, nullptr, "",                             \
    Checked(SimSlabCreateDelays), kStart, Hidden(),                                              \
    "sim backend: slab creation on these devices sleeps first, as a slow "                       \
    "driver's would, e.g. 0:300ms,2:50ms (for tests and benchmarks)")                            \
  X(device_headroom, device_headroom, Text, "device_headroom", "auto", Checked(DeviceHeadroom),   \
    kStart, ShowValue(),                                                                         \
    "cuda: memory of each device kept free for other processes' CUDA contexts and "              \
    "libraries: auto (one context, as measured at start, and 1/64 of the device, "               \
    "at least 64MiB), 0, or a size such as 2GiB")                                                \
  X(socket, socket, Text, "socket", "/run/gpumemd/gpumemd.sock", NoBounds(), kStart,             \
    ShowValue(), "Unix socket path")                                                             \
  X(tenant_socket_dir, tenant_socket_dir, Text, "tenant_socket_dir", "/run/gpumemd/tenants",     \
    Checked(TenantSocketDir), kStart, ShowValue(), "where socket tenants' sockets are made")     \
  /* The pool (server/pool/slab_pool.h) and the largest alignment. */                           \
  X(slab_size, slab_size, Bytes, "pool.slab_size", defaults::kSlabSize, Positive(), kStart,      \
    ShowValue(), "size of pool slabs")                                                           \
  X(min_slab_size, min_slab_size, Bytes, "pool.min_slab_size", defaults::kMinSlabSize,           \
    Positive(), kStart, ShowValue(),                                                             \
    "a tenant's first slab on a device; slabs grow with its use up to --slab_size")              \
  X(max_alignment, max_alignment, Bytes, "pool.max_alignment", defaults::kMaxAlignment,          \
    Positive().Then(PowerOfTwo), kStart, ShowValue(),                                            \
    "the largest alignment an Allocate may ask for")                                             \
  X(empty_slab_release_seconds, empty_slab_release, Seconds, "pool.empty_slab_release_seconds",  \
    defaults::kEmptySlabRelease, AtLeast(0), kReload, ShowValue(),                               \
    "seconds an empty slab is kept before it goes back")                                         \
  X(reserve_fraction, reserve_fraction, Number, nullptr, defaults::kReserveFraction, In(0, 1),   \
    kStart, ShowValue(), "fraction of each device taken as slabs at start and kept")             \
  X(drain_seconds, drain_seconds, Number, nullptr, 0.0, AtLeast(0), kStart, ShowValue(),         \
    "on SIGTERM, wait up to this long for live allocations to be freed "                         \
    "(new allocations are refused meanwhile) before releasing everything")                      \
  /* The ledger and restarts. */                                                                 \
  X(ledger, ledger, Text, "ledger", "/var/lib/gpumemd/ledger.db", NoBounds(), kStart,            \
    ShowValue(), "the ledger file (SQLite; directory created), or none to keep no ledger")       \
  X(ledger_retain_events, ledger_retain_events, BigCount, "ledger_retain_events", 10'000'000,    \
    Checked(RetainedEvents), kStart, ShowValue(),                                                \
    "ledger retention: the newest events kept (default 10000000); older ones are "               \
    "folded into per-tenant summaries (the ledger's retained table) and deleted; "               \
    "0: keep every event")                                                                       \
  X(state, state, Text, "state", "", Checked(StatePath), kStart,                                 \
    ShowText("<the socket's path>.state"),                                                       \
    "where what a restart needs is kept (a file, on tmpfs), or none to keep "                    \
    "nothing (a restart then closes every allocation)")                                          \
  X(restore_grace_seconds, restore_grace, Seconds, "restore_grace_seconds",                      \
    defaults::kRestoreGrace, In(0, 86400), kStart, ShowValue(),                                  \
    "after a restart, how long clients have to come back before what they "                      \
    "held is closed")                                                                            \
  /* Threads. */                                                                                 \
  X(stream_threads, queue_threads, Threads, nullptr, 1, In(1, 64), kStart, ShowValue(),          \
    "completion queues (one thread each) serving every gRPC call")                               \
  X(stream_backend_threads, backend_threads, Threads, nullptr, 2, In(1, 64), kStart,             \
    ShowValue(),                                                                                 \
    "threads that run the requests needing backend work (a new slab), so a "                     \
    "slow device holds up no other call")                                                        \
  X(query_threads, query_threads, Threads, nullptr, 1, In(1, 64), kStart, ShowValue(),           \
    "threads that answer GetStats and the ledger and tenant RPCs")                               \
  /* Request rings (server/service/ring_transport.h). */                                         \
  X(request_rings, request_rings, Bool, nullptr, true, NoBounds(), kStart, ShowValue(),          \
    "lend sessions a shared-memory request ring for Allocate and Free when "                     \
    "they ask (over the slab channel); false refuses every ring")                                \
  X(ring_workers, ring_workers, Threads, nullptr, 2, In(1, 64), kStart, ShowValue(),             \
    "threads that serve every session's request ring")                                           \
  /* Waiting (server/admission/admission.h). */                                                  \
  X(reclaim_wait_ms, reclaim_wait, Milliseconds, "reclaim_wait_ms", defaults::kReclaimWait,      \
    UpTo(0, 10000, " milliseconds"), kReload, ShowValue(),                                       \
    "hold an Allocate refused for room that other sessions' idle leases "                        \
    "could cover at most this long while they give them back (0: off)")                          \
  X(wait_bypass_limit, wait_bypass_limit, Count, "wait_bypass_limit", defaults::kWaitBypassLimit,\
    UpTo(1, 1000000, ""), kReload, ShowValue(),                                                  \
    "fair waiting: a waiting request bypassed this many times reserves "                         \
    "the room that frees up on its devices")                                                     \
  X(wait_reserve_ms, wait_reserve, Milliseconds, "wait_reserve_ms", defaults::kWaitReserve,      \
    UpTo(1, 600000, " milliseconds"), kReload, ShowValue(),                                      \
    "fair waiting: how long one such reservation lasts at most")                                 \
  X(max_wait_ms, max_wait, LongMilliseconds, "max_wait_ms", absl::Seconds(60),                   \
    UpTo(1, 86400000, ""), kStart, ShowValue(),                                                  \
    "the longest wait_ms an Allocate may ask for; more is refused "                              \
    "INVALID_ARGUMENT")                                                                          \
  X(max_waiting_bytes_per_tenant, max_waiting_bytes_per_tenant, Bytes,                           \
    "max_waiting_bytes_per_tenant", uint64_t{16} << 20, NoBounds(), kStart, ShowValue(),         \
    "the bytes one tenant's waiting requests may hold in the daemon at once, "                   \
    "e.g. 16MiB (0: no limit); one more waiter is refused RESOURCE_EXHAUSTED")                   \
  /* Connections (server/service/connection_limits.h) and gRPC. */                               \
  X(max_connections_per_uid, max_connections_per_uid, Count, "max_connections_per_uid",          \
    defaults::kMaxConnectionsPerUid, In(1, 1000000), kReload, ShowValue(),                       \
    "connections one uid may hold at once over every socket; one more is "                       \
    "closed at accept (root and the admin group are not counted)")                               \
  X(max_connections_per_tenant_socket, max_connections_per_tenant_socket, Count,                 \
    "max_connections_per_tenant_socket", defaults::kMaxConnectionsPerTenantSocket,               \
    In(1, 1000000), kReload, ShowValue(), "connections one tenant socket may hold at once")      \
  X(fd_reserve, fd_reserve, Count, "fd_reserve", defaults::kFdReserve, In(16, 1000000), kReload, \
    ShowValue(),                                                                                 \
    "file descriptors kept for the daemon's own work: client connections "                       \
    "are refused at accept when fewer are free (root and the admin group "                       \
    "may use the upper half)")                                                                   \
  X(max_concurrent_streams, max_concurrent_streams, Count, "max_concurrent_streams", 100,        \
    In(1, 100000), kStart, ShowValue(),                                                          \
    "gRPC calls in flight at once per connection (SETTINGS_MAX_CONCURRENT_STREAMS)")             \
  X(max_receive_message_size, max_receive_message_size, Bytes, "max_receive_message_size",       \
    uint64_t{1} << 20, In(int64_t{4} << 10, int64_t{1} << 30), kStart, ShowValue(),              \
    "the largest request message gRPC takes, e.g. 1MiB; a larger one is "                        \
    "refused RESOURCE_EXHAUSTED")                                                                \
  X(grpc_memory_limit, grpc_memory_limit, Bytes, "grpc_memory_limit", uint64_t{256} << 20,       \
    In(int64_t{16} << 20, int64_t{1} << 40), kStart, ShowValue(),                                \
    "the memory gRPC's buffers may take in all (its ResourceQuota), e.g. 256MiB")                \
  X(max_reflection_streams_per_uid, max_reflection_streams_per_uid, Count,                       \
    "max_reflection_streams_per_uid", defaults::kMaxReflectionStreamsPerUid, In(1, 1000),        \
    kStart, ShowValue(),                                                                         \
    "server reflection streams (grpcurl, buf curl) one uid may hold open "                       \
    "at once; one more is refused RESOURCE_EXHAUSTED, an idle one closed "                       \
    "after 10 s")                                                                                \
  /* Tests; then the settings whose unset default --help names in words. */                      \
  X(ledger_max_pages, ledger_max_pages, BigCount, nullptr, 0, AtLeast(0), kStart, Hidden(),      \
    "tests: the ledger file may grow to this many pages (SQLite then answers "                   \
    "\"database or disk is full\"); 0: no limit")                                                \
  X(admin_group, admin_group, Text, "admin_group", "", NoBounds(), kReload, Aside("root only"),  \
    "Unix group whose members (besides root) see every session and "                             \
    "tenant and may change quotas and tenants")                                                  \
  X(handle_kinds, handle_kinds, HandleKinds, "handle_kinds", {}, NoBounds(), kStart,             \
    Aside("every kind the backend makes"),                                                       \
    "slab handle kinds offered to clients, the first the default: memfd (sim), "                 \
    "cuda_vmm_fd, cuda_ipc (cuda)")                                                              \
  X(metrics_listen, metrics_listen, Text, nullptr, "", NoBounds(), kStart, Aside("off"),         \
    "serve Prometheus metrics over HTTP on HOST:PORT, e.g. 127.0.0.1:9464")
// clang-format on

namespace gpumem {

// The config fields the tenant directory reads itself (server/tenants/),
// all reloadable. They have no flag, so they are no rows; named here for
// the README check.
inline constexpr const char* kTenantSectionFields[] = {
    "tenant", "default_tenant", "max_waiting_requests", "max_sessions_per_tenant"};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_SETTING_TABLE_H_
