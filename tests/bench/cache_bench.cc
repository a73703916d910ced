// cache_bench: what an allocate+free pair costs through the client library's
// caching pool (gpumem_malloc + gpumem_free, C ABI), next to glibc's
// malloc + free of the same sizes and to the RPC pair through the daemon
// (Allocate + Free, unary), measured in one run.
//
// Starts its own gpumemd (sim backend) on a private socket. The cached and
// glibc series run the same loop over the same size mix (128 B .. 64 KiB, all
// below glibc's mmap threshold), from 1 and --threads threads, in interleaved
// rounds; a series' figure is the median round. ns/pair is CPU time: the
// threads' CPU time (CLOCK_THREAD_CPUTIME_ID) summed, divided by all their
// pairs, so time spent waiting for a core on a loaded machine is left out
// while contention between threads (shared cache lines, spinning) is in;
// Mpairs/s is all pairs over the round's wall time. The RPC pair is timed one
// pair at a time in wall time (median), and its CPU time is the calling
// thread's plus the whole daemon process's (clock_getcpuclockid) over all
// timed pairs, divided by the pairs. Ratios are like to like (wall time to
// wall time, CPU time to CPU time) and of figures from this run only.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/lib/cpp/client.h"
#include "client/lib/include/gpumem.h"
#include "tests/integration/daemon_fixture.h"

ABSL_FLAG(int, rounds, 7, "interleaved rounds per series");
ABSL_FLAG(int, pairs, 200000, "allocate+free pairs per thread per round");
ABSL_FLAG(int, threads, 8, "threads of the multi-threaded series");
ABSL_FLAG(int, rpc_pairs, 2000, "RPC pairs timed");
ABSL_FLAG(bool, json, false, "print JSON");

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSizes[16] = {512,  1024,  4096, 256,   16384, 2048, 65536, 8192,
                               768,  32768, 3072, 128,   6144,  24576, 1536, 12288};

thread_local void* volatile sink;  // keeps the compiler from pairing malloc with free away

struct Glibc {
  static void* Alloc(size_t n) { return std::malloc(n); }
  static void Free(void* p) { std::free(p); }
};

gpumem_client* g_client = nullptr;
struct Cached {
  static void* Alloc(size_t n) {
    void* p = nullptr;
    if (gpumem_malloc(g_client, n, nullptr, &p) != GPUMEM_OK) {
      std::fprintf(stderr, "gpumem_malloc: %s\n", gpumem_last_error_message());
      std::abort();
    }
    return p;
  }
  static void Free(void* p) {
    if (gpumem_free(g_client, p) != GPUMEM_OK) {
      std::fprintf(stderr, "gpumem_free: %s\n", gpumem_last_error_message());
      std::abort();
    }
  }
};

template <typename A>
void Pairs(int n, int seed) {
  for (int i = 0; i < n; ++i) {
    void* p = A::Alloc(kSizes[(i + seed) & 15]);
    sink = p;
    A::Free(p);
  }
}

double ClockNs(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

double ThreadCpuNs() { return ClockNs(CLOCK_THREAD_CPUTIME_ID); }

struct RoundResult {
  double cpu_ns_per_pair;  // CPU time of all threads / all pairs
  double wall_ns;          // the round's wall time
};

// One round of `threads` threads doing `pairs` pairs each.
template <typename A>
RoundResult Round(int threads, int pairs) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> cpu(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      Pairs<A>(64, t);  // warm this thread's cache
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double c0 = ThreadCpuNs();
      Pairs<A>(pairs, t);
      cpu[t] = ThreadCpuNs() - c0;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : ts) t.join();
  double wall = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  double sum = 0;
  for (double c : cpu) sum += c;
  return {sum / (static_cast<double>(threads) * pairs), wall};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string name;
  int threads;
  double ns_per_pair;
  double mpairs_per_s;  // all threads together
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int pairs = absl::GetFlag(FLAGS_pairs);
  const int nthreads = absl::GetFlag(FLAGS_threads);
  const int rpc_pairs = absl::GetFlag(FLAGS_rpc_pairs);

  gpumem::testing::DaemonProcess daemon({"--sim_devices=2x4GiB", "--mutex_deadlock_detection=false"});
  if (!daemon.Start()) {
    std::fprintf(stderr, "cache_bench: gpumemd did not start:\n%s\n", daemon.Log().c_str());
    return 1;
  }
  g_client = gpumem_connect(daemon.socket().c_str());
  if (g_client == nullptr) {
    std::fprintf(stderr, "cache_bench: %s\n", gpumem_last_error_message());
    return 1;
  }

  std::vector<Row> rows;
  for (int threads : {1, nthreads}) {
    std::vector<double> glibc, cached, glibc_wall, cached_wall;
    for (int r = 0; r < rounds; ++r) {
      RoundResult g = Round<Glibc>(threads, pairs);
      RoundResult c = Round<Cached>(threads, pairs);
      glibc.push_back(g.cpu_ns_per_pair);
      glibc_wall.push_back(g.wall_ns);
      cached.push_back(c.cpu_ns_per_pair);
      cached_wall.push_back(c.wall_ns);
    }
    const double total = static_cast<double>(threads) * pairs;
    rows.push_back({"glibc malloc+free", threads, Median(glibc), total * 1e3 / Median(glibc_wall)});
    rows.push_back({"gpumem cached pair", threads, Median(cached), total * 1e3 / Median(cached_wall)});
  }

  auto client = gpumem::client::Client::Connect(daemon.socket());
  if (!client.ok()) {
    std::fprintf(stderr, "cache_bench: %s\n", client.status().ToString().c_str());
    return 1;
  }
  clockid_t daemon_clock;
  if (clock_getcpuclockid(daemon.pid(), &daemon_clock) != 0) {
    std::fprintf(stderr, "cache_bench: no CPU clock for the daemon\n");
    return 1;
  }
  std::vector<double> rpc;
  gpumem::v1::AllocateRequest req;
  double rpc_cpu0 = 0, daemon_cpu0 = 0;
  for (int i = 0; i < rpc_pairs + 50; ++i) {
    if (i == 50) {
      rpc_cpu0 = ThreadCpuNs();
      daemon_cpu0 = ClockNs(daemon_clock);
    }
    req.set_size_bytes(kSizes[i & 15]);
    auto t0 = Clock::now();
    auto resp = (*client)->AllocateRaw(req);
    if (!resp.ok() || !(*client)->Free(resp->allocations(0).id()).ok()) {
      std::fprintf(stderr, "cache_bench: RPC pair failed\n");
      return 1;
    }
    if (i >= 50) rpc.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  const double rpc_cpu_ns =
      (ThreadCpuNs() - rpc_cpu0 + ClockNs(daemon_clock) - daemon_cpu0) / rpc_pairs;
  const double rpc_ns = Median(rpc);
  // ns/pair: CPU (client thread + daemon); Mpairs/s: from the median wall time.
  rows.push_back({"RPC pair (Allocate+Free)", 1, rpc_cpu_ns, 1e3 / rpc_ns});
  gpumem_close(g_client);
  daemon.Stop();

  const double ratio1 = rows[1].ns_per_pair / rows[0].ns_per_pair;
  const double ratioN = rows[3].ns_per_pair / rows[2].ns_per_pair;
  // Like to like: CPU per pair over CPU per pair, wall per pair over wall.
  const double rpc_speedup = rpc_cpu_ns / rows[1].ns_per_pair;
  const double rpc_speedup_wall = rpc_ns / (1e3 / rows[1].mpairs_per_s);
  if (absl::GetFlag(FLAGS_json)) {
    std::string out = "{\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      absl::StrAppendFormat(&out,
                            "%s{\"op\":\"%s\",\"threads\":%d,\"ns_per_pair\":%.1f,"
                            "\"mpairs_per_s\":%.3f}",
                            i ? "," : "", rows[i].name, rows[i].threads,
                            rows[i].ns_per_pair, rows[i].mpairs_per_s);
    }
    absl::StrAppendFormat(&out,
                          "],\"cached_over_glibc_1\":%.2f,\"cached_over_glibc_%d\":%.2f,"
                          "\"rpc_over_cached_1\":%.0f,\"rpc_over_cached_wall_1\":%.0f,"
                          "\"rounds\":%d,\"pairs\":%d}",
                          ratio1, nthreads, ratioN, rpc_speedup, rpc_speedup_wall, rounds,
                          pairs);
    std::printf("%s\n", out.c_str());
    return 0;
  }
  std::printf("%-28s %7s %14s %12s\n", "op", "threads", "ns/pair (cpu)", "Mpairs/s");
  for (const Row& r : rows) {
    std::printf("%-28s %7d %14.1f %12.3f\n", r.name.c_str(), r.threads, r.ns_per_pair,
                r.mpairs_per_s);
  }
  std::printf("cached / glibc: %.2fx at 1 thread, %.2fx at %d threads (target <= 3)\n",
              ratio1, ratioN, nthreads);
  std::printf("RPC pair / cached pair (1 thread): %.0fx in CPU time (client thread + daemon "
              "over the cached pair's CPU time), %.0fx in wall time (median RPC pair over "
              "the cached round's wall time per pair) (target >= 100)\n",
              rpc_speedup, rpc_speedup_wall);
  return 0;
}
