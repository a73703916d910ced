// ledger_bench: what the ledger's writer sustains, and what an event costs
// in CPU and on disk, at the batching the daemon runs with.
//
//   bazel run -c opt //tests/ledger:ledger_bench [-- --json] [--events=N]
//
// A producer thread appends --events events (ALLOCATE/FREE pairs over
// --tenants tenants and 4 devices, as the broker would) to a fresh ledger in
// a temporary directory, with the daemon's LedgerOptions (a commit per 4,096
// events or 100 ms; --max_batch changes the first), then Flush()es. Two rows:
//   paced     the producer appends --rate events/s in 1 ms ticks, so the
//             writer commits as it does under a steady load
//   flat_out  the producer appends as fast as one thread can while the
//             writer commits (what the writer sustains)
// Per row:
//   events/s           events committed per second, first append to flush
//   append ns/event    the producer's time inside Append (what the broker pays)
//   cpu us/event       the process's CPU (user + system) less the producer
//                      thread's own, per event: the writer's cost
//   commits            transactions the writer used
//   bytes/event        the ledger file's size after a WAL checkpoint,
//                      divided by the events (schema and usage rows included)
// --json prints the same as JSON.
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/ledger/tenant_ledger.h"

ABSL_FLAG(int, events, 200000, "events to append per row");
ABSL_FLAG(int, tenants, 8, "tenants the events are spread over");
ABSL_FLAG(double, rate, 50000, "events/s of the paced row (load_bench's 4-client rate is near 40k)");
ABSL_FLAG(bool, json, false, "print JSON");
ABSL_FLAG(int, max_batch, 0, "events per commit (0: the daemon's default)");

namespace gpumem {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ThreadCpuNs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
}

int64_t ProcessCpuNs() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1'000'000'000LL +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1000LL;
}

struct Figures {
  std::string mode;
  int events = 0;
  double events_per_s = 0, append_ns = 0, cpu_us_per_event = 0, bytes_per_event = 0;
  uint64_t commits = 0, file_bytes = 0;
};

bool RunRow(const std::string& mode, double rate, Figures* out) {
  char tmpl[] = "/tmp/ledger-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/ledger.db";
  ledger::LedgerOptions options;
  options.path = path;
  if (absl::GetFlag(FLAGS_max_batch) > 0) options.max_batch = absl::GetFlag(FLAGS_max_batch);
  auto opened = ledger::TenantLedger::Open(options);
  if (!opened.ok()) {
    fprintf(stderr, "ledger_bench: %s\n", std::string(opened.status().message()).c_str());
    return false;
  }
  ledger::TenantLedger& l = **opened;
  const int n = absl::GetFlag(FLAGS_events);
  const int tenants = absl::GetFlag(FLAGS_tenants);
  std::vector<std::string> names;
  for (int t = 0; t < tenants; ++t) names.push_back(absl::StrCat("tenant-", t));
  int64_t producer_cpu = 0, append_wall_ns = 0;
  const int64_t cpu0 = ProcessCpuNs();
  const Clock::time_point t0 = Clock::now();
  std::thread producer([&] {
    const int64_t my0 = ThreadCpuNs();
    int i = 0;
    while (i < n) {
      int due = n;
      if (rate > 0) {
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        due = std::min<int>(n, static_cast<int>(s * rate) + 1);
        if (due <= i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
      }
      const Clock::time_point a0 = Clock::now();
      for (; i < due; ++i) {
        ledger::LedgerEvent e;
        e.kind = i % 2 == 0 ? ledger::EventKind::kAllocate : ledger::EventKind::kFree;
        const int pair = i / 2;
        e.tenant = names[pair % tenants];
        e.uid = 1000 + pair % tenants;
        e.pid = 4000 + pair % 64;
        e.session = 1 + pair % 64;
        e.device = pair % 4;
        e.bytes = uint64_t{1} << 20;
        e.allocation_id = l.first_allocation_id() + pair;
        l.Append(std::move(e));
      }
      append_wall_ns +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a0).count();
    }
    producer_cpu = ThreadCpuNs() - my0;
  });
  producer.join();
  absl::Status flushed = l.Flush();
  const Clock::time_point t1 = Clock::now();
  const int64_t cpu1 = ProcessCpuNs();
  if (!flushed.ok()) {
    fprintf(stderr, "ledger_bench: %s\n", std::string(flushed.message()).c_str());
    return false;
  }
  const ledger::WriterStats stats = l.stats();
  opened->reset();
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  out->file_bytes = std::filesystem::file_size(path);
  std::filesystem::remove_all(dir);

  out->mode = mode;
  out->events = n;
  out->append_ns = static_cast<double>(append_wall_ns) / n;
  out->events_per_s = n / std::chrono::duration<double>(t1 - t0).count();
  out->cpu_us_per_event = static_cast<double>(cpu1 - cpu0 - producer_cpu) / 1e3 / n;
  out->commits = stats.commits;
  out->bytes_per_event = static_cast<double>(out->file_bytes) / n;
  return true;
}

int Run() {
  std::vector<Figures> rows(2);
  if (!RunRow("paced", absl::GetFlag(FLAGS_rate), &rows[0]) ||
      !RunRow("flat_out", 0, &rows[1])) {
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> items;
    for (const Figures& f : rows) {
      items.push_back(absl::StrFormat(
          "{\"mode\": \"%s\", \"events\": %d, \"events_per_s\": %.0f, "
          "\"append_ns_per_event\": %.1f, \"cpu_us_per_event\": %.3f, \"commits\": %d, "
          "\"file_bytes\": %d, \"bytes_per_event\": %.1f}",
          f.mode, f.events, f.events_per_s, f.append_ns, f.cpu_us_per_event, f.commits,
          f.file_bytes, f.bytes_per_event));
    }
    printf("{\"rate\": %.0f, \"rows\": [%s]}\n", absl::GetFlag(FLAGS_rate),
           absl::StrJoin(items, ", ").c_str());
    return 0;
  }
  printf("%-9s %8s %10s %10s %12s %8s %11s\n", "mode", "events", "events/s", "append ns",
         "cpu us/event", "commits", "bytes/event");
  for (const Figures& f : rows) {
    printf("%-9s %8d %10.0f %10.1f %12.3f %8llu %11.1f\n", f.mode.c_str(), f.events,
           f.events_per_s, f.append_ns, f.cpu_us_per_event,
           static_cast<unsigned long long>(f.commits), f.bytes_per_event);
  }
  printf("(paced: %.0f events/s asked)\n", absl::GetFlag(FLAGS_rate));
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
