// The ledger's compact storage (server/ledger/ledger_store.h): an
// allocation made and ended in one commit is one element of a pair_rows
// row, and what comes back is exactly what went in. Checked against a
// simple model (the list of events as appended) over random commits:
// Query (every filter, pages by after_seq, newest first, limits) and the
// `events` view give back every event with its own seq and fields; usage
// is the fold of the events; a restart continues seqs above a pair's end.
// Also: a ledger of the earlier format (an `events` table) is migrated at
// Open, and damaged pair rows are errors naming the file.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/ledger/ledger_store.h"
#include "server/ledger/usage_account.h"

namespace gpumem {
namespace ledger {
namespace {

constexpr int64_t kSec = 1'000'000'000;
constexpr int64_t kT0 = 1'700'000'000 * kSec;

std::string TempDir() {
  char tmpl[] = "/tmp/ledger-pairs-XXXXXX";
  return mkdtemp(tmpl);
}

std::string Describe(const LedgerEvent& e) {
  return absl::StrCat(e.seq, " ", e.time_ns, " ", KindName(e.kind), " ", e.tenant, " ", e.uid,
                      " ", e.pid, " ", e.session, " ", e.device, " ", e.bytes, " ",
                      e.allocation_id, " '", e.detail, "'");
}

std::vector<std::string> Describe(const std::vector<LedgerEvent>& events) {
  std::vector<std::string> out;
  for (const LedgerEvent& e : events) out.push_back(Describe(e));
  return out;
}

// Rows of one SQL query, each row's columns joined by spaces.
std::vector<std::string> Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  std::vector<std::string> rows;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) {
    rows.push_back(absl::StrCat("error: ", sqlite3_errmsg(db)));
  } else {
    while (sqlite3_step(s) == SQLITE_ROW) {
      std::string row;
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        const unsigned char* t = sqlite3_column_text(s, c);
        absl::StrAppend(&row, c ? " " : "", t ? reinterpret_cast<const char*>(t) : "NULL");
      }
      rows.push_back(row);
    }
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return rows;
}

void Exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
  sqlite3_close(db);
}

// Appends random events as the broker would and commits them in batches,
// keeping the model: every event in seq order, and the usage fold.
class Writer {
 public:
  Writer(LedgerStore* store, uint64_t seed) : store_(store), rng_(seed) {
    next_seq_ = store->recovery().next_seq;
    next_id_ = store->recovery().first_allocation_id;
    usage_ = store->recovery().usage;
    for (const LedgerEvent& e : store->recovery().restart_events) model_.push_back(e);
  }

  // One commit of about `n` events: allocations (some ended in the same
  // batch, right away or up to 2,000 events later), ends of allocations
  // from earlier batches, and records (QUOTA_SET).
  void Batch(int n) {
    std::vector<LedgerEvent> batch;
    std::vector<std::pair<size_t, LedgerEvent>> due;  // (index to end at, end)
    for (int i = 0; i < n || !due.empty(); ++i) {
      for (size_t d = 0; d < due.size();) {
        if (due[d].first <= batch.size()) {
          Add(&batch, due[d].second);
          due.erase(due.begin() + d);
        } else {
          ++d;
        }
      }
      if (i >= n) {
        if (!due.empty()) Add(&batch, due.front().second), due.erase(due.begin());
        continue;
      }
      const int what = Pick(100);
      if (what < 60) {
        LedgerEvent a;
        a.kind = EventKind::kAllocate;
        a.tenant = kTenants[Pick(3)];
        a.uid = 1000 + Pick(2);
        a.pid = 100 + Pick(3);
        a.session = 1 + Pick(4);
        a.device = Pick(4);
        a.bytes = uint64_t{4096} << Pick(12);
        a.allocation_id = next_id_++;
        Add(&batch, a);
        LedgerEvent end = a;
        const int how = Pick(10);
        end.kind = how < 6 ? EventKind::kFree : how < 8 ? EventKind::kSessionEnd
                                                        : EventKind::kDaemonStop;
        if (Pick(10) == 0) end.detail = "the owner ended";  // never a pair
        const int when = Pick(20);
        if (when < 12) {
          due.push_back({batch.size() + Pick(8), end});  // soon: a pair
        } else if (when < 13) {
          due.push_back({batch.size() + 900 + Pick(1200), end});  // maybe past kFoldSpan
        } else {
          live_.push_back(end);  // ended in a later batch
        }
      } else if (what < 85 && !live_.empty()) {
        const size_t k = Pick(static_cast<int>(live_.size()));
        LedgerEvent end = live_[k];
        live_.erase(live_.begin() + k);
        Add(&batch, end);
      } else {
        LedgerEvent q;
        q.kind = EventKind::kQuotaSet;
        q.tenant = kTenants[Pick(3)];
        q.bytes = uint64_t{1} << 30;
        q.detail = "total_bytes 1.00 GiB";
        Add(&batch, q);
      }
    }
    std::vector<UsageAccount::Key> changed;
    for (const auto& [key, row] : usage_.rows()) changed.push_back(key);
    ASSERT_TRUE(store_->Commit(batch, usage_, changed, {}, next_id_).ok());
    model_.insert(model_.end(), batch.begin(), batch.end());
  }

  const std::vector<LedgerEvent>& model() const { return model_; }
  const UsageAccount& usage() const { return usage_; }

 private:
  static constexpr const char* kTenants[] = {"ml", "inference", "a-tenant-with-a-long-name"};

  int Pick(int n) { return static_cast<int>(rng_() % static_cast<unsigned>(n)); }

  void Add(std::vector<LedgerEvent>* batch, LedgerEvent e) {
    e.seq = next_seq_++;
    clock_ += 1 + Pick(3) * 1000;
    e.time_ns = clock_;
    usage_.Apply(e);
    batch->push_back(std::move(e));
  }

  LedgerStore* store_;
  std::mt19937_64 rng_;
  uint64_t next_seq_ = 1, next_id_ = 1;
  int64_t clock_ = kT0;
  UsageAccount usage_;
  std::vector<LedgerEvent> model_;
  std::vector<LedgerEvent> live_;
};

std::vector<LedgerEvent> Model(const std::vector<LedgerEvent>& all, const EventQuery& q) {
  std::vector<LedgerEvent> out;
  for (const LedgerEvent& e : all) {
    if (e.seq <= q.after_seq) continue;
    if (!q.tenant.empty() && e.tenant != q.tenant) continue;
    if (q.since_ns > 0 && e.time_ns < q.since_ns) continue;
    if (q.until_ns > 0 && e.time_ns >= q.until_ns) continue;
    out.push_back(e);
  }
  if (q.newest && out.size() > q.limit) out.erase(out.begin(), out.end() - q.limit);
  if (!q.newest && out.size() > q.limit) out.resize(q.limit);
  return out;
}

TEST(LedgerPairsTest, QueryAndViewGiveBackEveryEventExactly) {
  const std::string path = TempDir() + "/ledger.db";
  auto store = LedgerStore::Open(path, kT0);
  ASSERT_TRUE(store.ok()) << store.status();
  Writer w(store->get(), 26);
  for (int b = 0; b < 12; ++b) w.Batch(b % 3 == 0 ? 2500 : 600);
  const std::vector<LedgerEvent>& all = w.model();
  ASSERT_GT(all.size(), 8000u);

  // Most of it is pairs; the rest rows of their own.
  const int64_t pair_rows = std::stoll(Sql(path, "SELECT COUNT(*) FROM pair_rows")[0]);
  const int64_t singles = std::stoll(Sql(path, "SELECT COUNT(*) FROM event_rows")[0]);
  const int64_t paired =
      std::stoll(Sql(path, "SELECT SUM(json_array_length(pairs)) FROM pair_rows")[0]);
  EXPECT_GT(pair_rows, 0);
  EXPECT_GT(paired * 2, static_cast<int64_t>(all.size()) / 2);
  EXPECT_EQ(singles + 2 * paired, static_cast<int64_t>(all.size()));
  // Ends with a detail and pairs wider than kFoldSpan stayed rows.
  EXPECT_GT(std::stoll(Sql(path, "SELECT COUNT(*) FROM event_rows WHERE detail = "
                                 "'the owner ended'")[0]),
            0);

  // Everything, oldest first, in one query and in pages.
  EventQuery q;
  q.limit = 1000000;
  auto got = (*store)->Query(q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Describe(*got), Describe(all));
  std::vector<LedgerEvent> paged;
  EventQuery page;
  page.limit = 37;
  for (;;) {
    auto p = (*store)->Query(page);
    ASSERT_TRUE(p.ok());
    if (p->empty()) break;
    paged.insert(paged.end(), p->begin(), p->end());
    page.after_seq = p->back().seq;
  }
  EXPECT_EQ(Describe(paged), Describe(all));

  // Random filters against the model.
  std::mt19937_64 rng(7);
  const int64_t t_end = all.back().time_ns;
  for (int i = 0; i < 120; ++i) {
    EventQuery r;
    r.limit = 1 + rng() % (i % 2 ? 50 : 3000);
    r.newest = rng() % 2;
    if (rng() % 2) r.after_seq = rng() % (all.back().seq + 2);
    if (rng() % 3 == 0) r.tenant = rng() % 2 ? "ml" : "a-tenant-with-a-long-name";
    if (rng() % 3 == 0) r.since_ns = kT0 + static_cast<int64_t>(rng() % (t_end - kT0));
    if (rng() % 3 == 0) r.until_ns = kT0 + static_cast<int64_t>(rng() % (t_end - kT0 + 2));
    auto g = (*store)->Query(r);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_EQ(Describe(*g), Describe(Model(all, r)))
        << "limit " << r.limit << " newest " << r.newest << " after " << r.after_seq
        << " tenant " << r.tenant << " since " << r.since_ns << " until " << r.until_ns;
  }

  // The view SQL readers use is the same list.
  std::vector<std::string> want;
  for (const LedgerEvent& e : all) {
    want.push_back(absl::StrCat(e.seq, " ", e.time_ns, " ", KindName(e.kind), " ", e.tenant, " ",
                                e.uid, " ", e.pid, " ", e.session, " ", e.device, " ", e.bytes,
                                " ", e.allocation_id, " ", e.detail));
    while (!want.back().empty() && want.back().back() == ' ') want.back().pop_back();
  }
  std::vector<std::string> view = Sql(path, "SELECT seq, time_ns, kind, tenant, uid, pid, "
                                            "session, device, bytes, allocation_id, detail "
                                            "FROM events ORDER BY seq");
  for (std::string& row : view) {
    while (!row.empty() && row.back() == ' ') row.pop_back();
  }
  EXPECT_EQ(view, want);

  // Usage folded from the events read back is the stored usage.
  UsageAccount replay;
  for (const LedgerEvent& e : *got) replay.Apply(e);
  for (const auto& [key, row] : w.usage().rows()) {
    const UsageRow& r = replay.rows().at(key);
    EXPECT_EQ(r.current_bytes, row.current_bytes) << key.first << " " << key.second;
    EXPECT_EQ(r.peak_bytes, row.peak_bytes);
    EXPECT_DOUBLE_EQ(r.byte_seconds, row.byte_seconds);
  }
}

TEST(LedgerPairsTest, RestartContinuesAboveAPairsEnd) {
  const std::string path = TempDir() + "/ledger.db";
  uint64_t last = 0;
  {
    auto store = LedgerStore::Open(path, kT0);
    ASSERT_TRUE(store.ok());
    LedgerEvent a;
    a.seq = 1;
    a.time_ns = kT0;
    a.kind = EventKind::kAllocate;
    a.tenant = "ml";
    a.device = 0;
    a.bytes = 4096;
    a.allocation_id = (*store)->recovery().first_allocation_id;
    LedgerEvent f = a;
    f.seq = 2;
    f.time_ns = kT0 + 5;
    f.kind = EventKind::kFree;
    UsageAccount u;
    u.Apply(a);
    u.Apply(f);
    ASSERT_TRUE((*store)->Commit({a, f}, u, {{"ml", 0}}, {}, a.allocation_id).ok());
    last = f.seq;
    EXPECT_EQ(Sql(path, "SELECT COUNT(*) FROM event_rows")[0], "0");  // only the pair
  }
  auto again = LedgerStore::Open(path, kT0 + kSec);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->recovery().next_seq, last + 1);
  EXPECT_GT((*again)->recovery().first_allocation_id, 1u);
  EXPECT_TRUE((*again)->recovery().restart_events.empty());
}

TEST(LedgerPairsTest, EarlierFormatIsMigratedAtOpen) {
  const std::string path = TempDir() + "/ledger.db";
  // The format before pairs: every event a row of the `events` table; one
  // allocation still live when its daemon died.
  Exec(path, R"sql(
    CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
    CREATE TABLE events(seq INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL, kind TEXT NOT NULL,
      tenant TEXT NOT NULL, uid INTEGER NOT NULL, pid INTEGER NOT NULL,
      session INTEGER NOT NULL, device INTEGER NOT NULL, bytes INTEGER NOT NULL,
      allocation_id INTEGER NOT NULL, detail TEXT NOT NULL);
    CREATE INDEX events_by_tenant ON events(tenant, seq);
    CREATE TABLE live(allocation_id INTEGER PRIMARY KEY, tenant TEXT NOT NULL,
      uid INTEGER NOT NULL, pid INTEGER NOT NULL, session INTEGER NOT NULL,
      device INTEGER NOT NULL, bytes INTEGER NOT NULL, time_ns INTEGER NOT NULL);
    CREATE TABLE usage(tenant TEXT NOT NULL, device INTEGER NOT NULL,
      current_bytes INTEGER NOT NULL, peak_bytes INTEGER NOT NULL,
      byte_seconds REAL NOT NULL, updated_ns INTEGER NOT NULL, PRIMARY KEY(tenant, device));
    INSERT INTO meta VALUES('allocation_id_reserved', 1048577);
    INSERT INTO events VALUES(1, 1700000000000000000, 'ALLOCATE', 'ml', 1000, 42, 7, 0, 4096, 5, '');
    INSERT INTO events VALUES(2, 1700000001000000000, 'FREE', 'ml', 1000, 42, 7, 0, 4096, 5, '');
    INSERT INTO events VALUES(3, 1700000002000000000, 'ALLOCATE', 'ml', 1000, 42, 7, 1, 8192, 6, '');
    INSERT INTO live VALUES(6, 'ml', 1000, 42, 7, 1, 8192, 1700000002000000000);
    INSERT INTO usage VALUES('ml', 1, 8192, 8192, 0, 1700000002000000000);
    INSERT INTO usage VALUES('ml', -1, 8192, 8192, 4096, 1700000002000000000);
  )sql");
  {
    auto store = LedgerStore::Open(path, kT0 + 10 * kSec);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->recovery().next_seq, 5u);  // 4: the DAEMON_RESTART of id 6
    EXPECT_EQ((*store)->recovery().first_allocation_id, 1048578u);
    EventQuery q;
    auto got = (*store)->Query(q);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 4u);
    EXPECT_EQ((*got)[1].kind, EventKind::kFree);
    EXPECT_EQ((*got)[3].kind, EventKind::kDaemonRestart);
    EXPECT_EQ((*got)[3].allocation_id, 6u);
  }
  EXPECT_EQ(Sql(path, "SELECT type FROM sqlite_master WHERE name = 'events'")[0], "view");
  EXPECT_EQ(Sql(path, "SELECT COUNT(*) FROM event_rows")[0], "4");
  EXPECT_EQ(Sql(path, "SELECT kind FROM events ORDER BY seq"),
            (std::vector<std::string>{"ALLOCATE", "FREE", "ALLOCATE", "DAEMON_RESTART"}));
  auto again = LedgerStore::Open(path, kT0 + 20 * kSec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->recovery().next_seq, 5u);
}

TEST(LedgerPairsTest, DamagedPairRowsAreErrorsNamingTheFile) {
  const std::string dir = TempDir();
  auto make = [&](const std::string& name) {
    const std::string path = dir + "/" + name;
    auto store = LedgerStore::Open(path, kT0);
    EXPECT_TRUE(store.ok());
    return path;
  };
  // A row whose seqs are out of their bounds: refused at Open.
  const std::string wide = make("wide.db");
  Exec(wide, absl::StrCat("INSERT INTO pair_rows VALUES(10, ", 10 + LedgerStore::kFoldSpan + 1,
                          ", 'ml', 1, '[]')"));
  auto w = LedgerStore::Open(wide, kT0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(wide), std::string::npos) << w.status();
  EXPECT_NE(w.status().message().find("damaged"), std::string::npos) << w.status();

  // Pairs that are not JSON, or not this ledger's: Query says so.
  int n = 0;
  for (const char* pairs : {"'not json'", "'[[12,1,11,2,\"FREE\",0,0,0,0,1,1]]'",
                            "'[[10,1,11,2,\"ALLOCATE\",0,0,0,0,1,1]]'", "'[[10,1,11]]'"}) {
    const std::string path = make(absl::StrCat("bad", ++n, ".db"));
    Exec(path, absl::StrCat("INSERT INTO pair_rows VALUES(10, 11, 'ml', 1, ", pairs, ")"));
    auto store = LedgerStore::Open(path, kT0);
    ASSERT_TRUE(store.ok()) << store.status();
    EventQuery q;
    auto got = (*store)->Query(q);
    ASSERT_FALSE(got.ok()) << pairs;
    EXPECT_NE(got.status().message().find(path), std::string::npos) << got.status();
    store->reset();
  }
}

}  // namespace
}  // namespace ledger
}  // namespace gpumem
