// TenantLedger and its SQLite store: events and usage survive a reopen,
// allocations left live are closed by DAEMON_RESTART, ids never repeat, bad
// files are start-up errors naming the path, and a full disk leaves a gap
// event once writing works again.
#include "server/ledger/tenant_ledger.h"
#include "tests/ledger/ledger_test_events.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace ledger {
namespace {

std::unique_ptr<TenantLedger> OpenOrDie(const std::string& path, int64_t pages = 0) {
  LedgerOptions o;
  o.path = path;
  o.max_page_count = pages;
  auto l = TenantLedger::Open(o);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

std::string IntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, nullptr);
  std::string out;
  if (sqlite3_step(s) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

// Rows of the store's `live` table (what a restart would close).
int LiveRows(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "SELECT count(*) FROM live", -1, &s, nullptr);
  int n = -1;
  if (sqlite3_step(s) == SQLITE_ROW) n = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return n;
}

constexpr int64_t kSec = 1'000'000'000;
constexpr int64_t kT0 = 1'700'000'000 * kSec;

TEST(TenantLedgerTest, EventsUsageAndRestart) {
  const std::string path = TempDir() + "/ledger.db";
  uint64_t first_id;
  {
    auto l = OpenOrDie(path);
    first_id = l->first_allocation_id();
    EXPECT_EQ(first_id, 1u);
    LedgerEvent a = Alloc(first_id, 0, 100, kT0);
    LedgerEvent b = Alloc(first_id + 1, 1, 50, kT0 + kSec);
    l->Append(a);
    l->Append(b);
    l->Append(Free(a, kT0 + 2 * kSec));
    ASSERT_TRUE(l->Flush().ok());
    auto events = l->Query({});
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), 3u);
    EXPECT_EQ((*events)[2].kind, EventKind::kFree);
    EXPECT_EQ((*events)[2].seq, 3u);
    auto usage = l->Usage();
    const UsageRow& dev0 = usage.at({"ml", 0});
    EXPECT_EQ(dev0.current_bytes, 0u);
    EXPECT_EQ(dev0.peak_bytes, 100u);
    EXPECT_DOUBLE_EQ(dev0.byte_seconds, 200.0);  // 100 bytes for 2 s
    const UsageRow& all = usage.at({"ml", UsageAccount::kAllDevices});
    EXPECT_EQ(all.peak_bytes, 150u);
    EXPECT_EQ(all.current_bytes, 50u);
    EXPECT_EQ(LiveRows(path), 1);  // a was made and freed in one batch
    // Dropped without DAEMON_STOP events: as after a crash, b is still live.
  }
  EXPECT_EQ(IntegrityCheck(path), "ok");
  auto l = OpenOrDie(path);
  EXPECT_EQ(l->restart_event_count(), 1u);
  EXPECT_GT(l->first_allocation_id(), first_id + 1);
  auto events = l->Query({});
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 4u);
  EXPECT_EQ(events->back().kind, EventKind::kDaemonRestart);
  EXPECT_EQ(events->back().allocation_id, first_id + 1);
  EXPECT_EQ(events->back().bytes, 50u);
  auto usage = l->Usage();
  EXPECT_EQ(usage.at({"ml", 1}).current_bytes, 0u);
  EXPECT_EQ(usage.at({"ml", UsageAccount::kAllDevices}).current_bytes, 0u);
  EXPECT_EQ(usage.at({"ml", UsageAccount::kAllDevices}).peak_bytes, 150u);
  // A third open: nothing left to close, ids move on again.
  const uint64_t second_first = l->first_allocation_id();
  l.reset();
  auto l3 = OpenOrDie(path);
  EXPECT_EQ(l3->restart_event_count(), 0u);
  EXPECT_GT(l3->first_allocation_id(), second_first);
  // Made in one batch, freed in the next: the row comes and goes.
  LedgerEvent c = Alloc(l3->first_allocation_id(), 0, 10, kT0 + 9 * kSec);
  l3->Append(c);
  ASSERT_TRUE(l3->Flush().ok());
  EXPECT_EQ(LiveRows(path), 1);
  l3->Append(Free(c, kT0 + 10 * kSec));
  ASSERT_TRUE(l3->Flush().ok());
  EXPECT_EQ(LiveRows(path), 0);
}

TEST(TenantLedgerTest, QueryFiltersAndPages) {
  const std::string path = TempDir() + "/ledger.db";
  auto l = OpenOrDie(path);
  for (int i = 0; i < 10; ++i) {
    l->Append(Alloc(i + 1, 0, 10, kT0 + i * kSec, i % 2 ? "a" : "b"));
  }
  ASSERT_TRUE(l->Flush().ok());
  EventQuery q;
  q.tenant = "a";
  q.limit = 2;
  auto page = l->Query(q);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].allocation_id, 2u);
  q.after_seq = page->back().seq;
  page = l->Query(q);
  EXPECT_EQ((*page)[0].allocation_id, 6u);
  EventQuery newest;
  newest.limit = 3;
  newest.newest = true;
  page = l->Query(newest);
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].allocation_id, 8u);
  EXPECT_EQ((*page)[2].allocation_id, 10u);
  EventQuery since;
  since.since_ns = kT0 + 8 * kSec;
  EXPECT_EQ(l->Query(since)->size(), 2u);
}

TEST(TenantLedgerTest, OneLedgerOneOwner) {
  const std::string path = TempDir() + "/ledger.db";
  auto first = OpenOrDie(path);
  LedgerOptions o;
  o.path = path;
  auto second = TenantLedger::Open(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(
                absl::StrCat("is in use by another gpumemd (pid ", getpid(), ")")),
            std::string::npos) << second.status();
  first.reset();
  EXPECT_TRUE(TenantLedger::Open(o).ok());
}

TEST(TenantLedgerTest, CorruptFileIsAnErrorNamingPathAndSqlite) {
  const std::string path = TempDir() + "/ledger.db";
  std::ofstream(path) << std::string(8192, 'x');
  LedgerOptions o;
  o.path = path;
  auto l = TenantLedger::Open(o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find(path), std::string::npos) << l.status();
  EXPECT_NE(l.status().message().find("not a database"), std::string::npos) << l.status();
}

// A file whose pages are damaged past its header (found by the recovery
// fuzzer: recovery then saw some rows and not others) is refused at Open,
// naming the damage, rather than recovered and written into.
TEST(TenantLedgerTest, DamagedPagesAreAnErrorAtOpen) {
  const std::string path = TempDir() + "/ledger.db";
  {
    std::unique_ptr<TenantLedger> l = OpenOrDie(path);
    ASSERT_NE(l, nullptr);
    for (uint64_t i = 1; i <= 400; ++i) l->Append(Alloc(i, 0, 4096 * i, 1));
    ASSERT_TRUE(l->Flush().ok());
  }
  {
    // Scribbles over the headers of pages 3 to 6 (b-tree pages).
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::string junk(12, '\x7f');
    for (int page = 2; page < 6; ++page) {
      f.seekp(page * 4096);
      f.write(junk.data(), junk.size());
    }
  }
  LedgerOptions o;
  o.path = path;
  auto l = TenantLedger::Open(o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << l.status();
  EXPECT_NE(l.status().message().find(path + " is damaged"), std::string::npos) << l.status();
}

TEST(TenantLedgerTest, UnopenableFileIsAnError) {
  const std::string dir = TempDir();
  LedgerOptions o;
  o.path = dir;  // a directory
  auto l = TenantLedger::Open(o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find(dir), std::string::npos) << l.status();
  o.path = dir + "/missing/ledger.db";
  l = TenantLedger::Open(o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("unable to open"), std::string::npos) << l.status();
}

TEST(TenantLedgerTest, FullDiskKeepsEventsAndRecordsTheGap) {
  const std::string path = TempDir() + "/ledger.db";
  auto l = OpenOrDie(path);
  ASSERT_TRUE(l->Flush().ok());
  // Freeze the file at its current size: the next pages cannot be added.
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA page_count", -1, &s, nullptr);
  sqlite3_step(s);
  const int64_t pages = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  l->SetMaxPageCountForTest(pages);
  for (int i = 0; i < 3000; ++i) {
    l->Append(Alloc(i + 1, 0, 10, 0));
  }
  absl::Status flushed = l->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_NE(flushed.message().find("full"), std::string::npos) << flushed;
  EXPECT_GE(l->stats().failed_commits, 1u);
  l->SetMaxPageCountForTest(1 << 30);
  // The next commit writes everything held, then the gap event. (A Flush
  // may still see the failure of the commit that ended just before the
  // limit was raised: the writer counts it after letting go of the file.)
  absl::Status written = l->Flush();
  for (int i = 0; i < 100 && !written.ok(); ++i) written = l->Flush();
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(l->Flush().ok());
  EventQuery q;
  q.limit = 10000;
  auto events = l->Query(q);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3001u);
  EXPECT_EQ(events->back().kind, EventKind::kLedgerGap);
  EXPECT_NE(events->back().detail.find("0 events dropped"), std::string::npos)
      << events->back().detail;
  EXPECT_EQ(l->Usage().at({"ml", 0}).current_bytes, 30000u);
}

TEST(TenantLedgerTest, OffMeansNoFileButUsageIsFolded) {
  auto l = TenantLedger::Open({});
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE((*l)->enabled());
  (*l)->Append(Alloc(1, 0, 10, kT0));
  ASSERT_TRUE((*l)->Flush().ok());
  EXPECT_EQ((*l)->Usage().at({"ml", 0}).current_bytes, 10u);
  EXPECT_EQ((*l)->Query({}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ledger
}  // namespace gpumem
