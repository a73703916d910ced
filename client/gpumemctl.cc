// gpumemctl: the command line of gpumemd.
//
//   gpumemctl [--socket=PATH] stats [--slabs] [--json]
//   gpumemctl [--socket=PATH] alloc SIZE [--gpus=LIST] [--exclude=LIST]
//             [--fallback=LIST]... [--policy=least-loaded|pack|near:DEV]
//             [--shards=N] [--hold] [--json]
//   gpumemctl [--socket=PATH] free ID
//   gpumemctl [--socket=PATH] session
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
#include "client/client.h"
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

namespace gpumem {
namespace {

constexpr char kUsage[] =
    "gpumemctl: talk to gpumemd.\n"
    "  gpumemctl [--socket=PATH] stats [--slabs] [--json]\n"
    "  gpumemctl [--socket=PATH] alloc SIZE [--gpus=LIST] [--exclude=LIST] [--fallback=LIST]...\n"
    "                  [--policy=least-loaded|pack|near:DEV] [--shards=N] [--hold] [--json]\n"
    "  gpumemctl [--socket=PATH] free ID\n"
    "  gpumemctl [--socket=PATH] session\n"
    "SIZE: 4096, 64KiB, 1.5GiB, 2G. LIST: 0,1 | all | GPU-<uuid>.";

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

int Stats(Client& client) {
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats(absl::GetFlag(FLAGS_slabs));
  if (!stats.ok()) return Fail(stats.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Json(*stats);
    return 0;
  }
  std::cout << "backend: " << stats->backend() << "\n";
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
  std::cout << "peers (X self, NV nvlink, SYS through the host):\n    ";
  for (const v1::DeviceStats& d : stats->devices()) std::cout << absl::StrFormat("%5d", d.index());
  std::cout << "\n";
  for (const v1::DeviceStats& d : stats->devices()) {
    std::cout << absl::StrFormat("%4d", d.index());
    for (int link : d.peers()) {
      std::cout << absl::StrFormat("%5s", link == v1::PEER_LINK_SELF     ? "X"
                                          : link == v1::PEER_LINK_NVLINK ? "NV"
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

int Main(int argc, char** argv) {
  // --fallback may be given several times, one set each; absl flags would
  // keep only the last, so take them out first.
  std::vector<std::string> fallbacks;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (absl::StartsWith(a, "--fallback=")) {
      fallbacks.push_back(a.substr(11));
    } else if (a == "--fallback" && i + 1 < argc) {
      fallbacks.push_back(argv[++i]);
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
  return Usage("unknown command \"" + cmd + "\"");
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) { return gpumem::Main(argc, argv); }
