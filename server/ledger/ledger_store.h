// LedgerStore: the ledger's SQLite file: schema, start-up recovery, grouped
// writes and reads. The schema is documented in README.md ("The ledger").
//
// Invariants: one daemon per ledger file (an flock, Open); the file and its
// -wal, -shm and -lock are its owner's alone (0600); a commit is all or
// nothing, and in the WAL once Commit returns, so the process dying after
// that loses none of it; allocation ids never repeat across runs; events
// are stored compactly and read back exactly; a full disk at Open is not an
// error (pending()) and write errors of a full disk are RESOURCE_EXHAUSTED,
// others FAILED_PRECONDITION. The write side takes one lock, so the writer
// thread's commits and the callers of the other write methods never use the
// connection at once; Query may run concurrently from any thread on its own
// read-only connection.
#ifndef GPUMEMD_SERVER_LEDGER_LEDGER_STORE_H_
#define GPUMEMD_SERVER_LEDGER_LEDGER_STORE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/ledger/ledger_event.h"
#include "server/ledger/usage_account.h"
#include "server/tenants/tenant.h"

struct sqlite3;
struct sqlite3_stmt;

namespace gpumem {
namespace ledger {

// A row of the quotas table (with its quota_devices rows).
struct QuotaRow {
  std::string tenant;
  tenants::Quota quota;
  std::string source;  // "config" or "SetQuota by uid N"
  int64_t set_ns = 0;
};

// A row of socket_tenants: a socket tenant made at run time, as PutTenant
// last set it. Device quotas are by device UUID (indexes may change across
// restarts; UUIDs do not).
struct SocketTenantRow {
  std::string name;
  std::string socket;
  int32_t priority = 0;
  std::optional<uint64_t> total_bytes;
  std::optional<uint64_t> max_allocations;
  std::vector<std::pair<std::string, uint64_t>> device_bytes;  // (uuid, bytes)
  std::string source;  // "PutTenant by uid N"
  int64_t set_ns = 0;
};

struct EventQuery {
  std::string tenant;  // empty: all
  int64_t since_ns = 0;
  int64_t until_ns = 0;  // 0: no bound
  uint64_t after_seq = 0;
  uint32_t limit = 1000;
  bool newest = false;  // the newest `limit` (still returned oldest first)
};

class LedgerStore {
 public:
  // Allocation ids never repeat: Open hands out the first id of a fresh
  // window above every id a previous run could have used, and Commit keeps
  // the stored high-water mark at least kIdWindow/2 above the highest id
  // committed so far.
  static constexpr uint64_t kIdWindow = uint64_t{1} << 20;
  // The most seqs between a folded row's start and its end (Foldable).
  static constexpr uint64_t kFoldSpan = 1024;

  struct Recovery {
    uint64_t next_seq = 1;
    uint64_t first_allocation_id = 1;
    std::vector<LedgerEvent> restart_events;  // written by Open
    std::vector<LedgerEvent> live;            // with defer: the live rows, as ALLOCATEs
    UsageAccount usage;                       // after those events
  };

  // Creates the file and schema or checks an existing one; a file that is
  // not a ledger, is corrupt (PRAGMA quick_check finds damage) or cannot be
  // written is an error naming the path with SQLite's own message. The
  // journal is WAL.
  //  - PATH is made 0600 before SQLite opens it (so -wal and -shm get 0600
  //    too), whatever the umask; PATH, -wal, -shm and -lock found with wider
  //    modes are tightened (fchmod), with a log line.
  //  - One daemon per ledger: the store holds an exclusive flock on
  //    PATH-lock (holding the owner's pid) while it lives, and Open fails
  //    naming that pid when another process holds it. Without this a second
  //    daemon would close the first one's live allocations as if it had
  //    crashed.
  //  - Recovery: every allocation still in the `live` table (live when the
  //    last daemon died) gets a DAEMON_RESTART event, leaves `live`, and its
  //    bytes leave current usage, all in one transaction. Byte-seconds are
  //    not accrued for the time the daemon was down. With `defer` (a daemon
  //    that may carry on with what the last one left, server/restart/)
  //    nothing is closed: the live rows are returned in Recovery::live,
  //    usage stays as it was, and the daemon reconciles through
  //    TenantLedger::Resume. A ledger of the older format (an `events` table
  //    of every event) is migrated in the same transaction.
  //  - A full disk (SQLITE_FULL, or ENOSPC, EDQUOT or EFBIG under an I/O
  //    error) is not an error: see pending().
  // `max_page_count` > 0 limits the file (PRAGMA max_page_count); tests use
  // it to make SQLite answer "database or disk is full".
  static absl::StatusOr<std::unique_ptr<LedgerStore>> Open(const std::string& path,
                                                           int64_t now_ns,
                                                           int64_t max_page_count = 0,
                                                           bool defer = false);
  ~LedgerStore();

  const Recovery& recovery() const { return recovery_; }
  const std::string& path() const { return path_; }

  // One transaction, all or nothing: `events` (seq already set), their
  // effect on `live`, the rows of `usage` named in `changed`, `quotas`
  // upserted, and the id high-water mark. It yields the core (sched_yield)
  // every so many events, so a full batch never holds a core a serving
  // thread waits for. Before it writes, it checks that PATH is still the
  // file Open opened: a ledger removed or replaced under the running daemon
  // is an error naming it (the events would otherwise go to an unlinked file
  // and be lost at exit), until the file is put back.
  // Durability: WAL with synchronous=NORMAL. A commit is in the WAL (the
  // kernel's page cache) when Commit returns; the process dying at any
  // moment after that (kill -9, a crash) loses none of it, because the
  // kernel still writes those pages. Only losing the machine (power, a
  // kernel crash) may lose the last commits before a checkpoint's fsync;
  // the file stays consistent either way.
  absl::Status Commit(const std::vector<LedgerEvent>& events, const UsageAccount& usage,
                      const std::vector<UsageAccount::Key>& changed,
                      const std::vector<QuotaRow>& quotas, uint64_t highest_id);
  // Replaces every quota row (the config's, at start).
  absl::Status ReplaceQuotas(const std::vector<QuotaRow>& quotas);

  // Socket tenants made at run time (PutTenant): rows of `socket_tenants`
  // (with their per-device quotas, by device UUID, in
  // `socket_tenant_devices`), inserted or replaced, deleted (a name without
  // a row is no error), listed by name. Put and Delete write one tenant in
  // one transaction and return only once it is committed, so a tenant a
  // caller was told exists survives a crash.
  absl::Status PutSocketTenant(const SocketTenantRow& row);
  absl::Status DeleteSocketTenant(const std::string& name);
  absl::StatusOr<std::vector<SocketTenantRow>> SocketTenants() const;

  // Every event with its own seq, one each, however it is stored (as does
  // the `events` view SQL readers use).
  absl::StatusOr<std::vector<LedgerEvent>> Query(const EventQuery& query) const;

  // Tests: changes the page limit of the write connection.
  void SetMaxPageCount(int64_t pages);

  // The churn cap: of one tenant's pairs (an allocation made and ended in
  // one commit: see Foldable) ending in one second, the first
  // `pairs_per_second` are stored as events; the rest are folded at once
  // into `retained` (per tenant and kind: events, bytes, first and last
  // time, as retention folds), so one tenant's churn writes at most that
  // many pairs a second, and pushes no one's history out of the retention
  // window faster. Usage (current, peak, byte-seconds) is folded from every
  // event before it reaches the store, so it stays exact; a pair nets to
  // nothing in `live`. 0 (the default): every event is stored.
  void SetChurnCap(uint64_t pairs_per_second);
  // Pairs folded so far by the churn cap.
  uint64_t churn_folded_pairs() const;

  // Opened on a full disk: Open read what recovery needs without writing
  // (in EXCLUSIVE locking mode, so with the WAL index in memory, when SQLite
  // cannot make its -shm); what it read is in recovery(), and every write
  // first runs the recovery transaction again, answering its error until the
  // disk takes it; pending_error() is why (RESOURCE_EXHAUSTED).
  bool pending() const;
  absl::Status pending_error() const;

  // Retention: folds the oldest events, those more than `keep_events` seqs
  // below the last one committed, into `retained` (per tenant and kind:
  // events, bytes, first and last time) and deletes their rows; at most
  // `batch_seqs` seqs' worth in one transaction. Nothing when there is
  // nothing that old, or while pending.
  struct RetainResult {
    uint64_t rows_deleted = 0;  // event_rows and pair_rows rows
    uint64_t through_seq = 0;   // every row wholly at or below it is folded
    bool more = false;          // more is due than one batch took
  };
  absl::StatusOr<RetainResult> Retain(uint64_t keep_events, uint64_t batch_seqs);
  uint64_t retained_through() const;

  // A PASSIVE checkpoint (never waits for readers or blocks them): copies
  // what it can of the WAL into the file. SQLite's automatic checkpoint is
  // off: the owner calls this.
  struct CheckpointResult {
    int wal_pages = 0;  // in the WAL when it ran
    int copied = 0;     // of those, copied (fewer: a reader holds older ones)
  };
  absl::StatusOr<CheckpointResult> Checkpoint();
  // Pages in the WAL after the last commit or checkpoint.
  int wal_pages() const;

 private:
  LedgerStore(std::string path) : path_(std::move(path)) {}
  absl::Status Error(const char* what) const;
  absl::Status Exec(const char* sql);
  // BEGIN IMMEDIATE, `body`, COMMIT; rolled back when either fails. Under
  // write_mu_.
  absl::Status InTransaction(const std::function<absl::Status()>& body);
  absl::Status Init(int64_t now_ns, int64_t max_page_count, bool defer);
  // Opens the write connection and sets its pragmas.
  absl::Status Connect();
  // BEGIN; the schema, the view, the statements; (`compute`: Recover);
  // WriteRecovery; COMMIT.
  absl::Status InitTransaction(bool compute, int64_t now_ns, bool defer);
  // The disk is full (`why`): reads what recovery needs without writing.
  absl::Status EnterPending(int64_t now_ns, bool defer, const absl::Status& why);
  // While pending: the init transaction again (under write_mu_).
  absl::Status FinishOpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteRecovery(bool defer);
  void FinalizeStatements();
  absl::StatusOr<std::vector<SocketTenantRow>> ReadSocketTenants() const;
  // PRAGMA quick_check: FAILED_PRECONDITION naming the damage.
  absl::Status QuickCheck();
  // The tables are this ledger's (columns, types, primary keys).
  absl::Status SchemaCheck();
  absl::Status Recover(int64_t now_ns, bool defer);
  // The first column of the one row `sql` answers, on the write connection.
  absl::StatusOr<int64_t> SingleInt(const std::string& sql) const;
  // FAILED_PRECONDITION "damaged (N `what`)" when `count_sql` counts any.
  absl::Status DamagedIfAny(const std::string& count_sql, absl::string_view what);
  absl::Status WriteQuotas(const std::vector<QuotaRow>& quotas);
  absl::Status InsertEvent(const LedgerEvent& e);
  // `start` and `end` may be stored as a pair: made and ended in one commit,
  // saying nothing but tenant, uid, pid, session, device, bytes, id and the
  // end's kind (no detail), the end at most kFoldSpan seqs after the start.
  // A pair is one element of a JSON array in a `pair_rows` row, which holds
  // one tenant's pairs of up to kFoldSpan consecutive seqs; every other
  // event is a row of `event_rows`.
  static bool Foldable(const LedgerEvent& start, const LedgerEvent& end);
  // One tenant's pairs being gathered into a pair_rows row.
  struct PairChunk {
    std::string tenant;
    uint64_t first_seq = 0, last_seq = 0, max_allocation_id = 0;
    std::string pairs;  // the JSON array, without its closing bracket
  };
  static void AppendPair(PairChunk* chunk, const LedgerEvent& start, const LedgerEvent& end);
  // Writes the chunk's row (nothing if it is empty) and empties it.
  absl::Status InsertPairs(PairChunk* chunk);
  // Binds `e` to columns first..first+10 of `s`.
  static void BindEvent(sqlite3_stmt* s, int first, const LedgerEvent& e);
  // PATH is still the file Open opened.
  absl::Status CheckFile() const;

  std::string path_;
  int lock_fd_ = -1;
  // The write connection; every use after Open holds write_mu_.
  mutable absl::Mutex write_mu_;
  sqlite3* db_ = nullptr;
  sqlite3* reader_ = nullptr;
  mutable absl::Mutex reader_mu_;
  sqlite3_stmt* insert_event_ = nullptr;
  sqlite3_stmt* insert_live_ = nullptr;
  sqlite3_stmt* delete_live_ = nullptr;
  sqlite3_stmt* upsert_usage_ = nullptr;
  sqlite3_stmt* insert_pairs_ = nullptr;
  uint64_t id_reserved_ = 0;
  bool migrate_events_table_ = false;  // Open found format 1's events table
  // Commit's scratch, kept to reuse its memory (under write_mu_).
  std::vector<int32_t> fold_end_;
  std::vector<uint8_t> net_zero_;
  absl::flat_hash_map<uint64_t, size_t> open_;
  std::vector<PairChunk> chunks_;
  absl::flat_hash_map<absl::string_view, size_t> chunk_of_;  // tenant -> chunks_ index
  dev_t file_dev_ = 0;
  ino_t file_ino_ = 0;
  std::atomic<int> wal_pages_{0};  // set by the WAL hook after each commit
  Recovery recovery_;
  std::vector<UsageAccount::Key> recovery_changed_;  // usage rows the recovery writes
  int64_t max_page_count_ = 0;
  bool defer_ = false;
  bool connected_ = false;  // db_ is open with its pragmas set
  // Opened on a full disk (see pending()).
  bool pending_ = false;
  absl::Status pending_error_;
  std::vector<SocketTenantRow> pending_socket_tenants_;
  uint64_t last_seq_ = 0;         // the highest seq in the file
  uint64_t last_seq_commit_ = 0;  // of the commit in progress
  uint64_t retained_through_ = 0;  // meta retained_through
  // The churn cap (SetChurnCap), under write_mu_: per tenant, the second
  // its last stored pair ended in and how many it stored then; what one
  // commit folds, per (tenant, kind).
  struct ChurnWindow {
    int64_t second = -1;
    uint64_t stored = 0;
  };
  struct ChurnFold {
    uint64_t events = 0, bytes = 0;
    int64_t first_ns = 0, last_ns = 0;
  };
  uint64_t churn_cap_ = 0;
  absl::flat_hash_map<std::string, ChurnWindow> churn_;
  absl::flat_hash_map<std::pair<std::string, std::string>, ChurnFold> churn_folds_;
  uint64_t churn_folded_ = 0;  // pairs, committed
};

}  // namespace ledger
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_LEDGER_LEDGER_STORE_H_
