// The writer owns everything between the queue and the file: the events
// held for retry, the set of usage rows changed since the last commit, the
// outage record that becomes a LEDGER_GAP event, and the WAL's checkpoints.
// It runs niced, so the serving threads take the core first whenever they
// want it.
#include "server/ledger/tenant_ledger.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <iostream>
#include <iterator>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gpumem {
namespace ledger {
namespace {

std::string TimeText(int64_t ns) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixNanos(ns), absl::UTCTimeZone());
}

int64_t ThreadCpuNs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
}

int64_t MonotonicNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TenantLedger>> TenantLedger::Open(LedgerOptions options) {
  std::unique_ptr<TenantLedger> ledger(new TenantLedger(std::move(options)));
  if (!ledger->options_.path.empty()) {
    absl::StatusOr<std::unique_ptr<LedgerStore>> store = LedgerStore::Open(
        ledger->options_.path, absl::GetCurrentTimeNanos(), ledger->options_.max_page_count,
        ledger->options_.defer_recovery);
    if (!store.ok()) return store.status();
    ledger->store_ = std::move(*store);
    ledger->store_->SetChurnCap(ledger->options_.churn_pairs_per_second);
    const LedgerStore::Recovery& r = ledger->store_->recovery();
    ledger->first_allocation_id_ = r.first_allocation_id;
    ledger->restart_event_count_ = r.restart_events.size();
    for (const LedgerEvent& e : r.live) ledger->deferred_live_[e.allocation_id] = e;
    absl::MutexLock lock(&ledger->mu_);
    ledger->next_seq_ = r.next_seq;
    ledger->committed_seq_ = r.next_seq - 1;
    ledger->recovered_seq_ = r.next_seq - 1;
    if (ledger->store_->pending()) {
      // The disk is full: serve, hold, and write it all once it can.
      const absl::Status why = ledger->store_->pending_error();
      ledger->open_failed_ns_ = absl::GetCurrentTimeNanos();
      ledger->committed_seq_ = r.next_seq - 1 - r.restart_events.size();
      ledger->stats_.failing = true;
      ledger->stats_.failed_commits = 1;
      ledger->stats_.last_error = std::string(why.message());
      std::cerr << "gpumemd: LEDGER WRITE FAILED at start: " << why.message()
                << "; serving anyway: events are held in memory (at most "
                << ledger->options_.max_held
                << ") and written, with a LEDGER_GAP event, once the disk takes them"
                << std::endl;
    }
    absl::MutexLock usage(&ledger->usage_mu_);
    ledger->usage_ = r.usage;
  }
  TenantLedger* self = ledger.get();
  ledger->writer_ = std::thread([self] { self->WriterLoop(); });
  return ledger;
}

TenantLedger::~TenantLedger() { Close(); }

void TenantLedger::Close() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    PromoteWriter();  // the last commit is someone's wait
  }
  if (writer_.joinable()) writer_.join();
}

void TenantLedger::Append(LedgerEvent e) {
  if (e.time_ns == 0) e.time_ns = absl::GetCurrentTimeNanos();
  absl::MutexLock lock(&mu_);
  e.seq = next_seq_++;
  queue_.push_back(std::move(e));
  // An idle-priority writer gets no core while the machine is busy: once
  // the queue is two batches or two delays long, it runs as a normal
  // (niced) thread until it has caught up.
  if (writer_idle_ && (queue_.size() >= 2 * options_.max_batch ||
                       queue_.back().time_ns - queue_.front().time_ns >
                           2 * absl::ToInt64Nanoseconds(options_.max_delay))) {
    PromoteWriter();
  }
}

void TenantLedger::PromoteWriter() {
  if (!writer_idle_ || !idle_capable_) return;
  sched_param param{};
  if (sched_setscheduler(writer_tid_, SCHED_OTHER, &param) != 0) {
    // Checked at start (see WriterLoop); should this fail anyway, say so
    // once and stop trying (the writer stays idle, and stats() says so).
    std::cerr << "gpumemd: ledger writer: cannot leave idle priority: " << strerror(errno)
              << std::endl;
    idle_capable_ = false;
    return;
  }
  writer_idle_ = false;
  ++stats_.writer_promotions;
}

void TenantLedger::SetQuota(QuotaRow row) {
  absl::MutexLock lock(&mu_);
  quota_queue_.push_back(std::move(row));
}

absl::Status TenantLedger::ReplaceQuotas(const std::vector<QuotaRow>& rows) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::Status s = store_->ReplaceQuotas(rows);
  if (!absl::IsResourceExhausted(s)) return s;
  // The disk is full: the writer writes them when it can (before the
  // SetQuota rows queued after this call).
  std::cerr << "gpumemd: ledger " << options_.path << ": quotas held until the disk takes them: "
            << s.message() << std::endl;
  absl::MutexLock lock(&mu_);
  held_replace_ = rows;
  quota_queue_.clear();
  return absl::OkStatus();
}

absl::Status TenantLedger::PutSocketTenant(const SocketTenantRow& row) {
  if (store_ == nullptr) return absl::OkStatus();
  return store_->PutSocketTenant(row);
}

absl::Status TenantLedger::DeleteSocketTenant(const std::string& name) {
  if (store_ == nullptr) return absl::OkStatus();
  return store_->DeleteSocketTenant(name);
}

absl::StatusOr<std::vector<SocketTenantRow>> TenantLedger::SocketTenants() const {
  if (store_ == nullptr) return std::vector<SocketTenantRow>();
  return store_->SocketTenants();
}

bool TenantLedger::WorkReady() const {
  return stopping_ || queue_.size() >= options_.max_batch || flush_wanted_ > committed_seq_;
}

absl::Status TenantLedger::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = next_seq_ - 1;
  if (committed_seq_ >= target) return absl::OkStatus();
  flush_wanted_ = std::max(flush_wanted_, target);
  PromoteWriter();  // someone waits for this commit
  const uint64_t failures_before = stats_.failed_commits;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_seq_ >= target || stats_.failed_commits > failures_before ||
           (stopping_ && queue_.empty());
  };
  mu_.Await(absl::Condition(&done));
  if (committed_seq_ >= target) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "the ledger cannot write ", options_.path, " now: ", stats_.last_error,
      " (events are held in memory and retried)"));
}

absl::StatusOr<std::vector<LedgerEvent>> TenantLedger::Query(const EventQuery& query) const {
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(
        "the ledger is off (gpumemd runs with --ledger=none): no events are kept");
  }
  return store_->Query(query);
}

std::map<UsageAccount::Key, UsageRow> TenantLedger::Usage() const {
  absl::MutexLock lock(&usage_mu_);
  return usage_.rows();
}

WriterStats TenantLedger::stats() const {
  absl::MutexLock lock(&mu_);
  WriterStats s = stats_;
  s.writer_idle = writer_idle_;
  return s;
}

void TenantLedger::SetMaxPageCountForTest(int64_t pages) {
  if (store_ != nullptr) store_->SetMaxPageCount(pages);
}

void TenantLedger::WriterLoop() {
  pthread_setname_np(pthread_self(), "gpumemd-ledger");
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  if (options_.writer_nice != 0) {
    // On Linux a nice value is per thread (setpriority on the thread id).
    if (setpriority(PRIO_PROCESS, tid, options_.writer_nice) != 0) {
      std::cerr << "gpumemd: ledger writer: cannot set nice " << options_.writer_nice << ": "
                << strerror(errno) << std::endl;
    }
  }
  // Idle priority (SCHED_IDLE): the writer runs only on a core nothing else
  // wants, and any serving thread that wakes takes the core from it at once.
  // Leaving it again (PromoteWriter) needs RLIMIT_NICE to allow the writer's
  // nice value, or CAP_SYS_NICE: without either the writer stays a niced
  // normal thread, as it could never catch up under load.
  {
    const int nice = getpriority(PRIO_PROCESS, tid);
    rlimit limit{};
    bool can_return = getrlimit(RLIMIT_NICE, &limit) == 0 &&
                      (limit.rlim_cur == RLIM_INFINITY ||
                       static_cast<rlim_t>(20 - nice) <= limit.rlim_cur);
    if (!can_return && nice > -20 && setpriority(PRIO_PROCESS, tid, nice - 1) == 0) {
      can_return = true;  // CAP_SYS_NICE: it could even go below its nice value
      setpriority(PRIO_PROCESS, tid, nice);
    }
    bool idle = false;
    if (options_.writer_idle && can_return) {
      sched_param param{};
      idle = sched_setscheduler(0, SCHED_IDLE, &param) == 0;
    } else if (options_.writer_idle) {
      std::cerr << "gpumemd: ledger writer: runs at nice " << nice
                << ", not idle priority: leaving idle priority under load needs "
                   "RLIMIT_NICE of at least "
                << 20 - nice << " (systemd: LimitNICE=+" << nice << ") or CAP_SYS_NICE"
                << std::endl;
    }
    absl::MutexLock lock(&mu_);
    writer_tid_ = tid;
    idle_capable_ = idle;
    writer_idle_ = idle;
  }
  std::vector<LedgerEvent> held;  // taken from the queue, not yet committed
  std::vector<QuotaRow> quotas;
  absl::flat_hash_set<UsageAccount::Key> changed;
  int64_t last_wal_shout_ns = 0;
  uint64_t highest_id = 0;
  // The outage in progress, if any.
  int64_t failing_since_ns = open_failed_ns_;
  uint64_t failed_commits = open_failed_ns_ != 0 ? 1 : 0;
  uint64_t dropped = 0;
  int64_t last_shout_ns = open_failed_ns_;
  std::string last_error;
  std::optional<std::vector<QuotaRow>> replace;  // a held ReplaceQuotas
  if (open_failed_ns_ != 0) last_error = std::string(store_->pending_error().message());
  int64_t last_retain_shout_ns = 0;
  // One retention batch (see tenant_ledger.h); true when more is due.
  auto retain = [&]() -> bool {
    if (store_ == nullptr || options_.retain_events == 0) return false;
    absl::StatusOr<LedgerStore::RetainResult> r =
        store_->Retain(options_.retain_events, options_.retain_batch);
    if (!r.ok()) {
      const int64_t now = absl::GetCurrentTimeNanos();
      if (now - last_retain_shout_ns > 60'000'000'000LL) {
        last_retain_shout_ns = now;
        std::cerr << "gpumemd: ledger retention: " << r.status().message() << std::endl;
      }
      return false;
    }
    if (r->through_seq == 0) return false;
    absl::MutexLock lock(&mu_);
    stats_.retained_rows += r->rows_deleted;
    stats_.retained_through = r->through_seq;
    return r->more;
  };
  // The queue's buffer and this one trade places at every swap, so Append
  // pushes into memory a batch already used (no reallocation or page fault
  // on the serving path once the batches have their usual size).
  std::vector<LedgerEvent> fresh;
  fresh.reserve(2 * options_.max_batch);
  held.reserve(2 * options_.max_batch);
  for (;;) {
    bool stop;
    {
      // Only swaps under the lock, so Append never waits for the fold.
      absl::MutexLock lock(&mu_);
      if (failing_since_ns != 0) {
        // While commits fail, retry once per max_delay whatever is asked
        // (a Flush, a full batch): retrying at once would spin on a core.
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.max_delay);
      } else {
        mu_.AwaitWithTimeout(absl::Condition(this, &TenantLedger::WorkReady),
                             options_.max_delay);
      }
      stop = stopping_;
      if (held_replace_.has_value()) {
        replace = std::move(held_replace_);
        held_replace_.reset();
        quotas.clear();  // replaced
      }
      fresh.swap(queue_);
      for (QuotaRow& q : quota_queue_) quotas.push_back(std::move(q));
      quota_queue_.clear();
    }
    {
      // Fold only the new events (held may start with retried ones).
      absl::MutexLock usage(&usage_mu_);
      const LedgerEvent* last = nullptr;  // the last event that changed usage
      size_t folded = 0;
      for (const LedgerEvent& e : fresh) {
        // As in a commit (LedgerStore::Commit): the core goes to a serving
        // thread that wants it every so many events.
        if (++folded % 512 == 0) sched_yield();
        if (usage_.Apply(e)) {
          // Runs of one tenant on one device are the common case.
          if (last == nullptr || last->device != e.device || last->tenant != e.tenant) {
            changed.insert({e.tenant, e.device});
            changed.insert({e.tenant, UsageAccount::kAllDevices});
          }
          last = &e;
        }
        if (e.kind == EventKind::kAllocate) highest_id = std::max(highest_id, e.allocation_id);
      }
    }
    if (held.empty()) {
      held.swap(fresh);  // fresh is now the empty buffer held had
    } else {
      std::move(fresh.begin(), fresh.end(), std::back_inserter(held));
      fresh.clear();
    }
    const bool pending = store_ != nullptr && failing_since_ns != 0 && store_->pending();
    if (held.empty() && quotas.empty() && !replace.has_value() && !pending) {
      if (stop) return;
      // Idle: old events are folded away meanwhile (a few batches a wake).
      for (int i = 0; i < 8 && retain(); ++i) {
      }
      continue;
    }
    absl::Status s = absl::OkStatus();
    int64_t commit_ns = 0;
    if (store_ != nullptr) {
      std::vector<UsageAccount::Key> keys(changed.begin(), changed.end());
      const int64_t t0 = MonotonicNs();
      if (replace.has_value()) {
        s = store_->ReplaceQuotas(*replace);
        if (s.ok()) replace.reset();
      }
      if (s.ok()) {
        absl::MutexLock usage(&usage_mu_);
        s = store_->Commit(held, usage_, keys, quotas, highest_id);
      }
      commit_ns = MonotonicNs() - t0;
    }
    // A checkpoint after a commit that worked, once the WAL is long enough:
    // here, on the niced writer, never on a commit of anyone else's.
    bool checkpointed = false, blocked = false;
    int64_t checkpoint_ns = 0;
    int wal_pages = 0;
    if (s.ok()) retain();
    if (store_ != nullptr && s.ok()) {
      wal_pages = store_->wal_pages();
      if (wal_pages >= options_.checkpoint_pages) {
        const int64_t t0 = MonotonicNs();
        absl::StatusOr<LedgerStore::CheckpointResult> c = store_->Checkpoint();
        checkpoint_ns = MonotonicNs() - t0;
        checkpointed = true;
        blocked = !c.ok() || c->copied < c->wal_pages;
        wal_pages = store_->wal_pages();
        const int64_t now = absl::GetCurrentTimeNanos();
        if (wal_pages > options_.wal_warn_pages &&
            now - last_wal_shout_ns > 60'000'000'000LL) {
          last_wal_shout_ns = now;
          std::cerr << "gpumemd: ledger " << options_.path << ": its WAL holds " << wal_pages
                    << " pages that cannot be checkpointed: a reader keeps a read "
                       "transaction open on the file (an sqlite3 shell left in BEGIN, or a "
                       "long SELECT); the WAL grows until it ends. Commits go on."
                    << std::endl;
        }
      }
    }
    absl::MutexLock lock(&mu_);
    stats_.commit_ns += commit_ns;
    stats_.max_commit_ns = std::max(stats_.max_commit_ns, commit_ns);
    if (checkpointed) {
      ++stats_.checkpoints;
      stats_.checkpoint_ns += checkpoint_ns;
      if (blocked) ++stats_.blocked_checkpoints;
    }
    if (store_ != nullptr && s.ok()) {
      stats_.wal_pages = wal_pages;
      stats_.churn_folded_pairs = store_->churn_folded_pairs();
    }
    stats_.writer_cpu_ns = ThreadCpuNs();
    stats_.failing = !s.ok();
    if (s.ok()) {
      // The recovery's own events (written by the first commit after a
      // start on a full disk) are committed too.
      committed_seq_ = std::max(committed_seq_, recovered_seq_);
      if (!held.empty()) committed_seq_ = std::max(committed_seq_, held.back().seq);
      stats_.committed_events += held.size();
      ++stats_.commits;
      held.clear();
      if (held.capacity() > 8 * options_.max_batch) {
        // After an outage held every event for a while: give that back.
        std::vector<LedgerEvent>().swap(held);
        held.reserve(2 * options_.max_batch);
      }
      quotas.clear();
      changed.clear();
      if (failing_since_ns != 0) {
        const int64_t now = absl::GetCurrentTimeNanos();
        LedgerEvent gap;
        gap.time_ns = now;
        gap.kind = EventKind::kLedgerGap;
        gap.bytes = dropped;
        gap.detail = absl::StrCat("ledger writes failed from ", TimeText(failing_since_ns),
                                  " to ", TimeText(now), " (", failed_commits,
                                  " failed commits; last error: ", last_error, "); ", dropped,
                                  " events dropped");
        std::cerr << "gpumemd: ledger " << options_.path << " is written again: "
                  << gap.detail << std::endl;
        gap.seq = next_seq_++;
        queue_.push_back(std::move(gap));
        failing_since_ns = 0;
        failed_commits = 0;
        dropped = 0;
        stats_.last_error.clear();
      }
      stats_.held_events = 0;
      if (!writer_idle_ && idle_capable_ && !stopping_ && flush_wanted_ <= committed_seq_ &&
          queue_.size() < options_.max_batch) {
        // Caught up: back to idle priority (always allowed).
        sched_param param{};
        writer_idle_ = sched_setscheduler(0, SCHED_IDLE, &param) == 0;
      }
    } else {
      const int64_t now = absl::GetCurrentTimeNanos();
      if (failing_since_ns == 0) failing_since_ns = now;
      ++failed_commits;
      ++stats_.failed_commits;
      last_error = std::string(s.message());
      stats_.last_error = last_error;
      if (held.size() > options_.max_held) {
        const size_t excess = held.size() - options_.max_held;
        held.erase(held.begin(), held.begin() + excess);
        dropped += excess;
        stats_.dropped_events += excess;
      }
      stats_.held_events = held.size();
      if (now - last_shout_ns > 10'000'000'000LL) {
        last_shout_ns = now;
        std::cerr << "gpumemd: LEDGER WRITE FAILED: " << s.message() << "; " << held.size()
                  << " events held in memory and retried, " << dropped
                  << " dropped so far; allocations are still served" << std::endl;
      }
      if (stop && replace.has_value()) {
        std::cerr << "gpumemd: ledger " << options_.path
                  << ": the config's quotas could not be written before exit" << std::endl;
      }
      if (stop) {
        std::cerr << "gpumemd: ledger " << options_.path << ": " << held.size()
                  << " events could not be written before exit" << std::endl;
        return;
      }
    }
    if (stop && queue_.empty() && held.empty()) return;
  }
}

size_t TenantLedger::Resume(const std::vector<LedgerEvent>& survivors,
                            const std::map<uint64_t, std::string>& closed,
                            const std::string& summary, int64_t ended_before_ns) {
  std::set<uint64_t> alive;
  for (const LedgerEvent& e : survivors) alive.insert(e.allocation_id);
  size_t closures = 0;
  const int64_t now = absl::GetCurrentTimeNanos();
  for (const auto& [id, e] : deferred_live_) {
    if (alive.count(id) != 0) continue;
    LedgerEvent c = e;
    c.seq = 0;
    auto why = closed.find(id);
    if (why == closed.end() && ended_before_ns > 0) {
      // Ended before the crash; its event was in the batch the crash lost.
      c.time_ns = std::max(ended_before_ns, e.time_ns);
      c.kind = EventKind::kFree;
      c.detail = "ended before the daemon stopped; its event was lost with the daemon";
      Append(std::move(c));
      continue;
    }
    c.time_ns = now;
    c.kind = EventKind::kDaemonRestart;
    c.detail = why != closed.end() ? why->second
                                   : "live when the previous daemon stopped; did not survive";
    Append(std::move(c));
    ++closures;
  }
  for (const LedgerEvent& e : survivors) {
    if (deferred_live_.count(e.allocation_id) != 0) continue;
    LedgerEvent a = e;
    a.seq = 0;
    a.kind = EventKind::kAllocate;
    Append(std::move(a));
  }
  LedgerEvent r;
  r.kind = EventKind::kDaemonResumed;
  r.time_ns = now;
  r.device = -1;
  r.bytes = survivors.size();
  r.detail = summary;
  Append(std::move(r));
  deferred_live_.clear();
  return closures;
}

}  // namespace ledger
}  // namespace gpumem
