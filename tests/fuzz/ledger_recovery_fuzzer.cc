// Fuzzes the ledger's start-up recovery (server/ledger/ledger_store.h) on a
// damaged file: the input is the ledger file as a daemon that died left it
// (the seeds are such files, with live allocations in them: see
// MakeSeeds), so libFuzzer's mutations truncate it, cut pages out and
// overwrite bytes anywhere.
//
// Checked for every input: Open either fails with a status that names the
// file, or succeeds; then the first allocation id it hands out is above
// every id in the events table, a commit and a query work or fail with a
// status, and a second Open of the same file (the next daemon start) finds
// nothing live any more (the first one closed it all with DAEMON_RESTART).
//
// With GPUMEMD_LEDGER_SEEDS=DIR set, LLVMFuzzerInitialize writes the seed
// files into DIR and exits (how the committed seeds were made: ledger_* by
// the format with one row per event, which Open converts; pairs_* by the
// format with pair_rows, where every third allocation, freed at once, is a
// pair). Query's answer over a damaged pair row is checked like any other:
// an error naming the file, or events whose seqs and ids are below what
// recovery hands out.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/ledger/ledger_store.h"
#include "server/ledger/tenant_ledger.h"

namespace gpumem {
namespace {

std::string dir;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    fprintf(stderr, "ledger_recovery_fuzzer: %s\n", what.c_str());
    abort();
  }
}

void Remove(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-lock"}) {
    std::filesystem::remove(path + suffix);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A ledger as a daemon leaves it when it dies: `allocs` allocations, every
// third freed, quotas set; the rest live.
std::string MakeLedger(int allocs) {
  const std::string path = dir + "/seed.db";
  Remove(path);
  {
    ledger::LedgerOptions o;
    o.path = path;
    absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> l = ledger::TenantLedger::Open(o);
    Check(l.ok(), "seed open: " + l.status().ToString());
    const uint64_t first = (*l)->first_allocation_id();
    for (int i = 0; i < allocs; ++i) {
      ledger::LedgerEvent e;
      e.kind = ledger::EventKind::kAllocate;
      e.tenant = i % 2 ? "inference" : "training";
      e.uid = 1000 + i % 3;
      e.pid = 100 + i;
      e.session = 1 + i % 4;
      e.device = i % 2;
      e.bytes = (uint64_t{1} << 20) * (1 + i);
      e.allocation_id = first + i;
      (*l)->Append(e);
      if (i % 3 == 0) {
        e.kind = ledger::EventKind::kFree;
        (*l)->Append(e);
      }
    }
    ledger::QuotaRow q;
    q.tenant = "inference";
    q.quota.total_bytes = uint64_t{8} << 30;
    q.quota.device_bytes = {uint64_t{4} << 30};
    q.source = "config";
    (*l)->SetQuota(q);
    Check((*l)->Flush().ok(), "seed flush");
  }  // closed: the WAL is checkpointed into the file
  std::string bytes = ReadFile(path);
  Remove(path);
  return bytes;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace
}  // namespace gpumem

using namespace gpumem;  // NOLINT: the fuzzer entry points are global

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* shm = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  dir = absl::StrCat(shm, "/gpumemd-ledger-fuzz-", getpid());
  std::filesystem::create_directories(dir);
  // Leave nothing behind (the process ends with its threads running).
  atexit([] { std::error_code e; std::filesystem::remove_all(dir, e); });
  if (const char* seeds = getenv("GPUMEMD_LEDGER_SEEDS")) {
    std::filesystem::create_directories(seeds);
    for (int n : {1, 6, 40}) {
      const std::string bytes = MakeLedger(n);
      WriteFile(absl::StrCat(seeds, "/ledger_", n), bytes);
      // Truncated in the middle of a page, and at a page boundary.
      WriteFile(absl::StrCat(seeds, "/ledger_", n, "_cut"), bytes.substr(0, bytes.size() / 2 + 100));
      WriteFile(absl::StrCat(seeds, "/ledger_", n, "_page"), bytes.substr(0, 4096 * 2));
    }
    std::filesystem::remove_all(dir);
    exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 18)) return 0;
  const std::string path = dir + "/ledger.db";
  Remove(path);
  WriteFile(path, std::string(reinterpret_cast<const char*>(data), size));
  const int64_t now = absl::GetCurrentTimeNanos();
  {
    absl::StatusOr<std::unique_ptr<ledger::LedgerStore>> store =
        ledger::LedgerStore::Open(path, now);
    if (!store.ok()) {
      Check(absl::StrContains(store.status().message(), path),
            "error does not name the file: " + store.status().ToString());
      Remove(path);
      return 0;
    }
    const ledger::LedgerStore::Recovery& r = (*store)->recovery();
    ledger::EventQuery q;
    q.limit = 100000;
    absl::StatusOr<std::vector<ledger::LedgerEvent>> events = (*store)->Query(q);
    if (!events.ok()) {
      Check(absl::StrContains(events.status().message(), path),
            "query error does not name the file: " + events.status().ToString());
    } else {
      for (const ledger::LedgerEvent& e : *events) {
        Check(e.allocation_id < r.first_allocation_id,
              absl::StrCat("first id ", r.first_allocation_id, " not above id ",
                           e.allocation_id, " in the events"));
        Check(e.seq < r.next_seq, "next seq not above the events'");
      }
    }
    // The next run's first commit.
    ledger::LedgerEvent e;
    e.seq = r.next_seq;
    e.time_ns = now;
    e.kind = ledger::EventKind::kAllocate;
    e.tenant = "fuzz";
    e.device = 0;
    e.bytes = 4096;
    e.allocation_id = r.first_allocation_id;
    ledger::UsageAccount usage = r.usage;
    usage.Apply(e);
    const std::vector<ledger::UsageAccount::Key> changed = {{"fuzz", 0}};
    (void)(*store)->Commit({e}, usage, changed, {}, e.allocation_id);
  }
  // The next start: what the first one closed stays closed; the allocation
  // it committed (if it could) is live and closed now.
  absl::StatusOr<std::unique_ptr<ledger::LedgerStore>> again =
      ledger::LedgerStore::Open(path, now + 1);
  if (again.ok()) {
    for (const ledger::LedgerEvent& e : (*again)->recovery().restart_events) {
      Check(e.tenant == "fuzz", "an allocation closed at the last start is live again: " +
                                    e.tenant + " id " + std::to_string(e.allocation_id));
    }
  }
  Remove(path);
  return 0;
}
