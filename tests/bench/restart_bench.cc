// restart_bench: what a daemon crash costs with many live blocks.
//
// A client holds --blocks blocks; a thread of it keeps calling (Allocate +
// Free of a small block) and times every call. gpumemd runs under a stand-in
// for systemd (tests/restart/fake_systemd.h: notify socket, fd store,
// LISTEN_FDS) and is killed with SIGKILL --restarts times. For each restart
// it prints, side by side with a start of the same daemon with nothing to
// restore (the first start):
//   start to serving   fork of the new daemon to its READY=1 (it restores
//                      every block before it says ready)
//   client pause       the longest any of the thread's calls waited across
//                      the restart (from the kill to its call answered)
//   resume             the client library's reconnect + Resume (from its
//                      channel's hangup to serving again)
// and checks that every block survived (same id, its bytes intact).
//   bazel run -c opt //tests/bench:restart_bench [-- --json] [-- --blocks=10000]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

ABSL_FLAG(int, blocks, 10000, "live blocks held across the restarts");
ABSL_FLAG(uint64_t, block_size, 16384, "bytes per block");
ABSL_FLAG(int, restarts, 20, "kill -9 restarts");
ABSL_FLAG(bool, fd_store, true, "slab handles kept in the (fake) fd store");
ABSL_FLAG(bool, json, false, "print JSON");

namespace gpumem {
namespace {

using client::Buffer;
using client::Client;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

struct Summary {
  double p50 = 0, p99 = 0, max = 0;
};
Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  s.max = v.back();
  return s;
}

int Run() {
  const int blocks = absl::GetFlag(FLAGS_blocks);
  const uint64_t block_size = absl::GetFlag(FLAGS_block_size);
  const std::string dir = testing::MakeTempDir();
  const std::string socket = dir + "/gpumemd.sock";
  const std::vector<std::string> args = {
      testing::RunfilePath("server/gpumemd"), "--socket=" + socket,
      "--ledger=" + dir + "/ledger.db",       "--state=" + dir + "/state",
      "--sim_devices=2x4GiB",                  "--slab_size=64MiB"};
  testing::FakeSystemd systemd(dir, absl::GetFlag(FLAGS_fd_store));
  if (!systemd.Start(args, socket)) {
    fprintf(stderr, "restart_bench: the daemon did not start:\n%s", systemd.Log().c_str());
    return 1;
  }
  const double empty_start_ms = Ms(systemd.last_start());

  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket);
  if (!c.ok()) {
    fprintf(stderr, "restart_bench: %s\n", c.status().ToString().c_str());
    return 1;
  }
  Client& client = **c;
  absl::Mutex mu;
  std::vector<double> resume_ms;
  client.OnRestart([&](const Client::RestartReport& r) {
    absl::MutexLock lock(&mu);
    resume_ms.push_back(Ms(r.took));
    if (!r.lost.empty()) {
      fprintf(stderr, "restart_bench: %zu block(s) lost: %s\n", r.lost.size(),
              r.lost[0].second.ToString().c_str());
    }
  });
  std::vector<Buffer> held;
  held.reserve(blocks);
  for (int i = 0; i < blocks; ++i) {
    absl::StatusOr<Buffer> b = client.Allocate(block_size);
    if (!b.ok()) {
      fprintf(stderr, "restart_bench: allocate %d: %s\n", i, b.status().ToString().c_str());
      return 1;
    }
    const uint64_t id = b->id();
    memcpy(b->data(), &id, sizeof(id));
    held.push_back(*std::move(b));
  }

  // The caller: every call timed; the longest since the last reset.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> longest_ns{0};
  std::atomic<uint64_t> failures{0};
  std::thread caller([&] {
    while (!stop.load()) {
      const absl::Time t = absl::Now();
      absl::StatusOr<Buffer> b = client.Allocate(4096);
      absl::Status freed = b.ok() ? b->Free() : b.status();
      if (!freed.ok()) ++failures;
      const int64_t ns = absl::ToInt64Nanoseconds(absl::Now() - t);
      int64_t cur = longest_ns.load();
      while (ns > cur && !longest_ns.compare_exchange_weak(cur, ns)) {
      }
    }
  });

  std::vector<double> start_ms, pause_ms;
  const int restarts = absl::GetFlag(FLAGS_restarts);
  for (int n = 1; n <= restarts; ++n) {
    absl::SleepFor(absl::Milliseconds(100));
    longest_ns.store(0);
    systemd.Kill(SIGKILL);
    if (systemd.Wait() != -SIGKILL || !systemd.Start(args, socket)) {
      fprintf(stderr, "restart_bench: restart %d failed:\n%s", n, systemd.Log().c_str());
      return 1;
    }
    start_ms.push_back(Ms(systemd.last_start()));
    while (client.restarts() < static_cast<uint64_t>(n)) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(50));  // the caller's next call lands
    pause_ms.push_back(static_cast<double>(longest_ns.load()) / 1e6);
  }
  stop.store(true);
  caller.join();

  int intact = 0;
  for (const Buffer& b : held) {
    uint64_t id = 0;
    memcpy(&id, b.data(), sizeof(id));
    intact += id == b.id() && !client.IsLost(b.id());
  }
  int freed_ok = 0;
  for (Buffer& b : held) freed_ok += b.Free().ok();

  const Summary start = Summarize(start_ms), pause = Summarize(pause_ms);
  Summary resume;
  {
    absl::MutexLock lock(&mu);
    resume = Summarize(resume_ms);
  }
  if (absl::GetFlag(FLAGS_json)) {
    printf("{\"blocks\": %d, \"restarts\": %d, \"fd_store\": %s, \"empty_start_ms\": %.1f, "
           "\"start_to_serving_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
           "\"client_pause_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
           "\"resume_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
           "\"blocks_intact\": %d, \"frees_ok\": %d, \"failed_calls\": %lu}\n",
           blocks, restarts, absl::GetFlag(FLAGS_fd_store) ? "true" : "false", empty_start_ms,
           start.p50, start.p99, start.max, pause.p50, pause.p99, pause.max, resume.p50,
           resume.p99, resume.max, intact, freed_ok,
           static_cast<unsigned long>(failures.load()));
  } else {
    printf("%d live blocks of %lu bytes, %d kill -9 restarts, fd store %s\n", blocks,
           static_cast<unsigned long>(block_size), restarts,
           absl::GetFlag(FLAGS_fd_store) ? "on" : "off");
    printf("%-34s %9s %9s %9s\n", "", "p50 ms", "p99 ms", "max ms");
    printf("%-34s %9.1f\n", "start, nothing to restore", empty_start_ms);
    printf("%-34s %9.1f %9.1f %9.1f\n", "start to serving, restoring all", start.p50, start.p99,
           start.max);
    printf("%-34s %9.1f %9.1f %9.1f\n", "client pause (longest call)", pause.p50, pause.p99,
           pause.max);
    printf("%-34s %9.1f %9.1f %9.1f\n", "client reconnect + Resume", resume.p50, resume.p99,
           resume.max);
    printf("blocks intact %d/%d, frees ok %d/%d, calls failed %lu\n", intact, blocks, freed_ok,
           blocks, static_cast<unsigned long>(failures.load()));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return intact == blocks && freed_ok == blocks && failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
