// gpumemctl: the command line of gpumemd: stats, alloc, free, session,
// tenants, ledger, quota and top (client/ctl/gpumemctl_top.h); the synopsis is
// kUsage.
//
// An allocation belongs to the process that made it: without --hold it is
// returned as soon as gpumemctl exits. --hold keeps it until Ctrl-C.
// Exit status: 0 ok, 1 the daemon refused or could not be reached (the
// message is printed), 2 usage.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/lib/cpp/client.h"
#include "client/ctl/gpumemctl_top.h"
#include "common/byte_size.h"
#include "common/placement_set.h"

ABSL_FLAG(std::string, socket, "", "daemon socket (default $GPUMEMD_SOCKET or "
          "/run/gpumemd/gpumemd.sock)");
ABSL_FLAG(bool, json, false, "print JSON (proto field names, as grpcurl does)");
ABSL_FLAG(std::string, gpus, "", "alloc: allowed devices: 0,1 | all | GPU-<uuid>");
ABSL_FLAG(std::string, exclude, "", "alloc: devices never to use");
ABSL_FLAG(std::string, policy, "", "alloc: least-loaded | pack | near:DEV");
ABSL_FLAG(uint32_t, shards, 0, "alloc: split SIZE into N shards on N devices");
ABSL_FLAG(bool, hold, false, "alloc: keep the allocation until interrupted");
ABSL_FLAG(bool, slabs, false, "stats: also list every slab");
ABSL_FLAG(std::string, wait, "", "alloc: wait up to this long for memory (5s, 250ms)");
ABSL_FLAG(std::string, tenant, "", "ledger: only this tenant's events");
ABSL_FLAG(std::string, since, "", "ledger: events since TIME: 2026-11-30T12:00:00Z, "
          "or a duration ago (10m, 2h)");
ABSL_FLAG(uint32_t, limit, 100, "ledger: the newest N events");
ABSL_FLAG(std::string, total, "", "quota: total bytes over all devices (none: no limit)");
ABSL_FLAG(int64_t, max_allocations, -1, "quota: live allocations (-1: no limit)");
ABSL_FLAG(std::string, interval, "1s", "top: time between refreshes (100ms .. 1h)");
ABSL_FLAG(int32_t, iterations, 0, "top: stop after N refreshes (0: until q)");
ABSL_FLAG(bool, plain, false, "top: plain text, one view per refresh (also when stdout "
          "is not a terminal)");

namespace gpumem {
namespace client {
namespace {

constexpr char kUsage[] =
    "gpumemctl: talk to gpumemd.\n"
    "  gpumemctl [--socket=PATH] stats [--slabs] [--json]\n"
    "  gpumemctl [--socket=PATH] alloc SIZE [--gpus=LIST] [--exclude=LIST] [--fallback=LIST]...\n"
    "                  [--policy=least-loaded|pack|near:DEV] [--shards=N] [--wait=5s] [--hold] [--json]\n"
    "  gpumemctl [--socket=PATH] free ID\n"
    "  gpumemctl [--socket=PATH] session\n"
    "  gpumemctl [--socket=PATH] tenants [--json]\n"
    "  gpumemctl [--socket=PATH] ledger [--tenant=NAME] [--since=TIME] [--limit=N] [--json]\n"
    "  gpumemctl [--socket=PATH] quota NAME [--total=SIZE] [--device=SEL:SIZE]... "
    "[--max_allocations=N]\n"
    "  gpumemctl [--socket=PATH] top [--interval=1s] [--iterations=N] [--plain]\n"
    "SIZE: 4096, 64KiB, 1.5GiB, 2G. LIST: 0,1 | all | GPU-<uuid>. SEL: 0 | GPU-<uuid>.";

int Fail(const absl::Status& s) {
  std::cerr << "gpumemctl: " << absl::StatusCodeToString(s.code()) << ": "
            << s.message() << "\n";
  return 1;
}

int Usage(const std::string& why) {
  std::cerr << "gpumemctl: " << why << "\n" << kUsage << "\n";
  return 2;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

// "1 event", "2 events".
std::string Count(uint64_t n, const char* noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

// "ledger PATH: ok, N events committed, ...", or FAILING with the error and
// what is held; nothing from a daemon too old to say.
void PrintLedger(const v1::GetStatsResponse& stats) {
  if (!stats.has_ledger()) return;
  const v1::LedgerStatus& l = stats.ledger();
  if (!l.enabled()) {
    std::cout << "ledger: off (--ledger=none): no events are recorded\n";
    return;
  }
  std::string line;
  if (l.failing()) {
    line = absl::StrCat("ledger ", l.path(), ": FAILING: ", l.last_error(), "; ",
                        Count(l.held_events(), "event"), " held in memory and retried, ",
                        l.dropped_events(), " dropped");
  } else {
    line = absl::StrCat("ledger ", l.path(), ": ok, ", Count(l.committed_events(), "event"),
                        " committed, ", l.held_events(), " held, ", l.dropped_events(),
                        " dropped, WAL ", Count(l.wal_pages(), "page"));
  }
  if (l.failed_commits() > 0) {
    absl::StrAppend(&line, ", ", Count(l.failed_commits(), "failed commit"));
  }
  if (l.blocked_checkpoints() > 0) {
    absl::StrAppend(&line, "; ", Count(l.blocked_checkpoints(), "checkpoint"),
                    " blocked by a reader's open transaction");
  }
  std::cout << line << "\n";
}

int Stats(Client& client) {
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats(absl::GetFlag(FLAGS_slabs));
  if (!stats.ok()) return Fail(stats.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json(*stats);
    return 0;
  }
  std::cout << "backend: " << stats->backend() << "\n";
  PrintLedger(*stats);
  std::cout << absl::StrFormat("%-4s %-40s %11s %11s %11s %11s %11s %6s %6s %7s\n",
                               "DEV", "UUID", "TOTAL", "USED", "FREE", "POOLED",
                               "LARGEST", "FRAG", "SLABS", "ALLOCS");
  for (const v1::DeviceStats& d : stats->devices()) {
    std::cout << absl::StrFormat(
        "%-4d %-40s %11s %11s %11s %11s %11s %6.3f %6d %7d\n", d.index(), d.uuid(),
        FormatBytes(d.total_bytes()), FormatBytes(d.used_bytes()),
        FormatBytes(d.free_bytes()), FormatBytes(d.pooled_bytes()),
        FormatBytes(d.largest_free_block_bytes()), d.fragmentation(),
        d.slab_count(), d.allocation_count());
  }
  if (absl::GetFlag(FLAGS_slabs)) {
    std::cout << absl::StrFormat("%-4s %-8s %11s %11s %11s %11s %6s %7s %s\n", "DEV", "SLAB",
                                 "SIZE", "USED", "FREE", "LARGEST", "FRAG", "BLOCKS", "KIND");
    for (const v1::DeviceStats& d : stats->devices()) {
      for (const v1::SlabStats& s : d.slabs()) {
        std::cout << absl::StrFormat(
            "%-4d %-8d %11s %11s %11s %11s %6.3f %7d %s\n", d.index(), s.slab_id(),
            FormatBytes(s.size_bytes()), FormatBytes(s.used_bytes()),
            FormatBytes(s.free_bytes()), FormatBytes(s.largest_free_bytes()),
            s.fragmentation(), s.live_blocks(),
            s.dedicated() ? "dedicated" : s.reserved() ? "reserved" : "shared");
      }
    }
  }
  std::cout << "peers (X self, NV nvlink, PIX direct over PCIe, SYS through the host):\n    ";
  for (const v1::DeviceStats& d : stats->devices()) std::cout << absl::StrFormat("%5d", d.index());
  std::cout << "\n";
  for (const v1::DeviceStats& d : stats->devices()) {
    std::cout << absl::StrFormat("%4d", d.index());
    for (int link : d.peers()) {
      std::cout << absl::StrFormat("%5s", link == v1::PEER_LINK_SELF     ? "X"
                                          : link == v1::PEER_LINK_NVLINK ? "NV"
                                          : link == v1::PEER_LINK_PCIE   ? "PIX"
                                                                         : "SYS");
    }
    std::cout << "\n";
  }
  std::cout << "sessions: " << stats->sessions_size() << "\n";
  if (stats->sessions_size() > 0) {
    std::cout << absl::StrFormat("%-8s %-8s %-6s %-6s %7s %11s\n", "SESSION", "PID",
                                 "UID", "GID", "ALLOCS", "USED");
    for (const v1::SessionStats& s : stats->sessions()) {
      std::cout << absl::StrFormat("%-8d %-8d %-6d %-6d %7d %11s\n", s.session_id(),
                                   s.pid(), s.uid(), s.gid(), s.allocation_count(),
                                   FormatBytes(s.used_bytes()));
    }
  }
  return 0;
}

volatile sig_atomic_t interrupted = 0;

int Alloc(Client& client, const std::string& size_text,
          const std::vector<std::string>& fallbacks) {
  absl::StatusOr<uint64_t> size = ParseByteSize(size_text);
  if (!size.ok()) return Usage(std::string(size.status().message()));
  PlacementFlags flags;
  flags.gpus = absl::GetFlag(FLAGS_gpus);
  flags.exclude = absl::GetFlag(FLAGS_exclude);
  flags.fallback = fallbacks;
  flags.policy = absl::GetFlag(FLAGS_policy);
  absl::StatusOr<v1::PlacementRequest> placement = BuildPlacementRequest(flags);
  if (!placement.ok()) return Usage(std::string(placement.status().message()));
  v1::AllocateRequest req;
  req.set_size_bytes(*size);
  *req.mutable_placement() = *placement;
  req.set_shard_count(absl::GetFlag(FLAGS_shards));
  if (!absl::GetFlag(FLAGS_wait).empty()) {
    absl::Duration wait;
    if (!absl::ParseDuration(absl::GetFlag(FLAGS_wait), &wait) || wait < absl::ZeroDuration() ||
        wait > absl::Hours(24)) {
      return Usage("--wait wants a duration up to 24h, like 5s or 250ms");
    }
    req.set_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
  }
  absl::StatusOr<v1::AllocateResponse> resp = client.AllocateRaw(req);
  if (!resp.ok()) return Fail(resp.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json(*resp);
  } else {
    std::cout << absl::StrFormat("%-8s %-4s %-40s %12s %12s %8s\n", "ID", "DEV",
                                 "UUID", "OFFSET", "SIZE", "SLAB");
    for (const v1::Allocation& a : resp->allocations()) {
      std::cout << absl::StrFormat("%-8d %-4d %-40s %12d %12s %8d\n", a.id(),
                                   a.device_index(), a.device_uuid(), a.offset(),
                                   FormatBytes(a.size_bytes()), a.slab_id());
    }
  }
  if (!absl::GetFlag(FLAGS_hold)) {
    std::cerr << "gpumemctl: freed when gpumemctl exits (use --hold to keep it)\n";
    return 0;
  }
  std::cerr << "gpumemctl: holding; Ctrl-C to release\n";
  struct sigaction sa = {};
  sa.sa_handler = [](int) { interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!interrupted) pause();
  for (const v1::Allocation& a : resp->allocations()) {
    absl::Status s = client.Free(a.id());
    if (!s.ok()) std::cerr << "gpumemctl: free " << a.id() << ": " << s.message() << "\n";
  }
  return 0;
}

std::string FormatQuota(const v1::Quota& q) {
  std::vector<std::string> parts;
  if (q.has_total_bytes()) parts.push_back("total " + FormatBytes(q.total_bytes()));
  for (const v1::DeviceQuota& d : q.devices()) {
    parts.push_back("dev " + d.device() + " " + FormatBytes(d.bytes()));
  }
  if (q.has_max_allocations()) parts.push_back(absl::StrCat("max ", q.max_allocations(), " allocs"));
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

int Tenants(Client& client) {
  absl::StatusOr<v1::GetUsageResponse> usage = client.GetUsage();
  if (!usage.ok()) return Fail(usage.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json(*usage);
    return 0;
  }
  std::cout << absl::StrFormat("%-16s %5s %11s %11s %14s %7s  %s\n", "TENANT", "PRIO", "CURRENT",
                               "PEAK", "BYTE-SECONDS", "ALLOCS", "QUOTA");
  for (const v1::TenantUsage& t : usage->tenants()) {
    std::cout << absl::StrFormat("%-16s %5d %11s %11s %14.4g %7d  %s\n", t.name(), t.priority(),
                                 FormatBytes(t.current_bytes()), FormatBytes(t.peak_bytes()),
                                 t.byte_seconds(), t.allocation_count(), FormatQuota(t.quota()));
    for (const v1::DeviceUsage& d : t.devices()) {
      if (d.peak_bytes() == 0) continue;
      std::cout << absl::StrFormat("  device %-7d %11s %11s %14.4g\n", d.device_index(),
                                   FormatBytes(d.current_bytes()), FormatBytes(d.peak_bytes()),
                                   d.byte_seconds());
    }
  }
  return 0;
}

// "2026-11-30T12:00:00Z" (RFC 3339) or a duration ago ("10m").
absl::StatusOr<int64_t> ParseSince(const std::string& text) {
  absl::Time t;
  std::string error;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return absl::ToUnixNanos(t);
  absl::Duration ago;
  if (absl::ParseDuration(text, &ago) && ago >= absl::ZeroDuration()) {
    return absl::ToUnixNanos(absl::Now() - ago);
  }
  return absl::InvalidArgumentError("--since wants a time like 2026-11-30T12:00:00Z or a "
                                    "duration ago like 10m");
}

int Ledger(Client& client) {
  v1::GetLedgerRequest req;
  req.set_tenant(absl::GetFlag(FLAGS_tenant));
  if (!absl::GetFlag(FLAGS_since).empty()) {
    absl::StatusOr<int64_t> since = ParseSince(absl::GetFlag(FLAGS_since));
    if (!since.ok()) return Usage(std::string(since.status().message()));
    req.set_since_unix_ns(*since);
  }
  req.set_limit(absl::GetFlag(FLAGS_limit));
  req.set_newest(true);
  absl::StatusOr<v1::GetLedgerResponse> resp = client.GetLedger(req);
  if (!resp.ok()) return Fail(resp.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json(*resp);
    return 0;
  }
  for (const v1::LedgerEvent& e : resp->events()) {
    std::string line = absl::StrFormat(
        "%s seq=%d %-14s tenant=%s uid=%d pid=%d session=%d",
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixNanos(e.time_unix_ns()),
                         absl::UTCTimeZone()),
        e.seq(), e.kind(), e.tenant(), e.uid(), e.pid(), e.session());
    if (e.device() >= 0) absl::StrAppend(&line, " device=", e.device());
    if (e.allocation_id() != 0) absl::StrAppend(&line, " id=", e.allocation_id());
    if (e.device() >= 0) absl::StrAppend(&line, " bytes=", e.bytes());
    if (!e.detail().empty()) absl::StrAppend(&line, " (", e.detail(), ")");
    std::cout << line << "\n";
  }
  return 0;
}

int Quota(Client& client, const std::string& tenant, const std::vector<std::string>& devices) {
  v1::SetQuotaRequest req;
  req.set_tenant(tenant);
  if (!absl::GetFlag(FLAGS_total).empty() && absl::GetFlag(FLAGS_total) != "none") {
    absl::StatusOr<uint64_t> total = ParseByteSize(absl::GetFlag(FLAGS_total));
    if (!total.ok()) return Usage("--total: " + std::string(total.status().message()));
    req.mutable_quota()->set_total_bytes(*total);
  }
  if (absl::GetFlag(FLAGS_max_allocations) >= 0) {
    req.mutable_quota()->set_max_allocations(absl::GetFlag(FLAGS_max_allocations));
  }
  for (const std::string& d : devices) {
    std::vector<std::string> parts = absl::StrSplit(d, absl::MaxSplits(':', 1));
    if (parts.size() != 2) return Usage("--device wants SEL:SIZE, like 0:8GiB");
    absl::StatusOr<uint64_t> bytes = ParseByteSize(parts[1]);
    if (!bytes.ok()) return Usage("--device: " + std::string(bytes.status().message()));
    v1::DeviceQuota* dq = req.mutable_quota()->add_devices();
    dq->set_device(parts[0]);
    dq->set_bytes(*bytes);
  }
  absl::StatusOr<v1::SetQuotaResponse> resp = client.SetQuota(req);
  if (!resp.ok()) return Fail(resp.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json(*resp);
  } else {
    std::cout << "quota of " << tenant << ": " << FormatQuota(resp->quota()) << "\n";
  }
  return 0;
}

int Main(int argc, char** argv) {
  // --fallback may be given several times, one set each; absl flags would
  // keep only the last, so take them out first.
  // The same for quota's --device.
  std::vector<std::string> fallbacks, devices;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (absl::StartsWith(a, "--fallback=")) {
      fallbacks.push_back(a.substr(11));
    } else if (a == "--fallback" && i + 1 < argc) {
      fallbacks.push_back(argv[++i]);
    } else if (absl::StartsWith(a, "--device=")) {
      devices.push_back(a.substr(9));
    } else if (a == "--device" && i + 1 < argc) {
      devices.push_back(argv[++i]);
    } else {
      args.push_back(argv[i]);
    }
  }
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() < 2) return Usage("no command");
  const std::string cmd = rest[1];
  auto connect = [&]() { return Client::Connect(absl::GetFlag(FLAGS_socket)); };
  if (cmd == "stats" || cmd == "session") {
    if (rest.size() != 2) return Usage(cmd + " takes no arguments");
    absl::StatusOr<std::unique_ptr<Client>> client = connect();
    if (!client.ok()) return Fail(client.status());
    if (cmd == "stats") return Stats(**client);
    absl::StatusOr<v1::Session> s = (*client)->GetSession();
    if (!s.ok()) return Fail(s.status());
    std::cout << Json(*s);
    return 0;
  }
  if (cmd == "alloc") {
    if (rest.size() != 3) return Usage("alloc needs one SIZE");
    absl::StatusOr<std::unique_ptr<Client>> client = connect();
    if (!client.ok()) return Fail(client.status());
    return Alloc(**client, rest[2], fallbacks);
  }
  if (cmd == "free") {
    uint64_t id = 0;
    if (rest.size() != 3 || !absl::SimpleAtoi(rest[2], &id)) {
      return Usage("free needs one allocation ID (a number)");
    }
    absl::StatusOr<std::unique_ptr<Client>> client = connect();
    if (!client.ok()) return Fail(client.status());
    absl::Status s = (*client)->Free(id);
    if (!s.ok()) return Fail(s);
    std::cout << "freed " << id << "\n";
    return 0;
  }
  if (cmd == "tenants" || cmd == "ledger") {
    if (rest.size() != 2) return Usage(cmd + " takes no arguments");
    absl::StatusOr<std::unique_ptr<Client>> client = connect();
    if (!client.ok()) return Fail(client.status());
    return cmd == "tenants" ? Tenants(**client) : Ledger(**client);
  }
  if (cmd == "quota") {
    if (rest.size() != 3) return Usage("quota needs one tenant NAME");
    absl::StatusOr<std::unique_ptr<Client>> client = connect();
    if (!client.ok()) return Fail(client.status());
    return Quota(**client, rest[2], devices);
  }
  if (cmd == "top") {
    if (rest.size() != 2) return Usage("top takes no arguments");
    TopOptions o;
    o.socket_path = absl::GetFlag(FLAGS_socket);
    if (!absl::ParseDuration(absl::GetFlag(FLAGS_interval), &o.interval)) {
      return Usage("--interval wants a duration like 1s or 500ms");
    }
    o.iterations = absl::GetFlag(FLAGS_iterations);
    if (o.iterations < 0) return Usage("--iterations wants a count >= 0");
    o.plain = absl::GetFlag(FLAGS_plain);
    return RunTop(o);
  }
  return Usage("unknown command \"" + cmd + "\"");
}

}  // namespace
}  // namespace client
}  // namespace gpumem

int main(int argc, char** argv) { return gpumem::client::Main(argc, argv); }
