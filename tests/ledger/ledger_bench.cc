// ledger_bench: what the ledger's writer sustains, and what an event costs
// on disk.
//
// Appends --events events (ALLOCATE/FREE pairs over --tenants tenants and 4
// devices, as the broker would) to a fresh ledger in a temporary directory
// as fast as one thread can, then Flush()es. Prints:
//   append ns/event    the producer's cost (what the broker pays per event)
//   events/s           events committed per second, first append to flush
//   commits            transactions the writer used
//   bytes/event        the ledger file's size after a WAL checkpoint,
//                      divided by the events (schema and usage rows included)
// --json prints the same as JSON.
#include <sqlite3.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "server/ledger/tenant_ledger.h"

ABSL_FLAG(int, events, 200000, "events to append");
ABSL_FLAG(int, tenants, 8, "tenants the events are spread over");
ABSL_FLAG(bool, json, false, "print JSON");

namespace gpumem {
namespace {

using Clock = std::chrono::steady_clock;

int Run() {
  char tmpl[] = "/tmp/ledger-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/ledger.db";
  ledger::LedgerOptions options;
  options.path = path;
  auto opened = ledger::TenantLedger::Open(options);
  if (!opened.ok()) {
    fprintf(stderr, "ledger_bench: %s\n", std::string(opened.status().message()).c_str());
    return 1;
  }
  ledger::TenantLedger& l = **opened;
  const int n = absl::GetFlag(FLAGS_events);
  const int tenants = absl::GetFlag(FLAGS_tenants);
  std::vector<std::string> names;
  for (int t = 0; t < tenants; ++t) names.push_back(absl::StrCat("tenant-", t));
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
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
  const Clock::time_point appended = Clock::now();
  absl::Status flushed = l.Flush();
  const Clock::time_point t1 = Clock::now();
  if (!flushed.ok()) {
    fprintf(stderr, "ledger_bench: %s\n", std::string(flushed.message()).c_str());
    return 1;
  }
  const ledger::WriterStats stats = l.stats();
  opened->reset();
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  const uint64_t bytes = std::filesystem::file_size(path);
  std::filesystem::remove_all(dir);

  const double append_ns =
      std::chrono::duration<double, std::nano>(appended - t0).count() / n;
  const double seconds = std::chrono::duration<double>(t1 - t0).count();
  const double per_s = n / seconds;
  const double per_event = static_cast<double>(bytes) / n;
  if (absl::GetFlag(FLAGS_json)) {
    printf("{\"events\": %d, \"append_ns_per_event\": %.1f, \"events_per_s\": %.0f, "
           "\"commits\": %lu, \"file_bytes\": %lu, \"bytes_per_event\": %.1f}\n",
           n, append_ns, per_s, static_cast<unsigned long>(stats.commits),
           static_cast<unsigned long>(bytes), per_event);
  } else {
    printf("events             %d\n", n);
    printf("append ns/event    %.1f\n", append_ns);
    printf("events/s           %.0f\n", per_s);
    printf("commits            %lu\n", static_cast<unsigned long>(stats.commits));
    printf("file bytes         %lu\n", static_cast<unsigned long>(bytes));
    printf("bytes/event        %.1f\n", per_event);
  }
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
