// SQL lives here and only here. Statements the writer runs per event are
// prepared once and reused (one-row statements: a multi-row INSERT buys
// nothing here); everything else is prepared per call.
#include "server/ledger/ledger_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpumem {
namespace ledger {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(
  key TEXT PRIMARY KEY,
  value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS event_rows(
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
CREATE INDEX IF NOT EXISTS events_by_tenant ON event_rows(tenant, seq);
CREATE TABLE IF NOT EXISTS pair_rows(
  first_seq INTEGER PRIMARY KEY,
  last_seq INTEGER NOT NULL,
  tenant TEXT NOT NULL,
  max_allocation_id INTEGER NOT NULL,
  pairs TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS pairs_by_tenant ON pair_rows(tenant, first_seq);
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
CREATE TABLE IF NOT EXISTS retained(
  tenant TEXT NOT NULL,
  kind TEXT NOT NULL,
  events INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  first_ns INTEGER NOT NULL,
  last_ns INTEGER NOT NULL,
  PRIMARY KEY(tenant, kind));
CREATE TABLE IF NOT EXISTS socket_tenant_devices(
  tenant TEXT NOT NULL,
  device_uuid TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  PRIMARY KEY(tenant, device_uuid));
)sql";

// The events, one per row, as every ledger before folding stored them and as
// SQL readers read them: a pair gives its ALLOCATE and its end. Recreated at
// every Open, so it is always this one. A pair is the JSON array
// [seq, time_ns, end_seq, end_ns, end_kind, uid, pid, session, device, bytes,
// allocation_id] (kPairFields).
constexpr const char* kEventsView = R"sql(
DROP VIEW IF EXISTS events;
CREATE VIEW events AS
  SELECT seq, time_ns, kind, tenant, uid, pid, session, device, bytes, allocation_id, detail
    FROM event_rows
  UNION ALL
  SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), 'ALLOCATE', p.tenant,
         json_extract(j.value, '$[5]'), json_extract(j.value, '$[6]'),
         json_extract(j.value, '$[7]'), json_extract(j.value, '$[8]'),
         json_extract(j.value, '$[9]'), json_extract(j.value, '$[10]'), ''
    FROM pair_rows p, json_each(p.pairs) j
  UNION ALL
  SELECT json_extract(j.value, '$[2]'), json_extract(j.value, '$[3]'),
         json_extract(j.value, '$[4]'), p.tenant,
         json_extract(j.value, '$[5]'), json_extract(j.value, '$[6]'),
         json_extract(j.value, '$[7]'), json_extract(j.value, '$[8]'),
         json_extract(j.value, '$[9]'), json_extract(j.value, '$[10]'), ''
    FROM pair_rows p, json_each(p.pairs) j;
)sql";

// A ledger written before pairs (format 1) has `events` as its table of
// events: Open renames it in the same transaction that recovers it.
constexpr const char* kMigrateFromEventsTable = "ALTER TABLE events RENAME TO event_rows;";

// Each pair read back: the fields of one array of pair_rows.pairs.
constexpr const char* kPairFields =
    "json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), "
    "json_extract(j.value, '$[2]'), json_extract(j.value, '$[3]'), "
    "json_extract(j.value, '$[4]'), json_extract(j.value, '$[5]'), "
    "json_extract(j.value, '$[6]'), json_extract(j.value, '$[7]'), "
    "json_extract(j.value, '$[8]'), json_extract(j.value, '$[9]'), "
    "json_extract(j.value, '$[10]')";

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

// Events a commit goes through between two sched_yield()s.
constexpr size_t kYieldEvery = 128;

// Keeps the WAL's page count where the writer can read it.
int WalHook(void* arg, sqlite3*, const char*, int pages) {
  static_cast<std::atomic<int>*>(arg)->store(pages, std::memory_order_relaxed);
  return SQLITE_OK;
}

constexpr const char* kEventColumns =
    "seq, time_ns, kind, tenant, uid, pid, session, device, bytes, allocation_id, detail";

// Retention (LedgerStore::Retain): the events at or below ?1 folded into
// `retained`, one row per tenant and kind (counts, bytes, first and last
// time), then deleted.
constexpr const char* kFoldUpsert =
    " ON CONFLICT(tenant, kind) DO UPDATE SET events = events + excluded.events, "
    "bytes = bytes + excluded.bytes, first_ns = MIN(first_ns, excluded.first_ns), "
    "last_ns = MAX(last_ns, excluded.last_ns)";
constexpr const char* kFoldSingles =
    "INSERT INTO retained(tenant, kind, events, bytes, first_ns, last_ns) "
    "SELECT tenant, kind, COUNT(*), SUM(bytes), MIN(time_ns), MAX(time_ns) FROM event_rows "
    "WHERE seq <= ?1 GROUP BY tenant, kind";
constexpr const char* kFoldStarts =
    "INSERT INTO retained(tenant, kind, events, bytes, first_ns, last_ns) "
    "SELECT p.tenant, 'ALLOCATE', COUNT(*), SUM(json_extract(j.value, '$[9]')), "
    "MIN(json_extract(j.value, '$[1]')), MAX(json_extract(j.value, '$[1]')) "
    "FROM pair_rows p, json_each(p.pairs) j WHERE p.last_seq <= ?1 GROUP BY p.tenant";
constexpr const char* kFoldEnds =
    "INSERT INTO retained(tenant, kind, events, bytes, first_ns, last_ns) "
    "SELECT p.tenant, json_extract(j.value, '$[4]'), COUNT(*), "
    "SUM(json_extract(j.value, '$[9]')), MIN(json_extract(j.value, '$[3]')), "
    "MAX(json_extract(j.value, '$[3]')) FROM pair_rows p, json_each(p.pairs) j "
    "WHERE p.last_seq <= ?1 GROUP BY p.tenant, 2";

// SQLite's answer means the disk (or the file's limit) is full.
bool FullError(sqlite3* db) {
  if (db == nullptr) return false;
  const int code = sqlite3_errcode(db) & 0xff;
  const int sys = sqlite3_system_errno(db);
  return code == SQLITE_FULL ||
         (code == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT || sys == EFBIG));
}

// `path` (created 0600 when `create`, else only if it exists) is readable
// and writable by its owner alone: a wider mode is tightened (fchmod, said
// on stderr). The ledger names every tenant, uid and pid.
absl::Status OwnerOnly(const std::string& path, bool create) {
  const int fd = open(path.c_str(),
                      O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
  if (fd < 0) {
    if (!create && errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("ledger file ", path, ": unable to open: ", strerror(errno)));
  }
  struct stat st;
  absl::Status out = absl::OkStatus();
  if (fstat(fd, &st) == 0 && (st.st_mode & 077) != 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    if (fchmod(fd, st.st_mode & 0700) != 0) {
      out = absl::FailedPreconditionError(absl::StrCat(
          "ledger file ", path, ": cannot tighten its mode ", mode, ": ", strerror(errno)));
    } else {
      std::cerr << "gpumemd: ledger file " << path << ": mode was " << mode << ", now "
                << ((st.st_mode & 0700) == 0600 ? "0600" : "owner-only") << std::endl;
    }
  }
  close(fd);
  return out;
}

}  // namespace

absl::Status LedgerStore::Error(const char* what) const {
  const std::string m = absl::StrCat("ledger ", path_, ": ", what, ": ", sqlite3_errmsg(db_));
  return FullError(db_) ? absl::ResourceExhaustedError(m) : absl::FailedPreconditionError(m);
}

absl::Status LedgerStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string m =
        absl::StrCat("ledger ", path_, ": ", message ? message : sqlite3_errmsg(db_));
    sqlite3_free(message);
    return FullError(db_) ? absl::ResourceExhaustedError(m) : absl::FailedPreconditionError(m);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LedgerStore>> LedgerStore::Open(const std::string& path,
                                                                int64_t now_ns,
                                                                int64_t max_page_count,
                                                                bool defer) {
  // SQLite's memory statistics take a global mutex around every malloc it
  // makes, and nothing here reads them. Only possible before SQLite is first
  // used in the process (later it answers SQLITE_MISUSE and keeps them on).
  static const bool memstatus_off = [] {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) == SQLITE_OK;
  }();
  (void)memstatus_off;
  std::unique_ptr<LedgerStore> store(new LedgerStore(path));
  absl::Status s = store->Init(now_ns, max_page_count, defer);
  if (!s.ok()) return s;
  return store;
}

LedgerStore::~LedgerStore() {
  FinalizeStatements();
  if (reader_ != nullptr) sqlite3_close(reader_);
  if (db_ != nullptr) sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

void LedgerStore::FinalizeStatements() {
  for (sqlite3_stmt** s :
       {&insert_event_, &insert_live_, &delete_live_, &upsert_usage_, &insert_pairs_}) {
    sqlite3_finalize(*s);
    *s = nullptr;
  }
}

absl::Status LedgerStore::Connect() {
  if (db_ != nullptr) {
    sqlite3_close(db_);
    db_ = nullptr;
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
  // SQLite makes -wal and -shm with the file's own mode; ones left by an
  // earlier daemon are tightened here.
  for (const char* suffix : {"-wal", "-shm"}) {
    if (s = OwnerOnly(path_ + suffix, false); !s.ok()) return s;
  }
  if (max_page_count_ > 0) {
    Exec(absl::StrCat("PRAGMA max_page_count=", max_page_count_).c_str()).IgnoreError();
  }
  connected_ = true;
  return absl::OkStatus();
}

absl::Status LedgerStore::Init(int64_t now_ns, int64_t max_page_count, bool defer) {
  const std::string lock_path = path_ + "-lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
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
  absl::Status s = OwnerOnly(lock_path, false);
  if (!s.ok()) return s;
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(lock_fd_, 0) != 0 ||
      pwrite(lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // A full disk may refuse even these few bytes: the flock is what counts.
    if (errno != ENOSPC && errno != EDQUOT && errno != EFBIG) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path_, ": cannot write its lock file ", lock_path, ": ", strerror(errno)));
    }
  }
  // The file is made here, 0600, so that SQLite (which would make it 0644
  // less the umask) opens ours, and makes -wal and -shm with its mode.
  if (s = OwnerOnly(path_, true); !s.ok()) return s;
  max_page_count_ = max_page_count;
  defer_ = defer;
  s = Connect();
  if (s.ok()) {
    struct stat st;
    if (stat(path_.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("ledger ", path_, ": cannot stat it: ", strerror(errno)));
    }
    file_dev_ = st.st_dev;
    file_ino_ = st.st_ino;
    // A damaged file is refused before anything reads or writes its tables:
    // recovery on a b-tree with lost or misordered pages would see some rows
    // and not others (a MAX(seq) below rows a scan finds, live allocations
    // missed) and carry on writing into it.
    if (s = QuickCheck(); s.ok()) s = SchemaCheck();
    if (s.ok()) s = InitTransaction(/*compute=*/true, now_ns, defer);
  }
  if (!s.ok()) {
    if (!absl::IsResourceExhausted(s)) return s;
    if (s = EnterPending(now_ns, defer, s); !s.ok()) return s;
  }
  if (sqlite3_open_v2(path_.c_str(), &reader_, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("ledger ", path_, ": cannot open for reading: ", sqlite3_errmsg(reader_)));
  }
  sqlite3_busy_timeout(reader_, 5000);
  return absl::OkStatus();
}

absl::Status LedgerStore::InitTransaction(bool compute, int64_t now_ns, bool defer) {
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  auto fail = [this](absl::Status status) {
    Exec("ROLLBACK").IgnoreError();
    FinalizeStatements();
    return status;
  };
  if (migrate_events_table_) {
    if (s = Exec(kMigrateFromEventsTable); !s.ok()) return fail(s);
  }
  if (s = Exec(kSchema); !s.ok()) return fail(s);
  if (s = Exec(kEventsView); !s.ok()) return fail(s);
  const char* kInsertEvent =
      "INSERT INTO event_rows(seq, time_ns, kind, tenant, uid, pid, session, device, bytes, "
      "allocation_id, detail) VALUES(?,?,?,?,?,?,?,?,?,?,?)";
  const char* kInsertPairs =
      "INSERT INTO pair_rows(first_seq, last_seq, tenant, max_allocation_id, pairs) "
      "VALUES(?,?,?,?,?)";
  const char* kInsertLive =
      "INSERT OR REPLACE INTO live(allocation_id, tenant, uid, pid, session, device, bytes, "
      "time_ns) VALUES(?,?,?,?,?,?,?,?)";
  const char* kDeleteLive = "DELETE FROM live WHERE allocation_id = ?";
  const char* kUpsertUsage =
      "INSERT OR REPLACE INTO usage(tenant, device, current_bytes, peak_bytes, byte_seconds, "
      "updated_ns) VALUES(?,?,?,?,?,?)";
  FinalizeStatements();
  if (sqlite3_prepare_v2(db_, kInsertEvent, -1, &insert_event_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kInsertLive, -1, &insert_live_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kDeleteLive, -1, &delete_live_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kUpsertUsage, -1, &upsert_usage_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, kInsertPairs, -1, &insert_pairs_, nullptr) != SQLITE_OK) {
    return fail(Error("schema"));
  }
  if (compute) {
    if (s = Recover(now_ns, defer); !s.ok()) return fail(s);
  }
  if (s = WriteRecovery(defer); !s.ok()) return fail(s);
  if (s = Exec("COMMIT"); !s.ok()) return fail(s);
  migrate_events_table_ = false;
  last_seq_ = std::max(last_seq_, recovery_.next_seq - 1);
  return absl::OkStatus();
}

absl::Status LedgerStore::EnterPending(int64_t now_ns, bool defer, const absl::Status& why) {
  // What the file holds, read without writing anything: the recovery is
  // written by the first transaction the disk takes (FinishOpenLocked).
  if (migrate_events_table_) return why;  // format 1's file: its migration writes
  recovery_ = Recovery();
  recovery_changed_.clear();
  id_reserved_ = 0;
  retained_through_ = 0;
  if (!connected_) {
    // SQLite could not even make its -shm: in EXCLUSIVE locking mode it
    // keeps the WAL's index in memory instead, so the file can still be
    // read (by this connection alone; it is closed once read).
    if (db_ != nullptr) sqlite3_close(db_);
    db_ = nullptr;
    if (sqlite3_open_v2(path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      return why;
    }
    absl::Status s = Exec("PRAGMA locking_mode=EXCLUSIVE");
    if (s.ok()) s = QuickCheck();
    if (s.ok()) s = SchemaCheck();
    if (!s.ok()) {
      sqlite3_close(db_);
      db_ = nullptr;
      return absl::IsResourceExhausted(s) ? why : s;
    }
    struct stat st;
    if (stat(path_.c_str(), &st) == 0) {
      file_dev_ = st.st_dev;
      file_ino_ = st.st_ino;
    }
  }
  absl::StatusOr<int64_t> tables = SingleInt(
      "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN "
      "('meta', 'event_rows', 'pair_rows', 'live', 'usage', 'socket_tenants', "
      "'socket_tenant_devices')");
  absl::Status s = tables.status();
  if (s.ok() && *tables == 7) {
    if (s = Exec("BEGIN"); s.ok()) {
      s = Recover(now_ns, defer);
      absl::StatusOr<std::vector<SocketTenantRow>> rows = ReadSocketTenants();
      if (s.ok()) s = rows.status();
      if (s.ok()) pending_socket_tenants_ = *std::move(rows);
      Exec("ROLLBACK").IgnoreError();
    }
  } else if (s.ok() && *tables != 0) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, " lacks some of its tables and its disk is full (", why.message(),
        "): free space there, or move it aside to start a new ledger"));
  }
  if (!connected_) {
    sqlite3_close(db_);
    db_ = nullptr;
  }
  if (!s.ok()) return absl::IsResourceExhausted(s) ? why : s;
  pending_ = true;
  pending_error_ = why;
  return absl::OkStatus();
}

absl::Status LedgerStore::FinishOpenLocked() {
  if (!pending_) return absl::OkStatus();
  absl::Status s = connected_ ? absl::OkStatus() : Connect();
  if (!s.ok()) {
    if (db_ != nullptr) sqlite3_close(db_);
    db_ = nullptr;
    connected_ = false;
    return s;
  }
  if (s = InitTransaction(/*compute=*/false, 0, defer_); !s.ok()) return s;
  pending_ = false;
  pending_socket_tenants_.clear();
  return absl::OkStatus();
}

bool LedgerStore::pending() const {
  absl::MutexLock write(&write_mu_);
  return pending_;
}

absl::Status LedgerStore::pending_error() const {
  absl::MutexLock write(&write_mu_);
  return pending_ ? pending_error_ : absl::OkStatus();
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
      {"event_rows", "seq INTEGER 1;time_ns INTEGER 0;kind TEXT 0;tenant TEXT 0;uid INTEGER 0;"
                     "pid INTEGER 0;session INTEGER 0;device INTEGER 0;bytes INTEGER 0;"
                     "allocation_id INTEGER 0;detail TEXT 0;"},
      {"pair_rows", "first_seq INTEGER 1;last_seq INTEGER 0;tenant TEXT 0;"
                    "max_allocation_id INTEGER 0;pairs TEXT 0;"},
      {"live", "allocation_id INTEGER 1;tenant TEXT 0;uid INTEGER 0;pid INTEGER 0;"
               "session INTEGER 0;device INTEGER 0;bytes INTEGER 0;time_ns INTEGER 0;"},
      {"usage", "tenant TEXT 1;device INTEGER 2;current_bytes INTEGER 0;peak_bytes INTEGER 0;"
                "byte_seconds REAL 0;updated_ns INTEGER 0;"},
  };
  // `events`: a view (this format, recreated at Open), or a ledger of
  // format 1's table, to migrate; not both that table and `event_rows`.
  {
    Stmt t;
    if (sqlite3_prepare_v2(db_, "SELECT (SELECT type FROM sqlite_master WHERE name = 'events'), "
                           "(SELECT COUNT(*) FROM sqlite_master WHERE name = 'event_rows')",
                           -1, &t.s, nullptr) != SQLITE_OK ||
        sqlite3_step(t.s) != SQLITE_ROW) {
      return Error("checking the schema");
    }
    const std::string events_type = ColumnText(t.s, 0);
    const bool has_rows = sqlite3_column_int64(t.s, 1) > 0;
    if (events_type == "table") {
      if (has_rows) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ledger ", path_, " is damaged (it has both an events table and event_rows): "
            "move it aside to start a new ledger"));
      }
      migrate_events_table_ = true;
    } else if (!events_type.empty() && events_type != "view") {
      return absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path_, " is damaged (its events is a ", events_type,
          ", not a table or view): move it aside to start a new ledger"));
    }
  }
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
    const bool old_events = migrate_events_table_ && std::string(w.table) == "event_rows";
    if (old_events) {
      // Format 1's events table: what event_rows is now.
      Stmt o;
      if (sqlite3_prepare_v2(db_, "PRAGMA table_info(events)", -1, &o.s, nullptr) != SQLITE_OK) {
        return Error("checking the schema");
      }
      while ((rc = sqlite3_step(o.s)) == SQLITE_ROW) {
        absl::StrAppend(&got, ColumnText(o.s, 1), " ", ColumnText(o.s, 2), " ",
                        sqlite3_column_int64(o.s, 5), ";");
      }
      if (rc != SQLITE_DONE) return Error("checking the schema");
    }
    if (!got.empty() && got != w.columns) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ledger ", path_, " is damaged (its table ", old_events ? "events" : w.table,
          " is not this ledger's: its schema was changed): move it aside to start a new "
          "ledger"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LedgerStore::SingleInt(const std::string& sql) const {
  Stmt q;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q.s, nullptr) != SQLITE_OK ||
      sqlite3_step(q.s) != SQLITE_ROW) {
    return Error("reading events");
  }
  return sqlite3_column_int64(q.s, 0);
}

absl::Status LedgerStore::DamagedIfAny(const std::string& count_sql, absl::string_view what) {
  absl::StatusOr<int64_t> count = SingleInt(count_sql);
  if (!count.ok()) return count.status();
  if (const int64_t n = *count; n > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger ", path_, " is damaged (", n, " ", what, "): move it aside to start a new "
        "ledger"));
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
    // A pair's end may be the last event committed.
    absl::StatusOr<int64_t> last = SingleInt(
        "SELECT MAX((SELECT COALESCE(MAX(seq), 0) FROM event_rows), "
        "(SELECT COALESCE(MAX(last_seq), 0) FROM pair_rows))");
    if (!last.ok()) return last.status();
    // Retention may have folded every row away below its mark.
    absl::StatusOr<int64_t> through = SingleInt(
        "SELECT COALESCE((SELECT value FROM meta WHERE key = 'retained_through'), 0)");
    if (!through.ok()) return through.status();
    retained_through_ = static_cast<uint64_t>(std::max<int64_t>(0, *through));
    r.next_seq = std::max(static_cast<uint64_t>(*last), retained_through_) + 1;
    last_seq_ = r.next_seq - 1;
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
    absl::Status damaged = DamagedIfAny(
        "SELECT (SELECT COUNT(*) FROM event_rows WHERE allocation_id < 0 OR "
        "typeof(allocation_id) != 'integer') + "
        "(SELECT COUNT(*) FROM pair_rows WHERE max_allocation_id < 0 OR "
        "typeof(max_allocation_id) != 'integer') + "
        "(SELECT COUNT(*) FROM meta WHERE key = 'allocation_id_reserved' "
        "AND (value < 0 OR typeof(value) != 'integer'))",
        "allocation id(s) negative or not integers");
    if (!damaged.ok()) return damaged;
    // A pair row's seqs lie in [first_seq, first_seq + kFoldSpan] (Query
    // relies on that bound). What its JSON says is checked when it is read.
    damaged = DamagedIfAny(
        absl::StrCat("SELECT COUNT(*) FROM pair_rows WHERE typeof(last_seq) != 'integer' OR "
                     "last_seq <= first_seq OR last_seq > first_seq + ", kFoldSpan),
        "pair row(s) whose seqs are out of their bounds");
    if (!damaged.ok()) return damaged;
    // Ids the last run may have handed out are all <= id_reserved_.
    absl::StatusOr<int64_t> highest = SingleInt(
        "SELECT MAX((SELECT COALESCE(MAX(allocation_id), 0) FROM event_rows), "
        "(SELECT COALESCE(MAX(max_allocation_id), 0) FROM pair_rows))");
    if (!highest.ok()) return highest.status();
    id_reserved_ = std::max<uint64_t>(id_reserved_, static_cast<uint64_t>(*highest));
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
  // Nothing closed, nothing moved: the daemon reconciles (Resume).
  if (defer) return absl::OkStatus();
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
  recovery_changed_ = std::move(changed);
  return absl::OkStatus();
}

absl::Status LedgerStore::WriteRecovery(bool defer) {
  Recovery& r = recovery_;
  if (defer) {
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
  for (const LedgerEvent& e : r.restart_events) {
    absl::Status s = InsertEvent(e);
    if (!s.ok()) return s;
  }
  for (const auto& key : recovery_changed_) {
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
  if (sqlite3_step(s) != SQLITE_DONE) return Error("writing an event");
  return absl::OkStatus();
}

bool LedgerStore::Foldable(const LedgerEvent& start, const LedgerEvent& end) {
  return start.kind == EventKind::kAllocate && UsageSign(end.kind) < 0 &&
         end.allocation_id == start.allocation_id && end.seq > start.seq &&
         end.seq - start.seq <= kFoldSpan && end.time_ns >= start.time_ns &&
         start.detail.empty() && end.detail.empty() && end.tenant == start.tenant &&
         end.uid == start.uid && end.pid == start.pid && end.session == start.session &&
         end.device == start.device && end.bytes == start.bytes;
}

void LedgerStore::AppendPair(PairChunk* chunk, const LedgerEvent& start, const LedgerEvent& end) {
  // Formatted into a buffer on the stack, one number at a time
  // (std::to_chars: no locale, no allocation), then appended once: the
  // writer formats every pair it commits, so this is on its hottest path.
  // 11 numbers of at most 20 characters, a kind name and punctuation.
  char buf[11 * 21 + 64];
  char* p = buf;
  const absl::string_view kind = KindName(end.kind);
  auto number = [&p](auto v) {
    p = std::to_chars(p, p + 21, v).ptr;
    *p++ = ',';
  };
  if (chunk->pairs.empty()) {
    chunk->first_seq = start.seq;
    *p++ = '[';
  } else {
    *p++ = ',';
  }
  *p++ = '[';
  number(start.seq);
  number(start.time_ns);
  number(end.seq);
  number(end.time_ns);
  *p++ = '"';
  p = std::copy(kind.begin(), kind.end(), p);  // at most "DAEMON_RESTART"
  *p++ = '"';
  *p++ = ',';
  number(start.uid);
  number(start.pid);
  number(start.session);
  number(start.device);
  number(start.bytes);
  number(start.allocation_id);
  p[-1] = ']';  // the last number's comma
  chunk->pairs.append(buf, static_cast<size_t>(p - buf));
  chunk->last_seq = std::max(chunk->last_seq, end.seq);
  chunk->max_allocation_id = std::max(chunk->max_allocation_id, start.allocation_id);
}

absl::Status LedgerStore::InsertPairs(PairChunk* chunk) {
  if (chunk->pairs.empty()) return absl::OkStatus();
  chunk->pairs.push_back(']');
  sqlite3_stmt* s = insert_pairs_;
  sqlite3_reset(s);
  sqlite3_bind_int64(s, 1, static_cast<int64_t>(chunk->first_seq));
  sqlite3_bind_int64(s, 2, static_cast<int64_t>(chunk->last_seq));
  BindText(s, 3, chunk->tenant);
  sqlite3_bind_int64(s, 4, static_cast<int64_t>(chunk->max_allocation_id));
  sqlite3_bind_text(s, 5, chunk->pairs.data(), static_cast<int>(chunk->pairs.size()),
                    SQLITE_STATIC);
  const int rc = sqlite3_step(s);
  chunk->pairs.clear();
  chunk->last_seq = 0;
  chunk->max_allocation_id = 0;
  if (rc != SQLITE_DONE) return Error("writing events");
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
  if (pending_) return pending_error_;
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
  // Opened on a full disk: the recovery is written first.
  if (absl::Status opened = FinishOpenLocked(); !opened.ok()) return opened;
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  if (!events.empty()) last_seq_commit_ = events.back().seq;
  auto fail = [this](absl::Status status) {
    Exec("ROLLBACK").IgnoreError();
    chunks_.clear();
    chunk_of_.clear();
    churn_folds_.clear();
    return status;
  };
  // An allocation made and ended within this batch never touches `live`:
  // the table holds what is live at the commit, and the pair nets to
  // nothing. When the two events differ only in what an end says (its kind,
  // time and seq: see Foldable), the pair is one element of a pair_rows row
  // (one row per tenant holds the pairs of up to kFoldSpan seqs).
  // fold_end_[i]: for an ALLOCATE, the index of the end paired with it; for
  // that end, kFolded; kNone else. net_zero_[i]: no `live` change for i.
  constexpr int32_t kNone = -1, kFolded = -2;
  fold_end_.assign(events.size(), kNone);
  net_zero_.assign(events.size(), 0);
  open_.clear();
  for (size_t i = 0; i < events.size(); ++i) {
    const LedgerEvent& e = events[i];
    const int sign = UsageSign(e.kind);
    if (sign > 0) {
      open_[e.allocation_id] = i;
    } else if (sign < 0) {
      auto it = open_.find(e.allocation_id);
      if (it == open_.end()) continue;
      const size_t a = it->second;
      open_.erase(it);
      net_zero_[a] = net_zero_[i] = 1;
      if (Foldable(events[a], e)) {
        fold_end_[a] = static_cast<int32_t>(i);
        fold_end_[i] = kFolded;
      }
    }
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const LedgerEvent& e = events[i];
    // A commit of a full batch is a long stretch of CPU: give the core to
    // whatever waits for it every kYieldEvery events, so a
    // serving thread woken onto this core never waits behind the whole
    // commit (the scheduler lets a running thread finish its slice first).
    if (i % kYieldEvery == kYieldEvery - 1) sched_yield();
    if (fold_end_[i] == kFolded) continue;
    if (fold_end_[i] >= 0) {
      const LedgerEvent& end = events[fold_end_[i]];
      if (churn_cap_ > 0) {
        ChurnWindow& w = churn_[e.tenant];
        const int64_t second = end.time_ns / 1000000000;
        if (w.second != second) w = ChurnWindow{second, 0};
        if (w.stored >= churn_cap_) {
          for (const LedgerEvent* x : {&e, &end}) {
            ChurnFold& f = churn_folds_[{x->tenant, std::string(KindName(x->kind))}];
            f.first_ns = f.events == 0 ? x->time_ns : std::min(f.first_ns, x->time_ns);
            f.last_ns = f.events == 0 ? x->time_ns : std::max(f.last_ns, x->time_ns);
            ++f.events;
            f.bytes += x->bytes;
          }
          continue;
        }
        ++w.stored;
      }
      auto [at, made] = chunk_of_.try_emplace(e.tenant, chunks_.size());
      if (made) {
        chunks_.emplace_back();
        chunks_.back().tenant = e.tenant;
      }
      PairChunk* chunk = &chunks_[at->second];
      if (!chunk->pairs.empty() && end.seq > chunk->first_seq + kFoldSpan) {
        if (s = InsertPairs(chunk); !s.ok()) return fail(s);
      }
      AppendPair(chunk, e, end);
      continue;
    }
    if (s = InsertEvent(e); !s.ok()) return fail(s);
    if (net_zero_[i]) continue;
    const int sign = UsageSign(e.kind);
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
  for (PairChunk& c : chunks_) {
    if (s = InsertPairs(&c); !s.ok()) return fail(s);
  }
  chunks_.clear();
  chunk_of_.clear();
  uint64_t churn_pairs = 0;
  if (!churn_folds_.empty()) {
    Stmt q;
    const std::string sql = absl::StrCat(
        "INSERT INTO retained(tenant, kind, events, bytes, first_ns, last_ns) "
        "VALUES(?1, ?2, ?3, ?4, ?5, ?6)", kFoldUpsert);
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q.s, nullptr) != SQLITE_OK) {
      churn_folds_.clear();
      return fail(Error("folding churn"));
    }
    for (const auto& [key, f] : churn_folds_) {
      sqlite3_reset(q.s);
      BindText(q.s, 1, key.first);
      BindText(q.s, 2, key.second);
      sqlite3_bind_int64(q.s, 3, static_cast<int64_t>(f.events));
      sqlite3_bind_int64(q.s, 4, static_cast<int64_t>(f.bytes));
      sqlite3_bind_int64(q.s, 5, f.first_ns);
      sqlite3_bind_int64(q.s, 6, f.last_ns);
      if (sqlite3_step(q.s) != SQLITE_DONE) {
        churn_folds_.clear();
        return fail(Error("folding churn"));
      }
      churn_pairs += f.events;
    }
    churn_pairs /= 2;  // each pair is a start and an end
    churn_folds_.clear();
  }
  if (churn_.size() > 4096) churn_.clear();  // tenants come and go: windows restart
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
    last_seq_ = std::max(last_seq_, last_seq_commit_);
    churn_folded_ += churn_pairs;
    return absl::OkStatus();
  }
  if (s = Exec("COMMIT"); !s.ok()) return fail(s);
  last_seq_ = std::max(last_seq_, last_seq_commit_);
  churn_folded_ += churn_pairs;
  return absl::OkStatus();
}

void LedgerStore::SetChurnCap(uint64_t pairs_per_second) {
  absl::MutexLock write(&write_mu_);
  churn_cap_ = pairs_per_second;
}

uint64_t LedgerStore::churn_folded_pairs() const {
  absl::MutexLock write(&write_mu_);
  return churn_folded_;
}

absl::StatusOr<LedgerStore::RetainResult> LedgerStore::Retain(uint64_t keep_events,
                                                               uint64_t batch_seqs) {
  absl::MutexLock write(&write_mu_);
  RetainResult out;
  if (pending_ || keep_events == 0 || last_seq_ <= keep_events) return out;
  const uint64_t cutoff = last_seq_ - keep_events;
  if (cutoff <= retained_through_) return out;
  absl::StatusOr<int64_t> oldest = SingleInt(
      "SELECT MIN((SELECT COALESCE(MIN(seq), 9223372036854775807) FROM event_rows), "
      "(SELECT COALESCE(MIN(first_seq), 9223372036854775807) FROM pair_rows))");
  if (!oldest.ok()) return oldest.status();
  // Rows wholly at or below `bound` go; a pair row that straddles it waits
  // for the next batch (it spans at most kFoldSpan seqs).
  const uint64_t from =
      std::max(retained_through_, static_cast<uint64_t>(std::max<int64_t>(*oldest, 1)) - 1);
  const uint64_t bound = std::min(cutoff, from + std::max<uint64_t>(batch_seqs, 1));
  absl::Status s = InTransaction([&]() -> absl::Status {
    for (const char* fold : {kFoldSingles, kFoldStarts, kFoldEnds}) {
      Stmt q;
      const std::string sql = absl::StrCat(fold, kFoldUpsert);
      if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q.s, nullptr) != SQLITE_OK) {
        return Error("folding old events");
      }
      sqlite3_bind_int64(q.s, 1, static_cast<int64_t>(bound));
      if (sqlite3_step(q.s) != SQLITE_DONE) return Error("folding old events");
    }
    for (const char* sql : {"DELETE FROM event_rows WHERE seq <= ?1",
                            "DELETE FROM pair_rows WHERE last_seq <= ?1",
                            "INSERT OR REPLACE INTO meta(key, value) "
                            "VALUES('retained_through', ?1)"}) {
      Stmt q;
      if (sqlite3_prepare_v2(db_, sql, -1, &q.s, nullptr) != SQLITE_OK) {
        return Error("deleting old events");
      }
      sqlite3_bind_int64(q.s, 1, static_cast<int64_t>(bound));
      if (sqlite3_step(q.s) != SQLITE_DONE) return Error("deleting old events");
      if (sql[0] != 'I') out.rows_deleted += static_cast<uint64_t>(sqlite3_changes(db_));
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  retained_through_ = bound;
  out.through_seq = bound;
  out.more = bound < cutoff;
  return out;
}

uint64_t LedgerStore::retained_through() const {
  absl::MutexLock write(&write_mu_);
  return retained_through_;
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
  if (absl::Status opened = FinishOpenLocked(); !opened.ok()) return opened;
  return InTransaction([&] {
    absl::Status s = Exec("DELETE FROM quotas; DELETE FROM quota_devices;");
    return s.ok() ? WriteQuotas(quotas) : s;
  });
}

absl::StatusOr<std::vector<LedgerEvent>> LedgerStore::Query(const EventQuery& query) const {
  if (query.limit == 0) return std::vector<LedgerEvent>();
  // Two streams in seq order: event_rows (one event a row), and the pairs of
  // pair_rows (two events each, all within kFoldSpan above their row's
  // first_seq). Events go through `pending` and are emitted once neither
  // stream can still give one that comes before them.
  const bool desc = query.newest;
  std::string where;
  if (!query.tenant.empty()) absl::StrAppend(&where, " AND tenant = ?2");
  std::string singles_sql = absl::StrCat("SELECT ", kEventColumns,
                                         " FROM event_rows WHERE seq > ?1", where);
  if (query.since_ns > 0) absl::StrAppend(&singles_sql, " AND time_ns >= ?3");
  if (query.until_ns > 0) absl::StrAppend(&singles_sql, " AND time_ns < ?4");
  absl::StrAppend(&singles_sql, desc ? " ORDER BY seq DESC" : " ORDER BY seq");
  std::string pairs_sql = absl::StrCat("SELECT p.first_seq, p.tenant, p.last_seq, "
                                       "p.max_allocation_id, ", kPairFields,
                                       " FROM pair_rows p, json_each(p.pairs) j WHERE "
                                       "p.first_seq > ?1",
                                       query.tenant.empty() ? "" : " AND p.tenant = ?2",
                                       desc ? " ORDER BY p.first_seq DESC" : " ORDER BY p.first_seq");
  absl::MutexLock lock(&reader_mu_);
  auto failed = [&](const char* what) {
    return absl::UnavailableError(
        absl::StrCat("ledger ", path_, ": ", what, ": ", sqlite3_errmsg(reader_)));
  };
  Stmt singles, pairs;
  if (sqlite3_prepare_v2(reader_, singles_sql.c_str(), -1, &singles.s, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(reader_, pairs_sql.c_str(), -1, &pairs.s, nullptr) != SQLITE_OK) {
    return failed("reading events");
  }
  // The reads are one transaction, so both streams see the same commits.
  if (sqlite3_exec(reader_, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return failed("reading events");
  }
  struct EndRead {
    sqlite3* db;
    ~EndRead() { sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr); }
  } end_read{reader_};
  sqlite3_bind_int64(singles.s, 1, static_cast<int64_t>(query.after_seq));
  const uint64_t from = query.after_seq > kFoldSpan ? query.after_seq - kFoldSpan : 0;
  sqlite3_bind_int64(pairs.s, 1, static_cast<int64_t>(from));
  if (!query.tenant.empty()) {
    BindText(singles.s, 2, query.tenant);
    BindText(pairs.s, 2, query.tenant);
  }
  if (query.since_ns > 0) sqlite3_bind_int64(singles.s, 3, query.since_ns);
  if (query.until_ns > 0) sqlite3_bind_int64(singles.s, 4, query.until_ns);

  auto wanted = [&](const LedgerEvent& e) {
    return e.seq > query.after_seq && (query.since_ns <= 0 || e.time_ns >= query.since_ns) &&
           (query.until_ns <= 0 || e.time_ns < query.until_ns);
  };
  auto later = [desc](const LedgerEvent& a, const LedgerEvent& b) {
    return desc ? a.seq < b.seq : a.seq > b.seq;
  };
  std::priority_queue<LedgerEvent, std::vector<LedgerEvent>, decltype(later)> pending(later);
  std::vector<LedgerEvent> out;
  // Each stream's next row (stepped ahead), and the bound on the seqs it may
  // still give: at least (oldest first) or at most (newest first).
  constexpr int64_t kDone = -1;
  auto step = [&](sqlite3_stmt* q, int64_t* bound, bool is_pairs) -> absl::Status {
    const int rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) {
      *bound = kDone;
      return absl::OkStatus();
    }
    if (rc != SQLITE_ROW) return failed("reading events");
    const int64_t key = sqlite3_column_int64(q, 0);
    *bound = is_pairs && desc ? key + static_cast<int64_t>(kFoldSpan) : key;
    return absl::OkStatus();
  };
  int64_t singles_bound = 0, pairs_bound = 0;
  if (absl::Status st = step(singles.s, &singles_bound, false); !st.ok()) return st;
  if (absl::Status st = step(pairs.s, &pairs_bound, true); !st.ok()) return st;
  while (out.size() < query.limit && (singles_bound != kDone || pairs_bound != kDone)) {
    // The stream whose next row comes first in the order asked.
    bool take_pairs;
    if (singles_bound == kDone) {
      take_pairs = true;
    } else if (pairs_bound == kDone) {
      take_pairs = false;
    } else {
      take_pairs = desc ? pairs_bound > singles_bound : pairs_bound < singles_bound;
    }
    // Events no row still to come can precede are final.
    const int64_t bound = take_pairs ? pairs_bound : singles_bound;
    while (!pending.empty() && out.size() < query.limit &&
           (desc ? static_cast<int64_t>(pending.top().seq) > bound
                 : static_cast<int64_t>(pending.top().seq) < bound)) {
      out.push_back(pending.top());
      pending.pop();
    }
    if (out.size() >= query.limit) break;
    if (!take_pairs) {
      LedgerEvent e = EventFromRow(singles.s);
      if (wanted(e)) pending.push(std::move(e));
      if (absl::Status st = step(singles.s, &singles_bound, false); !st.ok()) return st;
      continue;
    }
    sqlite3_stmt* q = pairs.s;
    const int64_t first_seq = sqlite3_column_int64(q, 0);
    LedgerEvent start;
    start.tenant = ColumnText(q, 1);
    const int64_t last_seq = sqlite3_column_int64(q, 2);
    const uint64_t max_id = static_cast<uint64_t>(sqlite3_column_int64(q, 3));
    // Columns 4..14: the pair's fields (kPairFields).
    for (int c = 4; c < 15; ++c) {
      const int want = c == 8 ? SQLITE_TEXT : SQLITE_INTEGER;
      if (sqlite3_column_type(q, c) != want) {
        return absl::DataLossError(absl::StrCat(
            "ledger ", path_, " is damaged: the pairs of its pair_rows row ", first_seq,
            " are not this ledger's"));
      }
    }
    start.seq = sqlite3_column_int64(q, 4);
    start.time_ns = sqlite3_column_int64(q, 5);
    start.kind = EventKind::kAllocate;
    start.uid = static_cast<uint32_t>(sqlite3_column_int64(q, 9));
    start.pid = sqlite3_column_int(q, 10);
    start.session = sqlite3_column_int64(q, 11);
    start.device = sqlite3_column_int(q, 12);
    start.bytes = sqlite3_column_int64(q, 13);
    start.allocation_id = sqlite3_column_int64(q, 14);
    LedgerEvent end = start;
    end.seq = sqlite3_column_int64(q, 6);
    end.time_ns = sqlite3_column_int64(q, 7);
    const std::optional<EventKind> kind = KindFromName(ColumnText(q, 8));
    const int64_t s0 = static_cast<int64_t>(start.seq), s1 = static_cast<int64_t>(end.seq);
    // Within its row's bounds (which Open checked), an ending kind, an id
    // its row accounts for.
    if (!kind || UsageSign(*kind) >= 0 || s0 < first_seq || s1 <= s0 || s1 > last_seq ||
        s1 > first_seq + static_cast<int64_t>(kFoldSpan) || start.allocation_id > max_id) {
      return absl::DataLossError(absl::StrCat(
          "ledger ", path_, " is damaged: a pair of its pair_rows row ", first_seq,
          " is not this ledger's"));
    }
    end.kind = *kind;
    if (wanted(start)) pending.push(std::move(start));
    if (wanted(end)) pending.push(std::move(end));
    if (absl::Status st = step(pairs.s, &pairs_bound, true); !st.ok()) return st;
  }
  while (!pending.empty() && out.size() < query.limit) {
    out.push_back(pending.top());
    pending.pop();
  }
  if (desc) std::reverse(out.begin(), out.end());
  return out;
}

void LedgerStore::SetMaxPageCount(int64_t pages) {
  absl::MutexLock write(&write_mu_);
  max_page_count_ = pages;
  if (db_ != nullptr) Exec(absl::StrCat("PRAGMA max_page_count=", pages).c_str()).IgnoreError();
}

absl::Status LedgerStore::PutSocketTenant(const SocketTenantRow& row) {
  absl::MutexLock write(&write_mu_);
  if (absl::Status opened = FinishOpenLocked(); !opened.ok()) return opened;
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
  if (absl::Status opened = FinishOpenLocked(); !opened.ok()) return opened;
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
  // Opened on a full disk: as they were read then.
  if (pending_) return pending_socket_tenants_;
  return ReadSocketTenants();
}

absl::StatusOr<std::vector<SocketTenantRow>> LedgerStore::ReadSocketTenants() const {
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
