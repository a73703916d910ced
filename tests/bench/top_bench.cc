// top_bench: what one `gpumemctl top` refresh costs against a big daemon:
// --devices sim devices (default 64) holding --blocks live blocks (default
// 100,000) of --sessions processes, each refresh being exactly what top
// does: one GetStats over the daemon's socket (the daemon builds the
// answer, gRPC carries it) and TopView rendering it for a 200x60 screen.
//
// Prints p50 / p99 / max wall time of the whole refresh and of its two
// parts, over --refreshes refreshes, and the answer's size. The target
// is a refresh under 50 ms at 64 devices and 100,000 blocks.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "client/ctl/gpumemctl_top.h"
#include "client/ctl/top_view.h"
#include "tests/integration/daemon_fixture.h"

ABSL_FLAG(int, devices, 64, "sim devices");
ABSL_FLAG(int, blocks, 100000, "live blocks, spread over the sessions");
ABSL_FLAG(int, sessions, 8, "client processes holding the blocks");
ABSL_FLAG(int, refreshes, 200, "refreshes timed");
ABSL_FLAG(bool, json, false, "print JSON");

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Series {
  std::vector<double> ms;
  double At(double q) {
    std::sort(ms.begin(), ms.end());
    return ms[std::min<size_t>(ms.size() - 1, static_cast<size_t>(q * ms.size()))];
  }
  double Max() { return *std::max_element(ms.begin(), ms.end()); }
};

// A child that allocates `n` blocks (raw RPCs over the stream, not mapped:
// the daemon's table is what counts), says so on `ready`, then holds them.
void Holder(const std::string& socket, int n, int ready) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto client = gpumem::client::Client::Connect(socket);
  if (!client.ok()) _exit(2);
  gpumem::v1::AllocateRequest req;
  req.set_size_bytes(4096);
  for (int i = 0; i < n; ++i) {
    if (!(*client)->AllocateRaw(req).ok()) _exit(3);
  }
  char c = 'r';
  if (write(ready, &c, 1) != 1) _exit(4);
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int devices = absl::GetFlag(FLAGS_devices);
  const int blocks = absl::GetFlag(FLAGS_blocks);
  const int sessions = std::max(1, absl::GetFlag(FLAGS_sessions));
  gpumem::testing::DaemonProcess daemon(
      {absl::StrFormat("--sim_devices=%dx16GiB", devices), "--slab_size=64MiB",
       "--mutex_deadlock_detection=false"});
  if (!daemon.Start()) {
    std::fprintf(stderr, "top_bench: the daemon did not start:\n%s\n", daemon.Log().c_str());
    return 1;
  }
  // Holders are forked before this process uses gRPC.
  int ready[2];
  if (pipe(ready) != 0) return 1;
  std::vector<pid_t> holders;
  for (int s = 0; s < sessions; ++s) {
    const int n = blocks / sessions + (s < blocks % sessions ? 1 : 0);
    const pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      Holder(daemon.socket(), n, ready[1]);
    }
    holders.push_back(pid);
  }
  close(ready[1]);
  const absl::Time fill_start = absl::Now();
  for (int s = 0; s < sessions; ++s) {
    char c;
    if (read(ready[0], &c, 1) != 1) {
      std::fprintf(stderr, "top_bench: a holder failed\n%s\n", daemon.Log().c_str());
      return 1;
    }
  }
  const double fill_s = absl::ToDoubleSeconds(absl::Now() - fill_start);

  gpumem::client::StatsSource source =
      gpumem::client::DaemonStatsSource(daemon.socket(), absl::Seconds(10));
  gpumem::client::TopView view(daemon.socket(), absl::Seconds(1));
  Series total, rpc, render;
  size_t answer_bytes = 0;
  uint64_t live = 0;
  size_t lines = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_refreshes) + 1; ++i) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<gpumem::v1::GetStatsResponse> stats = source();
    const Clock::time_point t1 = Clock::now();
    if (!stats.ok()) {
      std::fprintf(stderr, "top_bench: GetStats: %s\n", stats.status().ToString().c_str());
      return 1;
    }
    answer_bytes = stats->ByteSizeLong();
    live = 0;
    for (const auto& d : stats->devices()) live += d.allocation_count();
    view.Update(*std::move(stats), absl::Now());
    lines = view.Render(200, 60).size();
    const Clock::time_point t2 = Clock::now();
    if (i == 0) continue;  // the first one connects
    total.ms.push_back(Ms(t2 - t0));
    rpc.ms.push_back(Ms(t1 - t0));
    render.ms.push_back(Ms(t2 - t1));
  }
  if (live != static_cast<uint64_t>(blocks)) {
    std::fprintf(stderr, "top_bench: GetStats shows %llu live blocks, want %d\n",
                 static_cast<unsigned long long>(live), blocks);
    return 1;
  }
  for (pid_t p : holders) kill(p, SIGKILL);
  for (pid_t p : holders) waitpid(p, nullptr, 0);
  daemon.Stop();

  struct Row {
    const char* what;
    Series* s;
  } rows[] = {{"refresh (GetStats + render)", &total},
              {"GetStats (daemon + transport)", &rpc},
              {"render 200x60", &render}};
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"devices\":%d,\"blocks\":%d,\"sessions\":%d,\"answer_bytes\":%zu,"
                "\"rows\":[",
                devices, blocks, sessions, answer_bytes);
    for (size_t i = 0; i < 3; ++i) {
      std::printf("%s{\"op\":\"%s\",\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f}",
                  i ? "," : "", rows[i].what, rows[i].s->At(0.5), rows[i].s->At(0.99),
                  rows[i].s->Max());
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("gpumemctl top refresh: %d devices, %d live blocks in %d sessions "
              "(filled in %.1f s), answer %zu bytes, %zu screen lines, %zu refreshes\n",
              devices, blocks, sessions, fill_s, answer_bytes, lines, total.ms.size());
  std::printf("%-32s %9s %9s %9s\n", "op", "p50 ms", "p99 ms", "max ms");
  for (Row& r : rows) {
    std::printf("%-32s %9.3f %9.3f %9.3f\n", r.what, r.s->At(0.5), r.s->At(0.99), r.s->Max());
  }
  std::printf("target: refresh under 50 ms: p99 %s, max %s\n",
              total.At(0.99) < 50 ? "met" : "NOT met", total.Max() < 50 ? "met" : "NOT met");
  return 0;
}
