// SQL lives here and only here. Statements the writer runs per event are
// prepared once and reused (a multi-row INSERT of 32 events was measured
// slower than the one-row statement: tests/bench/RESULTS.md); everything
// else is prepared per call.
#include "server/ledger/ledger_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpumem {
namespace ledger {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(
  key TEXT PRIMARY KEY,
  value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events(
  seq INTEGER PRIMARY KEY,
  time_ns INTEGER NOT NULL,
  kind TEXT NOT NULL,
  tenant TEXT NOT NULL,
  uid INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  session INTEGER NOT NULL,
  device INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  allocation_id INTEGER NOT NULL,
  detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_tenant ON events(tenant, seq);
CREATE TABLE IF NOT EXISTS live(
  allocation_id INTEGER PRIMARY KEY,
  tenant TEXT NOT NULL,
  uid INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  session INTEGER NOT NULL,
  device INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  time_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS usage(
  tenant TEXT NOT NULL,
  device INTEGER NOT NULL,
  current_bytes INTEGER NOT NULL,
  peak_bytes INTEGER NOT NULL,
  byte_seconds REAL NOT NULL,
  updated_ns INTEGER NOT NULL,
  PRIMARY KEY(tenant, device));
CREATE TABLE IF NOT EXISTS quotas(
  tenant TEXT PRIMARY KEY,
  total_bytes INTEGER,
  max_allocations INTEGER,
  source TEXT NOT NULL,
  set_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS quota_devices(
  tenant TEXT NOT NULL,
  device INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  PRIMARY KEY(tenant, device));
CREATE TABLE IF NOT EXISTS socket_tenants(
  name TEXT PRIMARY KEY,
  socket TEXT NOT NULL,
  priority INTEGER NOT NULL,
  total_bytes INTEGER,
  max_allocations INTEGER,
  source TEXT NOT NULL,
  set_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS socket_tenant_devices(
  tenant TEXT NOT NULL,
  device_uuid TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  PRIMARY KEY(tenant, device_uuid));
)sql";

// Finalizes a statement on every path.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

void BindText(sqlite3_stmt* s, int i, const std::string& text) {
  sqlite3_bind_text(s, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

std::string ColumnText(sqlite3_stmt* s, int i) {
  const unsigned char* t = sqlite3_column_text(s, i);
  return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
}

LedgerEvent EventFromRow(sqlite3_stmt* s) {
  LedgerEvent e;
  e.seq = sqlite3_column_int64(s, 0);
  e.time_ns = sqlite3_column_int64(s, 1);
  e.kind = KindFromName(ColumnText(s, 2)).value_or(EventKind::kLedgerGap);
  e.tenant = ColumnText(s, 3);
  e.uid = static_cast<uint32_t>(sqlite3_column_int64(s, 4));
  e.pid = sqlite3_column_int(s, 5);
  e.session = sqlite3_column_int64(s, 6);
  e.device = sqlite3_column_int(s, 7);
  e.bytes = sqlite3_column_int64(s, 8);
  e.allocation_id = sqlite3_column_int64(s, 9);
  e.detail = ColumnText(s, 10);
  return e;
}

// Events a commit writes between two sched_yield()s.
constexpr size_t kYieldEvery = 32;

// Keeps the WAL's page count where the writer can read it.
int WalHook(void* arg, sqlite3*, const char*, int pages) {
  static_cast<std::atomic<int>*>(arg)->store(pages, std::memory_order_relaxed);
  return SQLITE_OK;
}

constexpr const char* kEventColumns =
    "seq, time_ns, kind, tenant, uid, pid, session, device, bytes, allocation_id, detail";

}  // namespace

absl::Status LedgerStore::Error(const char* what) const {
  return absl::FailedPreconditionError(
      absl::StrCat("ledger ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status LedgerStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat("ledger ", path_, ": ", message ? message : sqlite3_errmsg(db_)));
    sqlite3_free(message);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LedgerStore>> LedgerStore::Open(const std::string& path,
                                                                int64_t now_ns,
                                                                int64_t max_page_count,
                                                                bool defer) {
  std::unique_ptr<LedgerStore> store(new LedgerStore(path));
  absl::Status s = store->Init(now_ns, max_page_count, defer);
  if (!s.ok()) return s;
  return store;
}

LedgerStore::~LedgerStore() {
  for (sqlite3_stmt* s : {insert_event_, insert_live_, delete_live_, upsert_usage_}) {
    sqlite3_finalize(s);
  }
  if (reader_ != nullptr) sqlite3_close(reader_);
  if (db_ != nullptr) sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

absl::Status LedgerStore::Init(int64_t now_ns, int64_t max_page_count, bool defer) {
  const std::string lock_path = path_ + "-lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, ": unable to open its lock file ", lock_path, ": ", strerror(errno)));
  }
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char owner[32] = {};
    const ssize_t n = pread(lock_fd_, owner, sizeof(owner) - 1, 0);
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, " is in use by another gpumemd (pid ",
        n > 0 ? std::string(owner, strcspn(owner, "\n")) : "unknown",
        "); one daemon per ledger file"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(lock_fd_, 0) != 0 ||
      pwrite(lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, ": cannot write its lock file ", lock_path, ": ", strerror(errno)));
  }
  if (sqlite3_open_v2(path_.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return Error("cannot open");
  }
  sqlite3_busy_timeout(db_, 5000);
  // journal_mode is the first statement that reads the file: a file that
  // is not a database fails here.
  absl::Status s = Exec("PRAGMA journal_mode=WAL");
  if (!s.ok()) return s;
  // In WAL mode NORMAL keeps every committed transaction across a crash of
  // the process (kill -9): a commit is a write() into the WAL, which the
  // kernel keeps whatever becomes of the process; only a power cut may lose
  // the last ones (fsync happens at checkpoints). See ledger_store.h.
  if (s = Exec("PRAGMA synchronous=NORMAL"); !s.ok()) return s;
  // Checkpoints are the owner's (Checkpoint), never a side effect of a
  // commit.
  if (s = Exec("PRAGMA wal_autocheckpoint=0"); !s.ok()) return s;
  sqlite3_wal_hook(db_, &WalHook, &wal_pages_);
  {
    struct stat st;
    if (stat(path_.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("ledger ", path_, ": cannot stat it: ", strerror(errno)));
    }
    file_dev_ = st.st_dev;
    file_ino_ = st.st_ino;
  }
  // A damaged file is refused before anything reads or writes its tables:
  // recovery on a b-tree with lost or misordered pages would see some rows
  // and not others (a MAX(seq) below rows a scan finds, live allocations
  // missed) and carry on writing into it.
  if (s = QuickCheck(); !s.ok()) return s;
  if (s = SchemaCheck(); !s.ok()) return s;
  if (max_page_count > 0) SetMaxPageCount(max_page_count);
  if (s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  if (s = Exec(kSchema); !s.ok()) { Exec("ROLLBACK").IgnoreError(); return s; }
  const char* kInsertEvent =
      "INSERT INTO events(seq, time_ns, kind, tenant, uid, pid, session, device, bytes, "
      "allocation_id, detail) VALUES(?,?,?,?,?,?,?,?,?,?,?)";
  const char* kInsertLive =
      "INSERT OR REPLACE INTO live(allocation_id, tenant, uid, pid, session, device, bytes, "
      "time_ns) VALUES(?,?,?,?,?,?,?,?)";
  const char* kDeleteLive = "DELETE FROM live WHERE allocation_id = ?";
  const char* kUpsertUsage =
      "INSERT OR REPLACE INTO usage(tenant, device, current_bytes, peak_bytes, byte_seconds, "
      "updated_ns) VALUES(?,?,?,?,?,?)";
  if (sqlite3_prepare_v2(db_, kInsertEvent, -1, &insert_event_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kInsertLive, -1, &insert_live_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kDeleteLive, -1, &delete_live_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kUpsertUsage, -1, &upsert_usage_, nullptr) != SQLITE_OK) {
    s = Error("schema");
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  s = Recover(now_ns, defer);
  if (!s.ok()) { Exec("ROLLBACK").IgnoreError(); return s; }
  if (s = Exec("COMMIT"); !s.ok()) { Exec("ROLLBACK").IgnoreError(); return s; }

  if (sqlite3_open_v2(path_.c_str(), &reader_, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("ledger ", path_, ": cannot open for reading: ", sqlite3_errmsg(reader_)));
  }
  sqlite3_busy_timeout(reader_, 5000);
  return absl::OkStatus();
}

absl::Status LedgerStore::SchemaCheck() {
  // Each table this ledger has, as kSchema makes it: its columns in order,
  // with their types and which are the primary key. A file whose schema
  // text was changed (a primary key that is no longer the rowid, a column
  // renamed) passes quick_check but would be read wrongly.
  struct Want {
    const char* table;
    const char* columns;  // "name type pk;" each
  };
  static const Want kWant[] = {
      {"meta", "key TEXT 1;value INTEGER 0;"},
      {"events", "seq INTEGER 1;time_ns INTEGER 0;kind TEXT 0;tenant TEXT 0;uid INTEGER 0;"
                 "pid INTEGER 0;session INTEGER 0;device INTEGER 0;bytes INTEGER 0;"
                 "allocation_id INTEGER 0;detail TEXT 0;"},
      {"live", "allocation_id INTEGER 1;tenant TEXT 0;uid INTEGER 0;pid INTEGER 0;"
               "session INTEGER 0;device INTEGER 0;bytes INTEGER 0;time_ns INTEGER 0;"},
      {"usage", "tenant TEXT 1;device INTEGER 2;current_bytes INTEGER 0;peak_bytes INTEGER 0;"
                "byte_seconds REAL 0;updated_ns INTEGER 0;"},
  };
  for (const Want& w : kWant) {
    Stmt q;
    const std::string sql = absl::StrCat("PRAGMA table_info(", w.table, ")");
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q.s, nullptr) != SQLITE_OK) {
      return Error("checking the schema");
    }
    std::string got;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
      absl::StrAppend(&got, ColumnText(q.s, 1), " ", ColumnText(q.s, 2), " ",
                      sqlite3_column_int64(q.s, 5), ";");
    }
    if (rc != SQLITE_DONE) return Error("checking the schema");
    if (!got.empty() && got != w.columns) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path_, " is damaged (its table ", w.table,
          " is not this ledger's: its schema was changed): move it aside to start a new "
          "ledger"));
    }
  }
  return absl::OkStatus();
}

absl::Status LedgerStore::QuickCheck() {
  Stmt q;
  if (sqlite3_prepare_v2(db_, "PRAGMA quick_check(3)", -1, &q.s, nullptr) != SQLITE_OK) {
    return Error("checking the file");
  }
  std::vector<std::string> problems;
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) problems.push_back(ColumnText(q.s, 0));
  if (rc != SQLITE_DONE) return Error("checking the file");
  if (problems.size() == 1 && problems[0] == "ok") return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "ledger ", path_, " is damaged (", absl::StrJoin(problems, "; "),
      "): move it aside to start a new ledger, or rescue what it holds with sqlite3's "
      ".recover first"));
}

absl::Status LedgerStore::Recover(int64_t now_ns, bool defer) {
  Recovery& r = recovery_;
  {
    Stmt q;
    if (sqlite3_prepare_v2(db_, "SELECT COALESCE(MAX(seq), 0) FROM events", -1, &q.s,
                           nullptr) != SQLITE_OK ||
        sqlite3_step(q.s) != SQLITE_ROW) {
      return Error("reading events");
    }
    r.next_seq = static_cast<uint64_t>(sqlite3_column_int64(q.s, 0)) + 1;
  }
  {
    Stmt q;
    if (sqlite3_prepare_v2(db_, "SELECT value FROM meta WHERE key = 'allocation_id_reserved'",
                           -1, &q.s, nullptr) != SQLITE_OK) {
      return Error("reading meta");
    }
    int rc = sqlite3_step(q.s);
    if (rc == SQLITE_ROW) {
      id_reserved_ = sqlite3_column_int64(q.s, 0);
    } else if (rc != SQLITE_DONE) {
      return Error("reading meta");
    }
    // Ids are integers below 2^63 (SQLite's INTEGER is signed): a negative
    // one, one that is not an integer (text sorts above every integer, so
    // MAX would not see the largest), or such a reservation, is damage no
    // daemon wrote, and the ids that follow could not be kept above it.
    Stmt bad;
    if (sqlite3_prepare_v2(db_,
                           "SELECT (SELECT COUNT(*) FROM events WHERE allocation_id < 0 OR "
                           "typeof(allocation_id) != 'integer') + "
                           "(SELECT COUNT(*) FROM meta WHERE key = 'allocation_id_reserved' "
                           "AND (value < 0 OR typeof(value) != 'integer'))",
                           -1, &bad.s, nullptr) != SQLITE_OK ||
        sqlite3_step(bad.s) != SQLITE_ROW) {
      return Error("reading events");
    }
    if (const int64_t n = sqlite3_column_int64(bad.s, 0); n > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path_, " is damaged (", n, " allocation id(s) negative or not integers): "
          "move it aside to start a new ledger"));
    }
    // Ids the last run may have handed out are all <= id_reserved_.
    Stmt m;
    if (sqlite3_prepare_v2(db_, "SELECT COALESCE(MAX(allocation_id), 0) FROM events", -1,
                           &m.s, nullptr) != SQLITE_OK ||
        sqlite3_step(m.s) != SQLITE_ROW) {
      return Error("reading events");
    }
    id_reserved_ = std::max<uint64_t>(id_reserved_, sqlite3_column_int64(m.s, 0));
    r.first_allocation_id = id_reserved_ + 1;
    id_reserved_ += kIdWindow;
  }
  {
    Stmt q;
    if (sqlite3_prepare_v2(db_, "SELECT tenant, device, current_bytes, peak_bytes, "
                           "byte_seconds, updated_ns FROM usage", -1, &q.s, nullptr) != SQLITE_OK) {
      return Error("reading usage");
    }
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
      UsageRow row;
      row.current_bytes = sqlite3_column_int64(q.s, 2);
      row.peak_bytes = sqlite3_column_int64(q.s, 3);
      row.byte_seconds = sqlite3_column_double(q.s, 4);
      row.updated_ns = sqlite3_column_int64(q.s, 5);
      r.usage.Set({ColumnText(q.s, 0), sqlite3_column_int(q.s, 1)}, row);
    }
    if (rc != SQLITE_DONE) return Error("reading usage");
  }
  {
    Stmt q;
    if (sqlite3_prepare_v2(db_, "SELECT allocation_id, tenant, uid, pid, session, device, "
                           "bytes FROM live ORDER BY allocation_id", -1, &q.s,
                           nullptr) != SQLITE_OK) {
      return Error("reading live allocations");
    }
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
      LedgerEvent e;
      e.seq = r.next_seq++;
      e.time_ns = now_ns;
      e.kind = EventKind::kDaemonRestart;
      e.allocation_id = sqlite3_column_int64(q.s, 0);
      e.tenant = ColumnText(q.s, 1);
      e.uid = static_cast<uint32_t>(sqlite3_column_int64(q.s, 2));
      e.pid = sqlite3_column_int(q.s, 3);
      e.session = sqlite3_column_int64(q.s, 4);
      e.device = sqlite3_column_int(q.s, 5);
      e.bytes = sqlite3_column_int64(q.s, 6);
      e.detail = "live when the previous daemon stopped without closing it";
      if (defer) {
        --r.next_seq;  // not written now
        e.seq = 0;
        e.kind = EventKind::kAllocate;
        e.detail.clear();
        r.live.push_back(std::move(e));
      } else {
        r.restart_events.push_back(std::move(e));
      }
    }
    if (rc != SQLITE_DONE) return Error("reading live allocations");
  }
  if (defer) {
    // Nothing closed, nothing moved: the daemon reconciles (Resume).
    Stmt m;
    if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta(key, value) "
                           "VALUES('allocation_id_reserved', ?)", -1, &m.s,
                           nullptr) != SQLITE_OK) {
      return Error("writing meta");
    }
    sqlite3_bind_int64(m.s, 1, id_reserved_);
    if (sqlite3_step(m.s) != SQLITE_DONE) return Error("writing meta");
    return absl::OkStatus();
  }
  // The daemon was down: no byte-seconds accrue for that time. Each row's
  // clock moves to now before the restart events take the bytes away.
  std::vector<UsageAccount::Key> changed;
  for (const auto& [key, row] : r.usage.rows()) {
    UsageRow moved = row;
    moved.updated_ns = std::max(row.updated_ns, now_ns);
    r.usage.Set(key, moved);
    changed.push_back(key);
  }
  for (const LedgerEvent& e : r.restart_events) r.usage.Apply(e);
  // Nothing is held after a restart, whatever the rows said.
  for (const auto& [key, row] : r.usage.rows()) {
    if (row.current_bytes != 0) {
      UsageRow zero = row;
      zero.current_bytes = 0;
      r.usage.Set(key, zero);
    }
  }
  for (const auto& [key, row] : r.usage.rows()) changed.push_back(key);
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  for (const LedgerEvent& e : r.restart_events) {
    absl::Status s = InsertEvent(e);
    if (!s.ok()) return s;
  }
  for (const auto& key : changed) {
    const UsageRow& row = r.usage.rows().at(key);
    sqlite3_reset(upsert_usage_);
    BindText(upsert_usage_, 1, key.first);
    sqlite3_bind_int(upsert_usage_, 2, key.second);
    sqlite3_bind_int64(upsert_usage_, 3, row.current_bytes);
    sqlite3_bind_int64(upsert_usage_, 4, row.peak_bytes);
    sqlite3_bind_double(upsert_usage_, 5, row.byte_seconds);
    sqlite3_bind_int64(upsert_usage_, 6, row.updated_ns);
    if (sqlite3_step(upsert_usage_) != SQLITE_DONE) return Error("writing usage");
  }
  if (absl::Status s = Exec("DELETE FROM live"); !s.ok()) return s;
  Stmt m;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta(key, value) "
                         "VALUES('allocation_id_reserved', ?)", -1, &m.s, nullptr) != SQLITE_OK) {
    return Error("writing meta");
  }
  sqlite3_bind_int64(m.s, 1, id_reserved_);
  if (sqlite3_step(m.s) != SQLITE_DONE) return Error("writing meta");
  return absl::OkStatus();
}

void LedgerStore::BindEvent(sqlite3_stmt* s, int first, const LedgerEvent& e) {
  sqlite3_bind_int64(s, first, e.seq);
  sqlite3_bind_int64(s, first + 1, e.time_ns);
  absl::string_view kind = KindName(e.kind);
  sqlite3_bind_text(s, first + 2, kind.data(), static_cast<int>(kind.size()), SQLITE_STATIC);
  // The events outlive the statement's step (Commit's caller keeps them).
  sqlite3_bind_text(s, first + 3, e.tenant.data(), static_cast<int>(e.tenant.size()),
                    SQLITE_STATIC);
  sqlite3_bind_int64(s, first + 4, e.uid);
  sqlite3_bind_int(s, first + 5, e.pid);
  sqlite3_bind_int64(s, first + 6, e.session);
  sqlite3_bind_int(s, first + 7, e.device);
  sqlite3_bind_int64(s, first + 8, e.bytes);
  sqlite3_bind_int64(s, first + 9, e.allocation_id);
  sqlite3_bind_text(s, first + 10, e.detail.data(), static_cast<int>(e.detail.size()),
                    SQLITE_STATIC);
}

absl::Status LedgerStore::InsertEvent(const LedgerEvent& e) {
  sqlite3_stmt* s = insert_event_;
  sqlite3_reset(s);
  BindEvent(s, 1, e);
  const int rc = sqlite3_step(s);
  sqlite3_clear_bindings(s);
  if (rc != SQLITE_DONE) return Error("writing an event");
  return absl::OkStatus();
}

absl::Status LedgerStore::CheckFile() const {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, " was removed while gpumemd ran (", strerror(errno),
        "): nothing more can be recorded in it; put the file back or restart gpumemd to "
        "start a new ledger there"));
  }
  if (st.st_dev != file_dev_ || st.st_ino != file_ino_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, " was replaced by another file while gpumemd ran: nothing more "
        "is recorded until the daemon's own file is back at that path; restart gpumemd to "
        "use the new file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LedgerStore::CheckpointResult> LedgerStore::Checkpoint() {
  absl::MutexLock write(&write_mu_);
  CheckpointResult r;
  if (sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &r.wal_pages,
                                &r.copied) != SQLITE_OK) {
    return Error("checkpointing");
  }
  // The WAL restarts from its start at the next commit once all of it was
  // copied; until then it stays this long.
  wal_pages_.store(r.copied >= r.wal_pages ? 0 : r.wal_pages, std::memory_order_relaxed);
  return r;
}

int LedgerStore::wal_pages() const { return wal_pages_.load(std::memory_order_relaxed); }

absl::Status LedgerStore::Commit(const std::vector<LedgerEvent>& events,
                                 const UsageAccount& usage,
                                 const std::vector<UsageAccount::Key>& changed,
                                 const std::vector<QuotaRow>& quotas, uint64_t highest_id) {
  absl::MutexLock write(&write_mu_);
  if (absl::Status file = CheckFile(); !file.ok()) return file;
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  auto fail = [this](absl::Status status) {
    Exec("ROLLBACK").IgnoreError();
    return status;
  };
  // An allocation made and freed within this batch never touches `live`:
  // the table holds what is live at the commit, and the pair nets to
  // nothing (warm Allocate+Free churn then costs two event rows only).
  absl::flat_hash_set<uint64_t> made_here, net_zero;
  for (const LedgerEvent& e : events) {
    const int sign = UsageSign(e.kind);
    if (sign > 0) {
      made_here.insert(e.allocation_id);
    } else if (sign < 0 && made_here.contains(e.allocation_id)) {
      net_zero.insert(e.allocation_id);
    }
  }
  size_t written = 0;
  for (const LedgerEvent& e : events) {
    // A commit of a full batch is about a millisecond of CPU: give the core
    // to whatever waits for it every kYieldEvery events, so a serving
    // thread woken onto this core never waits behind the whole commit.
    if (++written % kYieldEvery == 0) sched_yield();
    if (s = InsertEvent(e); !s.ok()) return fail(s);
    const int sign = UsageSign(e.kind);
    if (sign != 0 && net_zero.contains(e.allocation_id)) continue;
    if (sign > 0) {
      sqlite3_stmt* l = insert_live_;
      sqlite3_reset(l);
      sqlite3_bind_int64(l, 1, e.allocation_id);
      BindText(l, 2, e.tenant);
      sqlite3_bind_int64(l, 3, e.uid);
      sqlite3_bind_int(l, 4, e.pid);
      sqlite3_bind_int64(l, 5, e.session);
      sqlite3_bind_int(l, 6, e.device);
      sqlite3_bind_int64(l, 7, e.bytes);
      sqlite3_bind_int64(l, 8, e.time_ns);
      if (sqlite3_step(l) != SQLITE_DONE) return fail(Error("writing live"));
    } else if (sign < 0) {
      sqlite3_reset(delete_live_);
      sqlite3_bind_int64(delete_live_, 1, e.allocation_id);
      if (sqlite3_step(delete_live_) != SQLITE_DONE) return fail(Error("writing live"));
    }
  }
  for (const auto& key : changed) {
    const UsageRow& row = usage.rows().at(key);
    sqlite3_stmt* u = upsert_usage_;
    sqlite3_reset(u);
    BindText(u, 1, key.first);
    sqlite3_bind_int(u, 2, key.second);
    sqlite3_bind_int64(u, 3, row.current_bytes);
    sqlite3_bind_int64(u, 4, row.peak_bytes);
    sqlite3_bind_double(u, 5, row.byte_seconds);
    sqlite3_bind_int64(u, 6, row.updated_ns);
    if (sqlite3_step(u) != SQLITE_DONE) return fail(Error("writing usage"));
  }
  if (!quotas.empty()) {
    if (s = WriteQuotas(quotas); !s.ok()) return fail(s);
  }
  if (highest_id + kIdWindow / 2 > id_reserved_) {
    Stmt m;
    const uint64_t reserved = highest_id + kIdWindow;
    if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta(key, value) "
                           "VALUES('allocation_id_reserved', ?)", -1, &m.s, nullptr) != SQLITE_OK) {
      return fail(Error("writing meta"));
    }
    sqlite3_bind_int64(m.s, 1, reserved);
    if (sqlite3_step(m.s) != SQLITE_DONE) return fail(Error("writing meta"));
    if (s = Exec("COMMIT"); !s.ok()) return fail(s);
    id_reserved_ = reserved;
    return absl::OkStatus();
  }
  if (s = Exec("COMMIT"); !s.ok()) return fail(s);
  return absl::OkStatus();
}

absl::Status LedgerStore::WriteQuotas(const std::vector<QuotaRow>& quotas) {
  for (const QuotaRow& q : quotas) {
    Stmt del, del_dev, ins;
    if (sqlite3_prepare_v2(db_, "DELETE FROM quota_devices WHERE tenant = ?", -1, &del_dev.s,
                           nullptr) != SQLITE_OK ||
        sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO quotas(tenant, total_bytes, "
                           "max_allocations, source, set_ns) VALUES(?,?,?,?,?)", -1, &ins.s,
                           nullptr) != SQLITE_OK) {
      return Error("writing quotas");
    }
    BindText(del_dev.s, 1, q.tenant);
    if (sqlite3_step(del_dev.s) != SQLITE_DONE) return Error("writing quotas");
    BindText(ins.s, 1, q.tenant);
    if (q.quota.total_bytes) sqlite3_bind_int64(ins.s, 2, *q.quota.total_bytes);
    if (q.quota.max_allocations) sqlite3_bind_int64(ins.s, 3, *q.quota.max_allocations);
    BindText(ins.s, 4, q.source);
    sqlite3_bind_int64(ins.s, 5, q.set_ns);
    if (sqlite3_step(ins.s) != SQLITE_DONE) return Error("writing quotas");
    for (size_t d = 0; d < q.quota.device_bytes.size(); ++d) {
      if (!q.quota.device_bytes[d]) continue;
      Stmt dev;
      if (sqlite3_prepare_v2(db_, "INSERT INTO quota_devices(tenant, device, bytes) "
                             "VALUES(?,?,?)", -1, &dev.s, nullptr) != SQLITE_OK) {
        return Error("writing quotas");
      }
      BindText(dev.s, 1, q.tenant);
      sqlite3_bind_int(dev.s, 2, static_cast<int>(d));
      sqlite3_bind_int64(dev.s, 3, *q.quota.device_bytes[d]);
      if (sqlite3_step(dev.s) != SQLITE_DONE) return Error("writing quotas");
    }
  }
  return absl::OkStatus();
}

absl::Status LedgerStore::InTransaction(const std::function<absl::Status()>& body) {
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  if (s = body(); s.ok()) s = Exec("COMMIT");
  if (!s.ok()) Exec("ROLLBACK").IgnoreError();
  return s;
}

absl::Status LedgerStore::ReplaceQuotas(const std::vector<QuotaRow>& quotas) {
  absl::MutexLock write(&write_mu_);
  return InTransaction([&] {
    absl::Status s = Exec("DELETE FROM quotas; DELETE FROM quota_devices;");
    return s.ok() ? WriteQuotas(quotas) : s;
  });
}

absl::StatusOr<std::vector<LedgerEvent>> LedgerStore::Query(const EventQuery& query) const {
  std::string sql = absl::StrCat("SELECT ", kEventColumns, " FROM events WHERE seq > ?1");
  if (!query.tenant.empty()) absl::StrAppend(&sql, " AND tenant = ?2");
  if (query.since_ns > 0) absl::StrAppend(&sql, " AND time_ns >= ?3");
  if (query.until_ns > 0) absl::StrAppend(&sql, " AND time_ns < ?4");
  absl::StrAppend(&sql, query.newest ? " ORDER BY seq DESC" : " ORDER BY seq", " LIMIT ?5");
  absl::MutexLock lock(&reader_mu_);
  Stmt q;
  if (sqlite3_prepare_v2(reader_, sql.c_str(), -1, &q.s, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("ledger ", path_, ": ", sqlite3_errmsg(reader_)));
  }
  sqlite3_bind_int64(q.s, 1, query.after_seq);
  if (!query.tenant.empty()) BindText(q.s, 2, query.tenant);
  if (query.since_ns > 0) sqlite3_bind_int64(q.s, 3, query.since_ns);
  if (query.until_ns > 0) sqlite3_bind_int64(q.s, 4, query.until_ns);
  sqlite3_bind_int64(q.s, 5, query.limit);
  std::vector<LedgerEvent> out;
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) out.push_back(EventFromRow(q.s));
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("ledger ", path_, ": ", sqlite3_errmsg(reader_)));
  }
  if (query.newest) std::reverse(out.begin(), out.end());
  return out;
}

void LedgerStore::SetMaxPageCount(int64_t pages) {
  absl::MutexLock write(&write_mu_);
  Exec(absl::StrCat("PRAGMA max_page_count=", pages).c_str()).IgnoreError();
}

absl::Status LedgerStore::PutSocketTenant(const SocketTenantRow& row) {
  absl::MutexLock write(&write_mu_);
  return InTransaction([&]() -> absl::Status {
    {
      Stmt del, ins;
      if (sqlite3_prepare_v2(db_, "DELETE FROM socket_tenant_devices WHERE tenant = ?", -1,
                             &del.s, nullptr) != SQLITE_OK ||
          sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO socket_tenants(name, socket, priority, "
                             "total_bytes, max_allocations, source, set_ns) VALUES(?,?,?,?,?,?,?)",
                             -1, &ins.s, nullptr) != SQLITE_OK) {
        return Error("writing socket tenants");
      }
      BindText(del.s, 1, row.name);
      if (sqlite3_step(del.s) != SQLITE_DONE) return Error("writing socket tenants");
      BindText(ins.s, 1, row.name);
      BindText(ins.s, 2, row.socket);
      sqlite3_bind_int(ins.s, 3, row.priority);
      if (row.total_bytes) sqlite3_bind_int64(ins.s, 4, static_cast<int64_t>(*row.total_bytes));
      if (row.max_allocations) {
        sqlite3_bind_int64(ins.s, 5, static_cast<int64_t>(*row.max_allocations));
      }
      BindText(ins.s, 6, row.source);
      sqlite3_bind_int64(ins.s, 7, row.set_ns);
      if (sqlite3_step(ins.s) != SQLITE_DONE) return Error("writing socket tenants");
    }
    for (const auto& [uuid, bytes] : row.device_bytes) {
      Stmt dev;
      if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO socket_tenant_devices(tenant, "
                             "device_uuid, bytes) VALUES(?,?,?)",
                             -1, &dev.s, nullptr) != SQLITE_OK) {
        return Error("writing socket tenants");
      }
      BindText(dev.s, 1, row.name);
      BindText(dev.s, 2, uuid);
      sqlite3_bind_int64(dev.s, 3, static_cast<int64_t>(bytes));
      if (sqlite3_step(dev.s) != SQLITE_DONE) return Error("writing socket tenants");
    }
    return absl::OkStatus();
  });
}

absl::Status LedgerStore::DeleteSocketTenant(const std::string& name) {
  absl::MutexLock write(&write_mu_);
  return InTransaction([&]() -> absl::Status {
    for (const char* sql : {"DELETE FROM socket_tenant_devices WHERE tenant = ?",
                            "DELETE FROM socket_tenants WHERE name = ?"}) {
      Stmt del;
      if (sqlite3_prepare_v2(db_, sql, -1, &del.s, nullptr) != SQLITE_OK) {
        return Error("deleting a socket tenant");
      }
      BindText(del.s, 1, name);
      if (sqlite3_step(del.s) != SQLITE_DONE) return Error("deleting a socket tenant");
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<SocketTenantRow>> LedgerStore::SocketTenants() const {
  absl::MutexLock write(&write_mu_);
  std::vector<SocketTenantRow> rows;
  Stmt q;
  if (sqlite3_prepare_v2(db_, "SELECT name, socket, priority, total_bytes, max_allocations, "
                         "source, set_ns FROM socket_tenants ORDER BY set_ns, name", -1, &q.s,
                         nullptr) != SQLITE_OK) {
    return Error("reading socket tenants");
  }
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
    SocketTenantRow r;
    r.name = ColumnText(q.s, 0);
    r.socket = ColumnText(q.s, 1);
    r.priority = sqlite3_column_int(q.s, 2);
    if (sqlite3_column_type(q.s, 3) != SQLITE_NULL) r.total_bytes = sqlite3_column_int64(q.s, 3);
    if (sqlite3_column_type(q.s, 4) != SQLITE_NULL) {
      r.max_allocations = sqlite3_column_int64(q.s, 4);
    }
    r.source = ColumnText(q.s, 5);
    r.set_ns = sqlite3_column_int64(q.s, 6);
    rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return Error("reading socket tenants");
  for (SocketTenantRow& r : rows) {
    Stmt d;
    if (sqlite3_prepare_v2(db_, "SELECT device_uuid, bytes FROM socket_tenant_devices "
                           "WHERE tenant = ? ORDER BY device_uuid", -1, &d.s, nullptr) != SQLITE_OK) {
      return Error("reading socket tenants");
    }
    BindText(d.s, 1, r.name);
    while ((rc = sqlite3_step(d.s)) == SQLITE_ROW) {
      r.device_bytes.emplace_back(ColumnText(d.s, 0), sqlite3_column_int64(d.s, 1));
    }
    if (rc != SQLITE_DONE) return Error("reading socket tenants");
  }
  return rows;
}

}  // namespace ledger
}  // namespace gpumem
