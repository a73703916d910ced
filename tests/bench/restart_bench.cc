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
// and checks that every block survived (same id, its bytes intact). Then,
// with the restored daemon serving, it times Resume itself (the RPC, from
// this process, whose session holds the blocks) and prints its cost per
// claim: re-presenting every live block, and re-presenting --few_claims of
// them while all stay live (what a small client pays beside a big one).
//
// --sizes=1000,10000,100000 runs the whole measurement once per size (a
// fresh daemon each); --baseline_daemon=PATH runs each size against that
// gpumemd too (an earlier build), alternating, and prints this build's
// figures over the baseline's, so a change is measured side by side in one
// run.
//   bazel run -c opt //tests/bench:restart_bench [-- --json] [-- --blocks=10000]
//   bazel run -c opt //tests/bench:restart_bench -- --sizes=1000,10000,100000
//       [-- --baseline_daemon=/path/to/earlier/gpumemd]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

ABSL_FLAG(int, blocks, 10000, "live blocks held across the restarts");
ABSL_FLAG(std::string, sizes, "",
          "comma-separated live block counts, one whole run each (overrides --blocks)");
ABSL_FLAG(uint64_t, block_size, 16384, "bytes per block");
ABSL_FLAG(int, restarts, 20, "kill -9 restarts");
ABSL_FLAG(bool, fd_store, true, "slab handles kept in the (fake) fd store");
ABSL_FLAG(int, few_claims, 100, "claims of the small Resume timed among all the live blocks");
ABSL_FLAG(int, resume_calls, 20, "Resume calls timed of each kind");
ABSL_FLAG(std::string, daemon, "", "the gpumemd to measure (default: this build's)");
ABSL_FLAG(std::string, baseline_daemon, "",
          "another gpumemd binary to measure beside this one (rows \"baseline\")");
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

// The fake systemd, its notify socket read all along as systemd reads it:
// unread, a daemon's notifications (each slab's handle for the fd store is
// a datagram) fill the socket's queue (net.unix.max_dgram_qlen, often 10)
// and the daemon blocks sending the next, in the middle of an Allocate.
class PumpedSystemd {
 public:
  PumpedSystemd(std::string dir, bool fd_store)
      : systemd_(std::move(dir), fd_store), pump_([this] { Loop(); }) {}
  ~PumpedSystemd() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    pump_.join();
  }
  bool Start(const std::vector<std::string>& argv, const std::string& socket) {
    absl::MutexLock lock(&mu_);
    return systemd_.Start(argv, socket);
  }
  absl::Duration last_start() {
    absl::MutexLock lock(&mu_);
    return systemd_.last_start();
  }
  void Kill(int sig) {
    absl::MutexLock lock(&mu_);
    systemd_.Kill(sig);
  }
  int Wait() {
    absl::MutexLock lock(&mu_);
    return systemd_.Wait();
  }
  std::string Log() {
    absl::MutexLock lock(&mu_);
    return systemd_.Log();
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      systemd_.Pump();
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(2));
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  testing::FakeSystemd systemd_ ABSL_GUARDED_BY(mu_);
  std::thread pump_;
};

// One run: one daemon, one size.
struct Figures {
  std::string daemon;  // "daemon" or "baseline"
  int blocks = 0;
  double empty_start_ms = 0;
  Summary start, pause, resume;
  // Resume's cost per claim, µs (p50 and p99 over --resume_calls calls).
  Summary claim_all_us, claim_few_us;
  int few = 0;
  int intact = 0, freed_ok = 0;
  uint64_t failures = 0;
  bool ok() const { return intact == blocks && freed_ok == blocks && failures == 0; }
};

// Times --resume_calls Resume re-presentations of `claims` (all this
// session's and live), each sent as the client library sends it, in pages
// of kResumePage claims (a Resume request is at most 256 KiB): µs per claim
// of each. Empty when one was refused or lost a claim (said on stderr).
constexpr size_t kResumePage = 1000;
std::vector<double> TimeResume(v1::GpuMemory::Stub& stub,
                               const std::vector<v1::Allocation>& claims) {
  std::vector<v1::ResumeRequest> pages;
  for (size_t i = 0; i < claims.size(); i += kResumePage) {
    v1::ResumeRequest& page = pages.emplace_back();
    for (size_t j = i; j < std::min(claims.size(), i + kResumePage); ++j) {
      *page.add_allocations() = claims[j];
    }
  }
  std::vector<double> us;
  const int calls = absl::GetFlag(FLAGS_resume_calls);
  for (int i = 0; i <= calls; ++i) {  // the first one warms up
    const absl::Time t = absl::Now();
    for (const v1::ResumeRequest& request : pages) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::ResumeResponse response;
      const grpc::Status s = stub.Resume(&ctx, request, &response);
      if (!s.ok() || response.kept_size() != request.allocations_size()) {
        fprintf(stderr, "restart_bench: Resume of %d claims: %s, %d kept, %d lost\n",
                request.allocations_size(), s.ok() ? "ok" : s.error_message().c_str(),
                response.kept_size(), response.lost_size());
        return {};
      }
    }
    const absl::Duration took = absl::Now() - t;
    if (i > 0) us.push_back(absl::ToDoubleMicroseconds(took) / claims.size());
  }
  return us;
}

bool RunOnce(const std::string& binary, const std::string& label, int blocks, Figures* out) {
  Figures& f = *out;
  f.daemon = label;
  f.blocks = blocks;
  const uint64_t block_size = absl::GetFlag(FLAGS_block_size);
  const std::string dir = testing::MakeTempDir();
  const std::string socket = dir + "/gpumemd.sock";
  // Requests as large as a Resume of every block (about 70 bytes a claim).
  const std::vector<std::string> args = {
      binary,                                  "--socket=" + socket,
      "--ledger=" + dir + "/ledger.db",       "--state=" + dir + "/state",
      "--sim_devices=2x4GiB",                  "--slab_size=64MiB",
      "--max_receive_message_size=64MiB"};
  PumpedSystemd systemd(dir, absl::GetFlag(FLAGS_fd_store));
  if (!systemd.Start(args, socket)) {
    fprintf(stderr, "restart_bench: the daemon did not start:\n%s", systemd.Log().c_str());
    return false;
  }
  f.empty_start_ms = Ms(systemd.last_start());

  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket);
  if (!c.ok()) {
    fprintf(stderr, "restart_bench: %s\n", c.status().ToString().c_str());
    return false;
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
      return false;
    }
    const uint64_t id = b->id();
    memcpy(b->data(), &id, sizeof(id));
    held.push_back(*std::move(b));
  }

  // The caller: every call timed; the longest since the last reset.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> longest_ns{0};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> calls_done{0};
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
      ++calls_done;
    }
  });

  std::vector<double> start_ms, pause_ms;
  const int restarts = absl::GetFlag(FLAGS_restarts);
  for (int n = 1; n <= restarts; ++n) {
    absl::SleepFor(absl::Milliseconds(100));
    longest_ns.store(0);
    const uint64_t done_at_kill = calls_done.load();
    systemd.Kill(SIGKILL);
    if (systemd.Wait() != -SIGKILL || !systemd.Start(args, socket)) {
      fprintf(stderr, "restart_bench: restart %d failed:\n%s", n, systemd.Log().c_str());
      stop.store(true);
      caller.join();
      return false;
    }
    start_ms.push_back(Ms(systemd.last_start()));
    while (client.restarts() < static_cast<uint64_t>(n)) absl::SleepFor(absl::Milliseconds(1));
    // The call in flight at the kill has landed, and one after it.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (calls_done.load() < done_at_kill + 2 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    pause_ms.push_back(static_cast<double>(longest_ns.load()) / 1e6);
  }
  stop.store(true);
  caller.join();

  // Resume timed by itself, from this process (the session of every block),
  // against the daemon that restored them.
  {
    grpc::ChannelArguments channel_args;
    channel_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_args.SetMaxReceiveMessageSize(-1);
    std::unique_ptr<v1::GpuMemory::Stub> stub = v1::GpuMemory::NewStub(grpc::CreateCustomChannel(
        "unix:" + socket, grpc::InsecureChannelCredentials(), channel_args));
    std::vector<v1::Allocation> all;
    all.reserve(held.size());
    for (const Buffer& b : held) all.push_back(b.allocation());
    f.few = std::min<int>(blocks, absl::GetFlag(FLAGS_few_claims));
    const std::vector<v1::Allocation> few(all.begin(), all.begin() + f.few);
    // Alternating, so that both see the same machine.
    std::vector<double> all_us, few_us;
    for (int round = 0; round < 2; ++round) {
      std::vector<double> a = TimeResume(*stub, all);
      std::vector<double> s = TimeResume(*stub, few);
      if (a.empty() || s.empty()) return false;
      all_us.insert(all_us.end(), a.begin(), a.end());
      few_us.insert(few_us.end(), s.begin(), s.end());
    }
    f.claim_all_us = Summarize(all_us);
    f.claim_few_us = Summarize(few_us);
  }

  for (const Buffer& b : held) {
    uint64_t id = 0;
    memcpy(&id, b.data(), sizeof(id));
    f.intact += id == b.id() && !client.IsLost(b.id());
  }
  for (Buffer& b : held) f.freed_ok += b.Free().ok();

  f.start = Summarize(start_ms);
  f.pause = Summarize(pause_ms);
  {
    absl::MutexLock lock(&mu);
    f.resume = Summarize(resume_ms);
  }
  f.failures = failures.load();
  held.clear();
  c->reset();
  systemd.Kill(SIGTERM);
  systemd.Wait();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return true;
}

void PrintJson(const Figures& f) {
  printf("{\"daemon\": \"%s\", \"blocks\": %d, \"restarts\": %d, \"fd_store\": %s, "
         "\"empty_start_ms\": %.1f, "
         "\"start_to_serving_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
         "\"client_pause_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
         "\"resume_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
         "\"resume_us_per_claim\": {\"all\": {\"p50\": %.3f, \"p99\": %.3f}, "
         "\"few\": {\"claims\": %d, \"p50\": %.3f, \"p99\": %.3f}}, "
         "\"blocks_intact\": %d, \"frees_ok\": %d, \"failed_calls\": %lu}\n",
         f.daemon.c_str(), f.blocks, absl::GetFlag(FLAGS_restarts),
         absl::GetFlag(FLAGS_fd_store) ? "true" : "false", f.empty_start_ms, f.start.p50,
         f.start.p99, f.start.max, f.pause.p50, f.pause.p99, f.pause.max, f.resume.p50,
         f.resume.p99, f.resume.max, f.claim_all_us.p50, f.claim_all_us.p99, f.few,
         f.claim_few_us.p50, f.claim_few_us.p99, f.intact, f.freed_ok,
         static_cast<unsigned long>(f.failures));
}

void PrintTable(const Figures& f) {
  printf("%s: %d live blocks of %lu bytes, %d kill -9 restarts, fd store %s\n",
         f.daemon.c_str(), f.blocks, static_cast<unsigned long>(absl::GetFlag(FLAGS_block_size)),
         absl::GetFlag(FLAGS_restarts), absl::GetFlag(FLAGS_fd_store) ? "on" : "off");
  printf("  %-40s %9s %9s %9s\n", "", "p50 ms", "p99 ms", "max ms");
  printf("  %-40s %9.1f\n", "start, nothing to restore", f.empty_start_ms);
  printf("  %-40s %9.1f %9.1f %9.1f\n", "start to serving, restoring all", f.start.p50,
         f.start.p99, f.start.max);
  printf("  %-40s %9.1f %9.1f %9.1f\n", "client pause (longest call)", f.pause.p50, f.pause.p99,
         f.pause.max);
  printf("  %-40s %9.1f %9.1f %9.1f\n", "client reconnect + Resume", f.resume.p50, f.resume.p99,
         f.resume.max);
  printf("  %-40s %9s %9s\n", "Resume, per claim", "p50 us", "p99 us");
  printf("  %-40s %9.3f %9.3f\n", "  every live block claimed", f.claim_all_us.p50,
         f.claim_all_us.p99);
  char few[64];
  snprintf(few, sizeof(few), "  %d claimed, all still live", f.few);
  printf("  %-40s %9.3f %9.3f\n", few, f.claim_few_us.p50, f.claim_few_us.p99);
  printf("  blocks intact %d/%d, frees ok %d/%d, calls failed %lu\n", f.intact, f.blocks,
         f.freed_ok, f.blocks, static_cast<unsigned long>(f.failures));
}

// This build's figure over the baseline's.
void PrintRatios(const Figures& d, const Figures& b) {
  auto r = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  printf("%d live blocks, daemon / baseline:\n", d.blocks);
  printf("  %-40s %9s %9s\n", "", "p50", "p99");
  printf("  %-40s %9.3f %9.3f\n", "start to serving", r(d.start.p50, b.start.p50),
         r(d.start.p99, b.start.p99));
  printf("  %-40s %9.3f %9.3f\n", "client pause", r(d.pause.p50, b.pause.p50),
         r(d.pause.p99, b.pause.p99));
  printf("  %-40s %9.3f %9.3f\n", "client reconnect + Resume", r(d.resume.p50, b.resume.p50),
         r(d.resume.p99, b.resume.p99));
  printf("  %-40s %9.3f %9.3f\n", "Resume per claim, all", r(d.claim_all_us.p50, b.claim_all_us.p50),
         r(d.claim_all_us.p99, b.claim_all_us.p99));
  printf("  %-40s %9.3f %9.3f\n", "Resume per claim, few", r(d.claim_few_us.p50, b.claim_few_us.p50),
         r(d.claim_few_us.p99, b.claim_few_us.p99));
}

int Run() {
  std::vector<int> sizes;
  if (const std::string list = absl::GetFlag(FLAGS_sizes); !list.empty()) {
    for (absl::string_view s : absl::StrSplit(list, ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(s, &n) || n <= 0) {
        fprintf(stderr, "restart_bench: --sizes: \"%s\" is not a block count\n",
                std::string(s).c_str());
        return 2;
      }
      sizes.push_back(n);
    }
  } else {
    sizes.push_back(absl::GetFlag(FLAGS_blocks));
  }
  std::string daemon = absl::GetFlag(FLAGS_daemon);
  if (daemon.empty()) daemon = testing::RunfilePath("server/gpumemd");
  const std::string baseline = absl::GetFlag(FLAGS_baseline_daemon);
  const bool json = absl::GetFlag(FLAGS_json);
  bool all_ok = true;
  std::vector<Figures> mine, theirs;  // by size
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<std::pair<std::string, std::string>> runs = {{daemon, "daemon"}};
    // Alternating which goes first, so that neither always meets the
    // machine as the other left it.
    if (!baseline.empty()) {
      runs.emplace(i % 2 == 0 ? runs.end() : runs.begin(), baseline, "baseline");
    }
    for (const auto& [binary, label] : runs) {
      Figures f;
      if (!RunOnce(binary, label, sizes[i], &f)) return 1;
      all_ok = all_ok && f.ok();
      if (json) {
        PrintJson(f);
      } else {
        PrintTable(f);
      }
      fflush(stdout);
      (label == "daemon" ? mine : theirs).push_back(f);
    }
  }
  if (!json && sizes.size() > 1) {
    printf("Resume per claim (us, p50) by live blocks (few: %d claimed):\n",
           mine.front().few);
    printf("  %-10s %12s %12s", "blocks", "all", "few");
    if (!baseline.empty()) printf(" %14s %14s", "baseline all", "baseline few");
    printf("\n");
    for (size_t i = 0; i < sizes.size(); ++i) {
      printf("  %-10d %12.3f %12.3f", sizes[i], mine[i].claim_all_us.p50,
             mine[i].claim_few_us.p50);
      if (!baseline.empty()) {
        printf(" %14.3f %14.3f", theirs[i].claim_all_us.p50, theirs[i].claim_few_us.p50);
      }
      printf("\n");
    }
  }
  if (!json) {
    for (size_t i = 0; i < theirs.size(); ++i) PrintRatios(mine[i], theirs[i]);
  }
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
