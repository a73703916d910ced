// The ledger at line rate and under bad conditions: replaying its events
// after a run at full rate gives exactly the usage it keeps; a full disk, the
// file removed or replaced under it, a reader holding a read transaction
// open, and a tenant churning tiny allocations leave it serving (Append
// never fails or waits), keep the accounting it promises, and say what
// happened (Flush's error, stats()).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/ledger/tenant_ledger.h"
#include "server/ledger/usage_account.h"
#include "tests/ledger/ledger_test_events.h"

namespace gpumem {
namespace ledger {
namespace {

// An event of `kind` as ledger_test_events.h's Alloc makes it (uid 1000,
// pid 42, session 7, time 0: the ledger stamps it).
LedgerEvent Event(EventKind kind, uint64_t id, const std::string& tenant, int32_t device,
                  uint64_t bytes) {
  LedgerEvent e = Alloc(id, device, bytes, 0, tenant);
  e.kind = kind;
  return e;
}

std::unique_ptr<TenantLedger> OpenOrDie(LedgerOptions o) {
  auto l = TenantLedger::Open(o);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

// Every event of the ledger, oldest first, read through Query in pages.
std::vector<LedgerEvent> AllEvents(const TenantLedger& l) {
  std::vector<LedgerEvent> all;
  EventQuery q;
  q.limit = 50000;
  for (;;) {
    auto page = l.Query(q);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok() || page->empty()) return all;
    q.after_seq = page->back().seq;
    all.insert(all.end(), page->begin(), page->end());
  }
}

// The usage table of the file, as stored.
std::map<UsageAccount::Key, UsageRow> StoredUsage(const std::string& path) {
  std::map<UsageAccount::Key, UsageRow> rows;
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "SELECT tenant, device, current_bytes, peak_bytes, byte_seconds, "
                     "updated_ns FROM usage", -1, &s, nullptr);
  while (sqlite3_step(s) == SQLITE_ROW) {
    UsageRow r;
    r.current_bytes = sqlite3_column_int64(s, 2);
    r.peak_bytes = sqlite3_column_int64(s, 3);
    r.byte_seconds = sqlite3_column_double(s, 4);
    r.updated_ns = sqlite3_column_int64(s, 5);
    rows[{reinterpret_cast<const char*>(sqlite3_column_text(s, 0)), sqlite3_column_int(s, 1)}] =
        r;
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return rows;
}

void ExpectSameUsage(const std::map<UsageAccount::Key, UsageRow>& want,
                     const std::map<UsageAccount::Key, UsageRow>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [key, w] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key.first << "/" << key.second;
    EXPECT_EQ(it->second.current_bytes, w.current_bytes) << key.first << "/" << key.second;
    EXPECT_EQ(it->second.peak_bytes, w.peak_bytes) << key.first << "/" << key.second;
    // Exactly: the same events folded in the same order.
    EXPECT_EQ(it->second.byte_seconds, w.byte_seconds) << key.first << "/" << key.second;
    EXPECT_EQ(it->second.updated_ns, w.updated_ns) << key.first << "/" << key.second;
  }
}

int64_t RssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

TEST(LedgerStressTest, ReplayAfterAFullRateRunEqualsTheUsageExactly) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  auto l = OpenOrDie(o);
  ASSERT_NE(l, nullptr);
  // Four producers as the broker's threads would be: each holds up to 8
  // allocations of its tenant at once, on four devices, for 2 s.
  std::atomic<uint64_t> next_id{l->first_allocation_id()};
  const absl::Time end = absl::Now() + absl::Seconds(2);
  std::vector<std::thread> producers;
  for (int t = 0; t < 4; ++t) {
    producers.emplace_back([&, t] {
      const std::string tenant = absl::StrCat("tenant-", t % 3);
      std::vector<LedgerEvent> live;
      for (uint64_t i = 0; absl::Now() < end; ++i) {
        if (live.size() < 8 && (i % 3 != 0 || live.empty())) {
          LedgerEvent a = Event(EventKind::kAllocate, next_id++, tenant,
                                static_cast<int32_t>(i % 4), (i % 7 + 1) << 12);
          l->Append(a);
          live.push_back(a);
        } else {
          LedgerEvent f = live[i % live.size()];
          live.erase(live.begin() + static_cast<long>(i % live.size()));
          f.kind = i % 5 == 0 ? EventKind::kSessionEnd : EventKind::kFree;
          f.time_ns = 0;
          l->Append(f);
        }
      }
    });
  }
  for (std::thread& p : producers) p.join();
  ASSERT_TRUE(l->Flush().ok());
  const std::vector<LedgerEvent> events = AllEvents(*l);
  EXPECT_GT(events.size(), 1000u);
  UsageAccount replayed;
  for (const LedgerEvent& e : events) replayed.Apply(e);
  ExpectSameUsage(replayed.rows(), l->Usage());
  l.reset();  // commits what is queued
  ExpectSameUsage(replayed.rows(), StoredUsage(path));
}

TEST(LedgerStressTest, FullDiskBeyondTheBoundDropsTheOldestButKeepsUsageExact) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  o.max_held = 500;
  auto l = OpenOrDie(o);
  ASSERT_TRUE(l->Flush().ok());
  l->SetMaxPageCountForTest(1);  // every page is over the limit: "disk full"
  for (uint64_t i = 0; i < 2000; ++i) {
    l->Append(Event(EventKind::kAllocate, l->first_allocation_id() + i, "ml", 0, 10));
  }
  absl::Status flushed = l->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_NE(flushed.message().find(path), std::string::npos) << flushed;
  // Each Flush returns at the next failed commit; the writer may take the
  // queue in more than one piece.
  for (int i = 0; i < 200 && l->stats().dropped_events < 1500; ++i) l->Flush().IgnoreError();
  WriterStats st = l->stats();
  EXPECT_TRUE(st.failing);
  // The failing commit's error, as Flush gave it: the file and SQLite's word.
  EXPECT_NE(st.last_error.find(path), std::string::npos) << st.last_error;
  EXPECT_NE(st.last_error.find("database or disk is full"), std::string::npos) << st.last_error;
  EXPECT_EQ(st.held_events, 500u);
  EXPECT_EQ(st.dropped_events, 1500u);
  // Usage is folded from every event, the dropped ones too.
  EXPECT_EQ(l->Usage().at({"ml", 0}).current_bytes, 20000u);
  l->SetMaxPageCountForTest(1 << 30);
  absl::Status written = l->Flush();
  for (int i = 0; i < 100 && !written.ok(); ++i) written = l->Flush();
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(l->Flush().ok());
  const std::vector<LedgerEvent> events = AllEvents(*l);
  ASSERT_EQ(events.size(), 501u);
  EXPECT_EQ(events.back().kind, EventKind::kLedgerGap);
  EXPECT_EQ(events.back().bytes, 1500u);
  EXPECT_NE(events.back().detail.find("1500 events dropped"), std::string::npos)
      << events.back().detail;
  EXPECT_FALSE(l->stats().failing);
  EXPECT_EQ(l->stats().last_error, "");
  EXPECT_EQ(l->stats().held_events, 0u);
  l.reset();
  EXPECT_EQ(StoredUsage(path).at({"ml", 0}).current_bytes, 20000u);
}

TEST(LedgerStressTest, FileRemovedUnderTheLedgerIsNamedAndNothingIsLost) {
  const std::string dir = TempDir();
  const std::string path = dir + "/ledger.db";
  const std::string keep = dir + "/kept.db";
  LedgerOptions o;
  o.path = path;
  auto l = OpenOrDie(o);
  const uint64_t id = l->first_allocation_id();
  l->Append(Event(EventKind::kAllocate, id, "ml", 0, 10));
  ASSERT_TRUE(l->Flush().ok());
  ASSERT_EQ(link(path.c_str(), keep.c_str()), 0);
  ASSERT_EQ(unlink(path.c_str()), 0);
  l->Append(Event(EventKind::kAllocate, id + 1, "ml", 0, 20));
  absl::Status flushed = l->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_NE(flushed.message().find("was removed while gpumemd ran"), std::string::npos)
      << flushed;
  EXPECT_NE(flushed.message().find(path), std::string::npos) << flushed;
  EXPECT_TRUE(l->stats().failing);
  EXPECT_NE(l->stats().last_error.find("was removed while gpumemd ran"), std::string::npos)
      << l->stats().last_error;
  EXPECT_EQ(l->Usage().at({"ml", 0}).current_bytes, 30u);
  // Another file at the path is not the ledger's: still refused.
  { std::ofstream(path) << "not a ledger"; }
  l->Append(Event(EventKind::kFree, id, "ml", 0, 10));
  // (The first Flush may see a commit that began before the new file.)
  flushed = l->Flush();
  for (int i = 0; i < 20 && flushed.message().find("replaced") == std::string::npos; ++i) {
    flushed = l->Flush();
  }
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_NE(flushed.message().find("was replaced by another file"), std::string::npos)
      << flushed;
  // Its own file back at the path: everything held is written, and the gap.
  ASSERT_EQ(rename(keep.c_str(), path.c_str()), 0);
  absl::Status written = l->Flush();
  for (int i = 0; i < 100 && !written.ok(); ++i) written = l->Flush();
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_TRUE(l->Flush().ok());
  const std::vector<LedgerEvent> events = AllEvents(*l);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1].allocation_id, id + 1);
  EXPECT_EQ(events[2].kind, EventKind::kFree);
  EXPECT_EQ(events[3].kind, EventKind::kLedgerGap);
  EXPECT_NE(events[3].detail.find("ledger writes failed from"), std::string::npos)
      << events[3].detail;
  EXPECT_NE(events[3].detail.find("0 events dropped"), std::string::npos) << events[3].detail;
  EXPECT_FALSE(l->stats().failing);
  EXPECT_EQ(l->stats().last_error, "");
  // Failing commits are retried once per max_delay, not in a loop.
  EXPECT_LT(l->stats().failed_commits, 200u);
}

TEST(LedgerStressTest, LongReadTransactionStarvesCheckpointsNotCommits) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  o.checkpoint_pages = 20;
  o.wal_warn_pages = 100;
  auto l = OpenOrDie(o);
  uint64_t id = l->first_allocation_id();
  auto burst = [&](int n) {
    for (int i = 0; i < n; ++i) {
      l->Append(Event(EventKind::kAllocate, id, "ml", i % 4, 4096));
      l->Append(Event(EventKind::kFree, id++, "ml", i % 4, 4096));
    }
    return l->Flush();
  };
  ASSERT_TRUE(burst(100).ok());
  // As `sqlite3 ledger.db` with BEGIN; SELECT ...; left open.
  sqlite3* reader = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &reader, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(reader, "BEGIN; SELECT count(*) FROM events;", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  const WriterStats before = l->stats();
  testing::internal::CaptureStderr();
  for (int round = 0; round < 20; ++round) ASSERT_TRUE(burst(500).ok());
  const std::string said = testing::internal::GetCapturedStderr();
  const WriterStats during = l->stats();
  // Said once (once a minute at most), naming the file and the cause.
  EXPECT_NE(said.find("gpumemd: ledger " + path + ": its WAL holds"), std::string::npos) << said;
  EXPECT_NE(said.find("a reader keeps a read transaction open"), std::string::npos) << said;
  EXPECT_EQ(said.find("its WAL holds"), said.rfind("its WAL holds")) << said;
  EXPECT_EQ(during.committed_events - before.committed_events, 20u * 1000);
  EXPECT_GT(during.blocked_checkpoints, before.blocked_checkpoints);
  EXPECT_GT(during.wal_pages, o.checkpoint_pages);
  ASSERT_EQ(sqlite3_exec(reader, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(reader);
  // With the reader gone a checkpoint copies the whole WAL and it starts
  // over: it is short again.
  for (int i = 0; i < 10 && l->stats().wal_pages >= o.checkpoint_pages; ++i) {
    ASSERT_TRUE(burst(100).ok());
  }
  const WriterStats after = l->stats();
  EXPECT_GT(after.checkpoints, during.checkpoints);
  EXPECT_LT(after.wal_pages, o.checkpoint_pages);
  EXPECT_EQ(l->Usage().at({"ml", UsageAccount::kAllDevices}).current_bytes, 0u);
}

TEST(LedgerStressTest, ChurnOfTinyAllocationsKeepsMemoryBounded) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  auto l = OpenOrDie(o);
  uint64_t id = l->first_allocation_id();
  // One tenant allocating and freeing 1 byte as fast as the writer takes
  // it (a Flush per 10,000 pairs): half a million events.
  auto churn = [&](int pairs) {
    for (int i = 0; i < pairs; ++i) {
      l->Append(Event(EventKind::kAllocate, id, "churn", 0, 1));
      l->Append(Event(EventKind::kFree, id++, "churn", 0, 1));
      if (i % 10000 == 9999) ASSERT_TRUE(l->Flush().ok());
    }
    ASSERT_TRUE(l->Flush().ok());
  };
  churn(50000);
  const int64_t rss_warm = RssKiB();
  churn(200000);
  const int64_t rss_end = RssKiB();
  const UsageRow row = l->Usage().at({"churn", 0});
  EXPECT_EQ(row.current_bytes, 0u);
  EXPECT_EQ(row.peak_bytes, 1u);
  const WriterStats st = l->stats();
  EXPECT_EQ(st.committed_events, 2u * 250000);
  EXPECT_EQ(st.dropped_events, 0u);
  EXPECT_EQ(st.held_events, 0u);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // Nothing per allocation stays in memory once committed: 400,000 more
  // events after the warm-up leave the process about where it was (the
  // sanitizers' quarantine and shadow memory would not).
  EXPECT_LT(rss_end - rss_warm, 32 * 1024) << rss_warm << " KiB -> " << rss_end << " KiB";
#else
  (void)rss_warm;
  (void)rss_end;
#endif
  l.reset();
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "SELECT count(*) FROM live", -1, &s, nullptr);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), 0);
  sqlite3_finalize(s);
  // Every event is there to read, each pair stored as one compact element:
  // the file holds well under the ~75 bytes an event took as a row of its
  // own (the WAL was checkpointed into it at close).
  sqlite3_prepare_v2(db, "SELECT count(*), count(DISTINCT seq), "
                     "sum(kind = 'ALLOCATE') FROM events", -1, &s, nullptr);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(s, 0), 500000);
  EXPECT_EQ(sqlite3_column_int64(s, 1), 500000);
  EXPECT_EQ(sqlite3_column_int64(s, 2), 250000);
  sqlite3_finalize(s);
  sqlite3_close(db);
  struct stat file;
  ASSERT_EQ(stat(path.c_str(), &file), 0);
  EXPECT_LT(file.st_size, 500000 * 50) << file.st_size / 500000.0 << " bytes per event";
}

}  // namespace
}  // namespace ledger
}  // namespace gpumem
