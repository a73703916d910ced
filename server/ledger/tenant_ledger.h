// TenantLedger: the durable record of who used what, fed from the broker's
// commit points and written to SQLite (ledger_store.h) by its own thread.
//
// Invariants: nothing the serving threads call waits for SQLite (Append
// numbers an event and queues it under one short lock, so the broker may
// call it under its own; the writer commits without that lock); events are
// committed in order; the writer runs below the serving threads, so a
// commit never holds a core a request wants; a failing disk never stops
// allocations, and what it costs is counted (no event lost until max_held
// wait; then the oldest go, counted, and a LEDGER_GAP records it); usage,
// peak and byte-seconds in memory stay exact; kill -9 loses at most the
// batch in flight. With no path (--ledger=none) nothing is written or read
// back: usage is still folded, for this run only, Query is
// FAILED_PRECONDITION and SocketTenants() is empty. Thread-safe.
#ifndef GPUMEMD_SERVER_LEDGER_TENANT_LEDGER_H_
#define GPUMEMD_SERVER_LEDGER_TENANT_LEDGER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ledger/ledger_event.h"
#include "server/ledger/ledger_store.h"
#include "server/ledger/usage_account.h"

namespace gpumem {
namespace ledger {

struct LedgerOptions {
  std::string path;  // empty: no ledger file
  // The writer commits queued events in one transaction each time
  // max_batch are queued or max_delay has passed since the last commit,
  // whichever is first.
  absl::Duration max_delay = absl::Milliseconds(100);
  size_t max_batch = 4096;
  // A commit that fails (disk full, I/O error, the file removed or replaced
  // under the daemon: see LedgerStore::Commit) is logged loudly on stderr;
  // its events stay queued in memory and are retried, at most max_held of
  // them: beyond that the oldest are dropped and counted. Usage, peak and
  // byte-seconds stay exact (folded from every event, dropped ones
  // included, and written with the next commit that works). When a commit
  // works again, a LEDGER_GAP event records when writes failed, why, and
  // how many events were dropped; stats() says so meanwhile.
  size_t max_held = 1000000;
  // The writer thread's nice value (setpriority on its thread id; 0 leaves
  // it as the daemon's other threads).
  int writer_nice = 10;
  // The writer runs at idle priority (SCHED_IDLE: only on a core no other
  // thread wants, and any thread that wakes takes the core from it at once)
  // while it keeps up, and as a normal thread at writer_nice while the queue
  // is two batches or two delays long (or someone waits in Flush or Close),
  // until it has caught up. Only where it may leave idle priority again
  // (RLIMIT_NICE or CAP_SYS_NICE); else it stays at writer_nice. On a
  // machine whose every core is busy, an idle-priority writer waits for the
  // scheduler's sliver, so kill -9 may then lose more than max_delay's worth.
  bool writer_idle = true;
  // The writer runs a PASSIVE checkpoint after a commit once the WAL holds
  // this many pages (SQLite's own automatic checkpoint is off, so no
  // checkpoint runs anywhere else).
  int checkpoint_pages = 4000;
  // Past this many WAL pages (about 250 MiB of 4 KiB pages) checkpoints
  // are being kept from resetting the WAL (a reader holds a read
  // transaction open: commits go on, the WAL grows): said on stderr once a
  // minute, naming the file, and counted in stats() (blocked_checkpoints).
  int wal_warn_pages = 64000;
  int64_t max_page_count = 0;  // tests: see LedgerStore::Open
  // Retention (retain_events > 0): after a commit, and while idle, the
  // writer folds the events more than retain_events seqs old into
  // per-tenant, per-kind summary rows (`retained`) and deletes them, at most
  // retain_batch seqs per transaction; usage is its own table and stays
  // exact. So under steady churn the file stops growing: SQLite reuses the
  // freed pages.
  uint64_t retain_events = 0;
  uint64_t retain_batch = 8192;
  // The churn cap (LedgerStore::SetChurnCap): one tenant's pairs stored
  // per second; the rest are folded into `retained` at once. 0: none. The
  // daemon sets kChurnPairsPerSecond.
  uint64_t churn_pairs_per_second = 0;
  // The daemon may carry on with what the last one left (server/restart/):
  // live allocations are not closed at Open but reconciled by Resume.
  bool defer_recovery = false;
};

struct WriterStats {
  uint64_t committed_events = 0;
  uint64_t commits = 0;
  uint64_t failed_commits = 0;
  uint64_t dropped_events = 0;
  uint64_t held_events = 0;         // taken by the writer, not yet committed
  bool failing = false;             // the last commit failed
  std::string last_error;           // while failing: that commit's error (names the file)
  int64_t writer_cpu_ns = 0;        // the writer thread's CPU time so far
  bool writer_idle = false;         // at idle priority now
  uint64_t writer_promotions = 0;   // times a backlog or a wait raised it
  int64_t commit_ns = 0;            // wall time in Commit, all commits
  int64_t max_commit_ns = 0;        // the longest Commit
  uint64_t checkpoints = 0;         // PASSIVE checkpoints run by the writer
  uint64_t blocked_checkpoints = 0;  // of those, ones a reader kept from finishing
  int64_t checkpoint_ns = 0;        // wall time in them
  int64_t wal_pages = 0;            // the WAL's pages after the last commit or checkpoint
  uint64_t retained_rows = 0;       // event and pair rows folded and deleted by retention
  uint64_t retained_through = 0;    // every row wholly at or below this seq is folded
  uint64_t churn_folded_pairs = 0;  // pairs the churn cap folded, not stored as events
};

// The daemon's churn cap: pairs stored per tenant and second.
inline constexpr uint64_t kChurnPairsPerSecond = 1000;

class TenantLedger {
 public:
  // Opens the file (recovering after a crash, see ledger_store.h) and starts
  // the writer. Errors name the path and carry SQLite's message. A disk full
  // at Open still opens (LedgerStore::pending): the ledger starts failing
  // (stats().failing, last_error naming the file), events and a
  // ReplaceQuotas are held and retried, and the first commit the disk takes
  // writes the recovery, the held events and the LEDGER_GAP. A corrupt or
  // unreadable file still fails Open.
  static absl::StatusOr<std::unique_ptr<TenantLedger>> Open(LedgerOptions options);
  ~TenantLedger();

  bool enabled() const { return store_ != nullptr; }
  const std::string& path() const { return options_.path; }
  // The first allocation id this run may use (never used by earlier runs).
  uint64_t first_allocation_id() const { return first_allocation_id_; }
  // DAEMON_RESTART events written at Open.
  size_t restart_event_count() const { return restart_event_count_; }

  // Queues `e` (seq is assigned; time_ns too when 0).
  void Append(LedgerEvent e);

  // With defer_recovery, once the daemon knows what survived the restart:
  // every allocation the ledger had live that is not among `survivors` is
  // closed: with DAEMON_RESTART when the restart ended it (it is in
  // `closed`, with why, or nothing is known: `ended_before_ns` 0), else
  // (the daemon's own records show it ended before the crash, its event
  // lost with the daemon's last batch) with FREE at `ended_before_ns`;
  // every survivor the ledger had not recorded yet (made in the
  // last moments before the crash) gets its ALLOCATE, at its own time; then
  // one DAEMON_RESUMED event with `summary`. Usage, peak and byte-seconds
  // continue from where they were. Returns the number of closures.
  size_t Resume(const std::vector<LedgerEvent>& survivors,
                const std::map<uint64_t, std::string>& closed, const std::string& summary,
                int64_t ended_before_ns = 0);
  // What Open found live (defer_recovery), by allocation id.
  const std::map<uint64_t, LedgerEvent>& deferred_live() const { return deferred_live_; }
  // Records a quota in the quotas table with the next commit.
  void SetQuota(QuotaRow row);
  // Replaces the quotas table now (start-up: the config's quotas).
  absl::Status ReplaceQuotas(const std::vector<QuotaRow>& rows);
  // The socket tenants table, written at once, not queued (PutSocketTenant
  // returns once the row is committed); the error names the file.
  absl::Status PutSocketTenant(const SocketTenantRow& row);
  absl::Status DeleteSocketTenant(const std::string& name);
  absl::StatusOr<std::vector<SocketTenantRow>> SocketTenants() const;

  // Waits until every event appended before the call is committed; OK, or
  // UNAVAILABLE with SQLite's message while writes fail.
  absl::Status Flush();
  absl::StatusOr<std::vector<LedgerEvent>> Query(const EventQuery& query) const;
  // Usage (current, peak, byte-seconds per tenant and device), folded from
  // the events by the writer; answered from memory.
  std::map<UsageAccount::Key, UsageRow> Usage() const;
  // One snapshot, taken under the ledger's lock.
  WriterStats stats() const;

  // Commits what is queued and stops the writer (the destructor too).
  void Close();

  // Tests: see LedgerStore::SetMaxPageCount.
  void SetMaxPageCountForTest(int64_t pages);

 private:
  explicit TenantLedger(LedgerOptions options) : options_(std::move(options)) {}
  void WriterLoop();
  bool WorkReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An idle-priority writer becomes a normal (niced) thread.
  void PromoteWriter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LedgerOptions options_;
  std::unique_ptr<LedgerStore> store_;
  uint64_t first_allocation_id_ = 1;
  size_t restart_event_count_ = 0;
  std::map<uint64_t, LedgerEvent> deferred_live_;

  mutable absl::Mutex mu_;
  std::vector<LedgerEvent> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<QuotaRow> quota_queue_ ABSL_GUARDED_BY(mu_);
  // A ReplaceQuotas the full disk refused, written by the writer when it can.
  std::optional<std::vector<QuotaRow>> held_replace_ ABSL_GUARDED_BY(mu_);
  // Opened on a full disk: when (the writer starts in its outage).
  int64_t open_failed_ns_ = 0;
  uint64_t recovered_seq_ = 0;  // the last seq Open's recovery numbered
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t committed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flush_wanted_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  WriterStats stats_ ABSL_GUARDED_BY(mu_);
  pid_t writer_tid_ ABSL_GUARDED_BY(mu_) = 0;
  bool writer_idle_ ABSL_GUARDED_BY(mu_) = false;   // SCHED_IDLE now
  bool idle_capable_ ABSL_GUARDED_BY(mu_) = false;  // may go idle and come back

  mutable absl::Mutex usage_mu_;
  UsageAccount usage_ ABSL_GUARDED_BY(usage_mu_);

  std::thread writer_;
};

}  // namespace ledger
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_LEDGER_TENANT_LEDGER_H_
