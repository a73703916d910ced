// rpc_bench: what an allocation costs over the daemon's socket, against the
// floor of an almost empty RPC on the same channel, measured side by side.
//
// Starts its own gpumemd (sim backend) on a private socket, connects one
// client, and times in rounds (interleaved, so noise hits all alike):
//   GetSession            the floor: identity lookup, no pool work
//   Allocate + Free       one block of --size on device 0, two RPCs
//   Allocate+map+Free     the client library's Buffer path (first use of a
//                         slab fetches its fd; later blocks reuse the mapping)
// Prints median, p99 and p999 microseconds per operation, the daemon
// process's CPU per operation (user + system over the operation's timed
// stretches, from the kernel's per-thread run time) and the ratio to the floor; --json prints the same as JSON. The daemon keeps its ledger (a file
// in its private directory); with --ledger_compare a second daemon with
// --ledger=none runs beside it and one more row times Allocate + Free there,
// in the same rounds, so the ledger's cost is a ratio of two rows of one run
// (p50, p999 and CPU per pair).
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/lib/cpp/client.h"
#include "tests/integration/daemon_fixture.h"

ABSL_FLAG(int, rounds, 20, "rounds; each times --per_round operations of each kind");
ABSL_FLAG(int, per_round, 200, "operations per kind per round");
ABSL_FLAG(uint64_t, size, 1 << 20, "bytes per allocation");
ABSL_FLAG(bool, json, false, "print JSON");
ABSL_FLAG(bool, ledger_compare, false,
          "also time Allocate+Free on a second daemon with --ledger=none");

namespace gpumem {
using client::Client;
using client::Buffer;
namespace {

using Clock = std::chrono::steady_clock;

struct Series {
  std::string name;
  std::vector<double> us;  // one sample per operation
  double server_cpu_s = 0;  // the serving daemon's CPU over the timed stretches
};

// What one line of output says about a series.
struct Row {
  std::string name;
  double p50_us, p99_us, p999_us, cpu_us;
};

using testing::ProcessCpuSeconds;

// The q-quantile of samples sorted ascending (the nearest rank below).
double Quantile(const std::vector<double>& sorted, double q) {
  return sorted[static_cast<size_t>(q * (sorted.size() - 1))];
}

// Sorts the series' samples (once) and reads its quantiles off them.
Row Summarize(Series& s) {
  std::sort(s.us.begin(), s.us.end());
  return {s.name, Quantile(s.us, 0.5), Quantile(s.us, 0.99), Quantile(s.us, 0.999),
          s.us.empty() ? 0 : s.server_cpu_s * 1e6 / s.us.size()};
}

// Times n operations against the daemon `server` (its CPU is charged to
// the series).
template <typename F>
bool Time(Series& s, pid_t server, int n, F op) {
  const double cpu0 = ProcessCpuSeconds(server);
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    if (!op()) return false;
    s.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  s.server_cpu_s += ProcessCpuSeconds(server) - cpu0;
  return true;
}

int Run() {
  testing::DaemonProcess daemon({"--sim_devices=2x4GiB", "--slab_size=256MiB",
                                 "--mutex_deadlock_detection=false"});
  if (!daemon.Start()) {
    fprintf(stderr, "rpc_bench: daemon did not start:\n%s", daemon.Log().c_str());
    return 1;
  }
  auto client = Client::Connect(daemon.socket());
  if (!client.ok()) return 1;
  Client& c = **client;
  const bool compare = absl::GetFlag(FLAGS_ledger_compare);
  testing::DaemonProcess plain(
      {"--sim_devices=2x4GiB", "--slab_size=256MiB", "--ledger=none",
       "--mutex_deadlock_detection=false"});
  std::unique_ptr<Client> plain_client;
  if (compare) {
    if (!plain.Start()) {
      fprintf(stderr, "rpc_bench: daemon without ledger did not start:\n%s", plain.Log().c_str());
      return 1;
    }
    auto pc = Client::Connect(plain.socket());
    if (!pc.ok()) return 1;
    plain_client = std::move(*pc);
  }
  v1::AllocateRequest req;
  req.set_size_bytes(absl::GetFlag(FLAGS_size));
  req.mutable_placement()->add_devices("0");
  v1::PlacementRequest on0;
  on0.add_devices("0");

  Series floor{"GetSession"}, pair{"Allocate+Free"}, buffer{"Allocate+map+Free (Buffer)"},
      unledgered{"Allocate+Free (ledger off)"};
  const int n = absl::GetFlag(FLAGS_per_round);
  // Warm up the channel and the pool's first slab.
  for (int i = 0; i < 200; ++i) (void)c.GetSession();
  { auto b = c.Allocate(absl::GetFlag(FLAGS_size), on0); }
  if (compare) {
    for (int i = 0; i < 200; ++i) (void)plain_client->GetSession();
    auto a = plain_client->AllocateRaw(req);
    if (a.ok()) (void)plain_client->Free(a->allocations(0).id());
  }
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    bool ok = Time(floor, daemon.pid(), n, [&] { return c.GetSession().ok(); }) &&
              Time(pair, daemon.pid(), n, [&] {
                auto a = c.AllocateRaw(req);
                return a.ok() && c.Free(a->allocations(0).id()).ok();
              }) &&
              Time(buffer, daemon.pid(), n, [&] {
                auto b = c.Allocate(absl::GetFlag(FLAGS_size), on0);
                return b.ok() && b->Free().ok();
              }) &&
              (!compare || Time(unledgered, plain.pid(), n, [&] {
                 auto a = plain_client->AllocateRaw(req);
                 return a.ok() && plain_client->Free(a->allocations(0).id()).ok();
               }));
    if (!ok) {
      fprintf(stderr, "rpc_bench: an RPC failed\n");
      return 1;
    }
  }
  client->reset();
  plain_client.reset();
  const int stopped = daemon.Stop() | (compare ? plain.Stop() : 0);
  std::vector<Row> rows;
  for (Series* s : {&floor, &pair, &buffer}) rows.push_back(Summarize(*s));
  if (compare) rows.push_back(Summarize(unledgered));
  const double base = rows[0].p50_us;
  if (absl::GetFlag(FLAGS_json)) {
    printf("{\"size_bytes\": %lu, \"samples_per_kind\": %zu, \"rows\": [\n",
           static_cast<unsigned long>(absl::GetFlag(FLAGS_size)), floor.us.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      printf("  {\"op\": \"%s\", \"p50_us\": %.2f, \"p99_us\": %.2f, \"p999_us\": %.2f, "
             "\"daemon_cpu_us\": %.2f, \"ops_per_s\": %.0f, \"ratio_to_floor\": %.2f}%s\n",
             r.name.c_str(), r.p50_us, r.p99_us, r.p999_us, r.cpu_us, 1e6 / r.p50_us,
             r.p50_us / base, i + 1 < rows.size() ? "," : "");
    }
    if (compare) {
      printf("], \"ledger_on_over_off_p50\": %.3f, \"ledger_on_over_off_p999\": %.3f, "
             "\"ledger_on_over_off_cpu\": %.3f}\n",
             rows[1].p50_us / rows[3].p50_us, rows[1].p999_us / rows[3].p999_us,
             rows[3].cpu_us > 0 ? rows[1].cpu_us / rows[3].cpu_us : 0.0);
    } else {
      printf("]}\n");
    }
  } else {
    printf("%-28s %9s %9s %9s %8s %10s %8s\n", "operation (1 client)", "p50 us", "p99 us",
           "p999 us", "cpu us", "ops/s", "x floor");
    for (const Row& r : rows) {
      printf("%-28s %9.1f %9.1f %9.1f %8.1f %10.0f %8.2f\n", r.name.c_str(), r.p50_us,
             r.p99_us, r.p999_us, r.cpu_us, 1e6 / r.p50_us, r.p50_us / base);
    }
    if (compare) {
      printf("ledger on / off, Allocate+Free: p50 %.3f, p999 %.3f, daemon cpu %.3f\n",
             rows[1].p50_us / rows[3].p50_us, rows[1].p999_us / rows[3].p999_us,
             rows[3].cpu_us > 0 ? rows[1].cpu_us / rows[3].cpu_us : 0.0);
    }
    printf("(%zu samples per row, %s blocks, interleaved in %d rounds)\n", floor.us.size(),
           absl::StrFormat("%lu B", absl::GetFlag(FLAGS_size)).c_str(),
           absl::GetFlag(FLAGS_rounds));
  }
  return stopped == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
