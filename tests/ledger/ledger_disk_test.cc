// The ledger's disk and its file modes: a
// ledger whose disk is full at start still opens, serves, holds its events
// and writes them with a LEDGER_GAP once the disk takes them (the page limit
// is the "disk full" seam); retention folds old events into per-tenant
// summaries, keeps usage exact and stops the file growing under churn; the
// churn cap folds what a tenant churns past its pairs a second; the
// files are 0600 whatever the umask, and wider ones are tightened.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/ledger/tenant_ledger.h"
#include "tests/ledger/ledger_test_events.h"

namespace gpumem {
namespace ledger {
namespace {

constexpr int64_t kSec = 1'000'000'000;
constexpr int64_t kT0 = 1'700'000'000 * kSec;

int64_t SqlInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  int64_t v = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    v = sqlite3_column_int64(s, 0);
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

int64_t FileBytes(const std::string& path) {
  struct stat st;
  int64_t bytes = 0;
  if (stat(path.c_str(), &st) == 0) bytes = st.st_size;
  return bytes;
}

std::unique_ptr<TenantLedger> Open(LedgerOptions o) {
  auto l = TenantLedger::Open(std::move(o));
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

// A restart on a full disk: the last daemon left 2,000 allocations live, so
// the recovery must write 2,000 DAEMON_RESTART events, which the page limit
// (the file's current size) refuses. Today's Open failed; now it serves.
TEST(LedgerDiskTest, AFullDiskAtStartStillOpensHoldsAndWritesTheGapLater) {
  const std::string path = TempDir() + "/ledger.db";
  {
    LedgerOptions o;
    o.path = path;
    auto l = Open(o);
    for (uint64_t i = 1; i <= 2000; ++i) l->Append(Alloc(i, 0, 100, kT0));
    ASSERT_TRUE(l->Flush().ok());
  }
  ASSERT_EQ(SqlInt(path, "SELECT COUNT(*) FROM live"), 2000);
  LedgerOptions o;
  o.path = path;
  o.max_page_count = 1;  // clamped by SQLite to the file's size: no page can be added
  o.max_delay = absl::Milliseconds(10);
  auto l = Open(o);
  ASSERT_NE(l, nullptr);
  WriterStats st = l->stats();
  EXPECT_TRUE(st.failing);
  EXPECT_NE(st.last_error.find(path), std::string::npos) << st.last_error;
  EXPECT_NE(st.last_error.find("full"), std::string::npos) << st.last_error;
  EXPECT_GT(l->first_allocation_id(), 2000u);
  EXPECT_EQ(l->restart_event_count(), 2000u);
  // Serving: events are numbered and held; quotas are held too.
  const uint64_t first = l->first_allocation_id();
  for (uint64_t i = 0; i < 10; ++i) l->Append(Alloc(first + i, 1, 7, kT0 + kSec));
  QuotaRow q;
  q.tenant = "ml";
  q.quota.total_bytes = 12345;
  q.source = "config";
  EXPECT_TRUE(l->ReplaceQuotas({q}).ok());
  absl::Status flushed = l->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_EQ(l->Usage().at({"ml", 1}).current_bytes, 70u);
  EXPECT_EQ(SqlInt(path, "SELECT COUNT(*) FROM live"), 2000);  // nothing written yet
  // Space comes back: the recovery, the held events and the gap are written.
  l->SetMaxPageCountForTest(1 << 30);
  absl::Status written = l->Flush();
  for (int i = 0; i < 200 && !written.ok(); ++i) written = l->Flush();
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(l->Flush().ok());
  EXPECT_FALSE(l->stats().failing);
  EXPECT_EQ(SqlInt(path, "SELECT COUNT(*) FROM events WHERE kind = 'DAEMON_RESTART'"), 2000);
  EXPECT_EQ(SqlInt(path, "SELECT COUNT(*) FROM events WHERE kind = 'LEDGER_GAP'"), 1);
  EXPECT_EQ(SqlInt(path, "SELECT COUNT(*) FROM live"), 10);
  EXPECT_EQ(SqlInt(path, "SELECT total_bytes FROM quotas WHERE tenant = 'ml'"), 12345);
  EXPECT_EQ(SqlInt(path, "SELECT current_bytes FROM usage WHERE tenant = 'ml' AND device = 0"), 0);
  EXPECT_EQ(SqlInt(path, "SELECT current_bytes FROM usage WHERE tenant = 'ml' AND device = 1"),
            70);
  // Seqs are those the ledger handed out: the gap comes last.
  EXPECT_EQ(SqlInt(path, "SELECT kind = 'LEDGER_GAP' FROM events ORDER BY seq DESC LIMIT 1"), 1);
  EXPECT_EQ(SqlInt(path, "SELECT COUNT(DISTINCT seq) FROM events"),
            SqlInt(path, "SELECT COUNT(*) FROM events"));
}

// A new ledger on a full disk: not even its schema can be written.
TEST(LedgerDiskTest, ANewLedgerOnAFullDiskStartsAndIsWrittenLater) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  o.max_page_count = 1;
  o.max_delay = absl::Milliseconds(10);
  auto l = Open(o);
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(l->stats().failing);
  auto tenants = l->SocketTenants();
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  EXPECT_TRUE(tenants->empty());
  l->Append(Alloc(l->first_allocation_id(), 0, 5, kT0));
  EXPECT_FALSE(l->Flush().ok());
  l->SetMaxPageCountForTest(1 << 30);
  absl::Status written = l->Flush();
  for (int i = 0; i < 200 && !written.ok(); ++i) written = l->Flush();
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(l->Flush().ok());  // the gap, queued by the commit that worked
  EXPECT_EQ(SqlInt(path, "SELECT COUNT(*) FROM events"), 2);  // the ALLOCATE and the gap
}

// Churn: N allocate+free pairs (each its own commit batch is a pair row)
// with and without retention. Without, the file grows with N; with
// retain_events = 20,000 it stops growing: the second half of the run adds
// nothing. Usage stays exact, and the summary counts every folded event.
TEST(LedgerDiskTest, RetentionFoldsOldEventsAndTheFileStopsGrowing) {
  constexpr uint64_t kPairs = 100000;
  auto run = [&](uint64_t retain, int64_t* half_bytes, int64_t* end_bytes,
                 std::string* path_out) {
    const std::string path = TempDir() + "/ledger.db";
    *path_out = path;
    LedgerOptions o;
    o.path = path;
    o.retain_events = retain;
    o.writer_idle = false;
    o.checkpoint_pages = 64;  // the WAL stays small: the figures are the file's
    auto l = Open(o);
    for (uint64_t i = 1; i <= kPairs; ++i) {
      LedgerEvent a = Alloc(i, static_cast<int32_t>(i % 2), 256, kT0 + static_cast<int64_t>(i),
                            i % 3 == 0 ? "cv" : "ml");
      l->Append(a);
      l->Append(Free(a, kT0 + static_cast<int64_t>(i) + 1));
      if (i % 4096 == 0) ASSERT_TRUE(l->Flush().ok());
      if (i == kPairs / 2) *half_bytes = FileBytes(path);
    }
    l->Append(Alloc(kPairs + 1, 0, 1000, kT0 + 2 * kSec));  // still live at the end
    ASSERT_TRUE(l->Flush().ok());
    // Let idle retention catch up, then a commit to checkpoint.
    for (int i = 0; i < 100 && retain > 0 &&
                    SqlInt(path, "SELECT COUNT(*) FROM events") > static_cast<int64_t>(retain + 2 * 8192);
         ++i) {
      usleep(20000);
    }
    const LedgerEvent last = Alloc(kPairs + 2, 0, 1, kT0 + 3 * kSec);
    l->Append(last);
    l->Append(Free(last, kT0 + 3 * kSec));
    ASSERT_TRUE(l->Flush().ok());  // a commit, and its checkpoint
    *end_bytes = FileBytes(path);
    EXPECT_EQ(l->Usage().at({"ml", 0}).current_bytes, 1000u);
    EXPECT_EQ(l->Usage().at({"cv", 1}).current_bytes, 0u);
    EXPECT_GT(l->Usage().at({"ml", 1}).byte_seconds, 0.0);
    if (retain > 0) {
      EXPECT_GT(l->stats().retained_rows, 0u);
    }
  };
  int64_t keep_half = 0, keep_end = 0, fold_half = 0, fold_end = 0;
  std::string keep_path, fold_path;
  run(0, &keep_half, &keep_end, &keep_path);
  run(20000, &fold_half, &fold_end, &fold_path);
  std::printf("ledger after %llu pairs: no retention %lld bytes (%lld at half); "
              "--ledger_retain_events=20000 %lld bytes (%lld at half)\n",
              static_cast<unsigned long long>(kPairs), static_cast<long long>(keep_end),
              static_cast<long long>(keep_half), static_cast<long long>(fold_end),
              static_cast<long long>(fold_half));
  EXPECT_GT(keep_end, keep_half * 3 / 2);
  EXPECT_LT(fold_end, keep_end / 2);
  EXPECT_LE(fold_end, fold_half * 5 / 4) << "the file kept growing";
  // Every event is either kept or counted in the summary.
  const int64_t kept = SqlInt(fold_path, "SELECT COUNT(*) FROM events");
  const int64_t folded = SqlInt(fold_path, "SELECT SUM(events) FROM retained");
  EXPECT_EQ(kept + folded, static_cast<int64_t>(2 * kPairs + 3));
  EXPECT_LE(kept, 20000 + 2 * 8192 + 2048);
  EXPECT_EQ(SqlInt(fold_path, "SELECT SUM(events) FROM retained WHERE kind = 'ALLOCATE'"),
            SqlInt(fold_path, "SELECT SUM(events) FROM retained WHERE kind = 'FREE'"));
  EXPECT_EQ(SqlInt(fold_path, "SELECT SUM(bytes) FROM retained WHERE kind = 'FREE'"),
            256 * SqlInt(fold_path, "SELECT SUM(events) FROM retained WHERE kind = 'FREE'"));
  // A reopen continues the seqs above what was folded.
  {
    LedgerOptions o;
    o.path = fold_path;
    auto l = Open(o);
    EXPECT_GT(l->first_allocation_id(), kPairs + 1);
  }
}

// The churn cap: a tenant that makes 5,000 allocate+free pairs within one
// second has 100 of them stored as events (the cap here) and the rest
// counted in `retained`; a quiet tenant beside it keeps every event; the
// next second stores 100 again; usage stays exact; every event is listed
// or counted. Without the cap every pair is stored.
TEST(LedgerDiskTest, AChurningTenantStoresAtMostItsCapOfPairsASecond) {
  for (uint64_t cap : {uint64_t{100}, uint64_t{0}}) {
    const std::string path = TempDir() + "/ledger.db";
    LedgerOptions o;
    o.path = path;
    o.writer_idle = false;
    o.churn_pairs_per_second = cap;
    auto l = Open(o);
    uint64_t id = 1;
    for (int64_t second = 0; second < 2; ++second) {
      for (int i = 0; i < 5000; ++i, ++id) {
        const int64_t t = kT0 + second * kSec + i * 1000;
        LedgerEvent a = Alloc(id, 0, 4096, t, "busy");
        l->Append(a);
        l->Append(Free(a, t + 500));
        if (i % 500 == 0) {
          LedgerEvent q = Alloc(1000000 + id, 1, 64, t, "quiet");
          l->Append(q);
          l->Append(Free(q, t + 500));
        }
      }
      ASSERT_TRUE(l->Flush().ok());
    }
    const LedgerEvent held = Alloc(2000000, 0, 1 << 20, kT0 + 3 * kSec, "busy");
    l->Append(held);
    ASSERT_TRUE(l->Flush().ok());
    const int64_t busy = SqlInt(path, "SELECT COUNT(*) FROM events WHERE tenant = 'busy'");
    const int64_t quiet = SqlInt(path, "SELECT COUNT(*) FROM events WHERE tenant = 'quiet'");
    const int64_t folded = SqlInt(path, "SELECT COALESCE(SUM(events), 0) FROM retained");
    std::printf("churn cap %llu: busy's events stored %lld, folded %lld; quiet's %lld\n",
                static_cast<unsigned long long>(cap), static_cast<long long>(busy),
                static_cast<long long>(folded), static_cast<long long>(quiet));
    EXPECT_EQ(quiet, 40) << "the quiet tenant lost events";
    if (cap > 0) {
      // 100 pairs a second and the held block; a pair a commit boundary
      // splits is two single events, not a pair (a few: commits are 4,096
      // events).
      EXPECT_GE(busy, 2 * 2 * 100 + 1);
      EXPECT_LE(busy, 2 * 2 * 100 + 1 + 2 * 16);
      EXPECT_EQ(busy + folded, 2 * 2 * 5000 + 1) << "every event listed or counted";
      const int64_t pairs = folded / 2;
      EXPECT_EQ(SqlInt(path, "SELECT events FROM retained WHERE tenant = 'busy' AND kind = "
                             "'ALLOCATE'"), pairs);
      EXPECT_EQ(SqlInt(path, "SELECT bytes FROM retained WHERE tenant = 'busy' AND kind = "
                             "'FREE'"), pairs * 4096);
      EXPECT_EQ(l->stats().churn_folded_pairs, static_cast<uint64_t>(pairs));
    } else {
      EXPECT_EQ(busy, 2 * 2 * 5000 + 1);
      EXPECT_EQ(folded, 0);
    }
    // Usage is exact either way, and the replay holds: `live` is the held block.
    EXPECT_EQ(l->Usage().at({"busy", 0}).current_bytes, 1u << 20);
    EXPECT_EQ(l->Usage().at({"busy", 0}).peak_bytes, (1u << 20) + 0u);
    EXPECT_EQ(SqlInt(path, "SELECT COUNT(*) FROM live"), 1);
    EXPECT_EQ(SqlInt(path, "SELECT current_bytes FROM usage WHERE tenant = 'busy' AND device = 0"),
              1 << 20);
  }
}

TEST(LedgerDiskTest, FilesAre0600WhateverTheUmaskAndWiderOnesAreTightened) {
  const std::string path = TempDir() + "/ledger.db";
  const mode_t old = umask(0);
  auto mode = [](const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  {
    LedgerOptions o;
    o.path = path;
    auto l = Open(o);
    l->Append(Alloc(l->first_allocation_id(), 0, 5, kT0));
    ASSERT_TRUE(l->Flush().ok());
    EXPECT_EQ(mode(path), 0600);
    EXPECT_EQ(mode(path + "-wal"), 0600);
    EXPECT_EQ(mode(path + "-shm"), 0600);
    EXPECT_EQ(mode(path + "-lock"), 0600);
  }
  for (const char* suffix : {"", "-lock"}) chmod((path + suffix).c_str(), 0644);
  {
    LedgerOptions o;
    o.path = path;
    auto l = Open(o);
    l->Append(Alloc(l->first_allocation_id(), 0, 5, kT0));
    ASSERT_TRUE(l->Flush().ok());
    for (const char* suffix : {"", "-wal", "-shm", "-lock"}) {
      EXPECT_EQ(mode(path + suffix), 0600) << suffix;
    }
  }
  umask(old);
}

}  // namespace
}  // namespace ledger
}  // namespace gpumem
