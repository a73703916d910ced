// See admission.h. The admission thread sleeps until something is due: a
// pass (serve_), an ended session, a cancel, a reclaim answer, the earliest
// deadline, the end of the reservation, or stop. It collects what is due
// under the lock and answers outside it; a pass tries the waiters one by
// one, taking the lock only to find each (and to count bypasses).
//
// Invariants (under mu_):
//  - every entry's (deadline, ticket) is in deadlines_, and nothing else;
//  - reserving_ is 0 or the ticket of a live entry, and has_reservation_
//    says which; entry_count_ == entries_.size().
#include "server/admission/admission.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "server/session/session.h"

namespace gpumem {
namespace admission {

Admission::Admission(AdmissionOptions options)
    : options_(options), max_wait_(options.max_wait) {
  if (options_.bypass_limit == 0) options_.bypass_limit = 1;
  thread_ = std::thread([this] { Run(); });
}

Admission::~Admission() { Stop(); }

uint64_t Admission::kicks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kicks_;
}

absl::Status Admission::CheckWait(uint64_t wait_ms) const {
  if (max_wait_ <= absl::ZeroDuration() || absl::Milliseconds(wait_ms) <= max_wait_) {
    return absl::OkStatus();
  }
  const int64_t max_ms = absl::ToInt64Milliseconds(max_wait_);
  return absl::InvalidArgumentError(absl::StrCat(
      "wait_ms ", wait_ms, " exceeds --max_wait_ms=", max_ms,
      " (DaemonConfig.max_wait_ms): a request may wait at most ", max_ms, " ms"));
}

absl::StatusOr<uint64_t> Admission::Enqueue(std::unique_ptr<Waiter>& waiter, uint64_t seen) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return stop_answer_;
  const uint32_t limit =
      waiter->max_waiting() > 0 ? waiter->max_waiting() : options_.max_waiting_per_tenant;
  uint32_t& count = per_tenant_[waiter->tenant()];
  if (count >= limit) {
    const uint32_t waiting = count;
    if (count == 0) per_tenant_.erase(waiter->tenant());
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", waiter->tenant_name(), "\" has ", waiting,
        " requests waiting for memory already, its limit (max_waiting_requests ", limit,
        "); retry later or without wait_ms"));
  }
  const uint64_t bytes_limit = options_.max_waiting_bytes_per_tenant;
  if (bytes_limit > 0) {
    auto held = bytes_per_tenant_.find(waiter->tenant());
    const uint64_t now = held == bytes_per_tenant_.end() ? 0 : held->second;
    if (waiter->held_bytes() > bytes_limit || now > bytes_limit - waiter->held_bytes()) {
      const uint32_t waiting = count;  // `count` goes with the entry below
      if (waiting == 0) per_tenant_.erase(waiter->tenant());
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", waiter->tenant_name(), "\" has ", waiting,
          " requests waiting for memory holding ", FormatBytes(now), " of the daemon's memory; ",
          "this one (", FormatBytes(waiter->held_bytes()), ") would pass the limit of ",
          FormatBytes(bytes_limit), " (--max_waiting_bytes_per_tenant=", bytes_limit,
          ", DaemonConfig.max_waiting_bytes_per_tenant); retry later or without wait_ms"));
    }
  }
  ++count;
  if (waiter->held_bytes() > 0) bytes_per_tenant_[waiter->tenant()] += waiter->held_bytes();
  const uint64_t ticket = next_ticket_++;
  Entry& e = entries_[ticket];
  e.order = order_.Add(waiter->priority(), ticket);
  e.deadline = waiter->deadline();
  e.wants_room = waiter->WantsRoom();  // still the caller's: no race
  e.reclaim_pending.insert(waiter->reclaim_from().begin(), waiter->reclaim_from().end());
  if (!waiter->reclaim_from().empty() && e.reclaim_pending.empty()) {
    e.deadline = std::min(e.deadline, waiter->answered_deadline());
  }
  deadlines_.emplace(e.deadline, ticket);
  e.waiter = std::move(waiter);
  entry_count_.store(entries_.size());
  if (kicks_ != seen) serve_ = true;  // room came back after the caller's try
  wake_.notify_one();
  return ticket;
}

void Admission::Kick() {
  std::lock_guard<std::mutex> lock(mu_);
  ++kicks_;
  if (entries_.empty()) return;
  serve_ = true;
  wake_.notify_one();
}

void Admission::SessionEnded(uint64_t session) {
  std::lock_guard<std::mutex> lock(mu_);
  ++kicks_;  // its memory went back
  if (entries_.empty()) return;
  ended_sessions_.push_back(session);
  serve_ = true;
  wake_.notify_one();
}

void Admission::Cancel(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!entries_.contains(ticket)) return;
  cancelled_.push_back(ticket);
  wake_.notify_one();
}

void Admission::ReclaimAnswered(uint64_t session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.empty()) return;
  reclaim_answered_.push_back(session);
  wake_.notify_one();
}

void Admission::NoteServed(int32_t priority) {
  if (entry_count_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  // A fresh request arrived after every waiter: it bypassed each that it
  // does not outrank. The earliest in serving order to reach the limit
  // reserves (BypassLocked picks by order, so the map's order is no matter).
  for (auto& [ticket, e] : entries_) {
    if (e.waiter->priority() >= priority && e.wants_room) BypassLocked(ticket, e);
  }
}

void Admission::BypassLocked(uint64_t ticket, Entry& e) {
  ++e.bypasses;
  if (e.bypasses < options_.bypass_limit) return;
  if (reserving_ != 0) {
    // One reservation at a time: an earlier waiter in serving order takes
    // it over (it is ahead of the one reserving now).
    auto cur = entries_.find(reserving_);
    if (cur == entries_.end() || !(e.order < cur->second.order)) return;
  }
  // Only where it could fit beside other tenants' blocks: holding room for
  // a request that cannot be served there only refuses the others.
  std::vector<uint32_t> fitting = e.waiter->FittingDevices();
  if (fitting.empty()) {
    e.bypasses = 0;  // passed over again, looked at again after as many
    ++reservations_declined_;
    return;
  }
  reserving_ = ticket;
  reserved_since_ = absl::Now();
  reservation_.claim = e.waiter->claim();
  reservation_.claim.devices = std::move(fitting);
  reservation_.priority = e.waiter->priority();
  ++reservations_made_;
  has_reservation_.store(true);
  wake_.notify_one();  // its end is a deadline of the thread's
}

void Admission::EndReservationLocked() {
  if (reserving_ == 0) return;
  auto it = entries_.find(reserving_);
  if (it != entries_.end()) it->second.bypasses = 0;
  reserving_ = 0;
  has_reservation_.store(false);
  serve_ = !entries_.empty();  // those held back are tried at once
}

std::optional<Reservation> Admission::AheadOfLocked(uint64_t ticket) const {
  if (reserving_ == 0 || reserving_ == ticket) return std::nullopt;
  auto r = entries_.find(reserving_);
  auto t = entries_.find(ticket);
  if (r == entries_.end() || t == entries_.end()) return std::nullopt;
  if (!(r->second.order < t->second.order)) return std::nullopt;
  return reservation_;
}

std::optional<Reservation> Admission::ReservationAhead(int32_t priority) const {
  if (!has_reservation_.load()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (reserving_ == 0 || reservation_.priority < priority) return std::nullopt;
  return reservation_;
}

void Admission::SetFairness(uint32_t bypass_limit, absl::Duration reserve_for) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.bypass_limit = std::max<uint32_t>(bypass_limit, 1);
  options_.reserve_for = reserve_for;
  wake_.notify_one();
}

void Admission::Stop(absl::Status answer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    if (!stopping_) stop_answer_ = std::move(answer);
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t Admission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

absl::flat_hash_map<uint32_t, uint32_t> Admission::waiting_by_tenant() const {
  std::lock_guard<std::mutex> lock(mu_);
  return per_tenant_;
}

bool Admission::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return asleep_ && !serve_ && ended_sessions_.empty() && cancelled_.empty() &&
         reclaim_answered_.empty();
}

bool Admission::reserving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserving_ != 0;
}

uint64_t Admission::reservations_made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reservations_made_;
}

uint64_t Admission::reservations_declined() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reservations_declined_;
}

absl::flat_hash_map<uint32_t, uint64_t> Admission::waiting_bytes_by_tenant() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_per_tenant_;
}

std::unique_ptr<Waiter> Admission::TakeLocked(uint64_t ticket) {
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return nullptr;
  std::unique_ptr<Waiter> w = std::move(it->second.waiter);
  order_.Remove(it->second.order);
  deadlines_.erase({it->second.deadline, ticket});
  if (reserving_ == ticket) EndReservationLocked();
  entries_.erase(it);
  entry_count_.store(entries_.size());
  return w;
}

void Admission::ReclaimDoneLocked(uint64_t session) {
  for (auto& [ticket, e] : entries_) {
    if (e.reclaim_pending.erase(session) == 0 || !e.reclaim_pending.empty()) continue;
    // Every session asked has answered: the hold is over.
    const absl::Time d = std::min(e.deadline, e.waiter->answered_deadline());
    if (d == e.deadline) continue;
    deadlines_.erase({e.deadline, ticket});
    e.deadline = d;
    deadlines_.emplace(d, ticket);
  }
}

void Admission::Answer(std::unique_ptr<Waiter> waiter, admission::Answer answer) {
  const uint32_t tenant = waiter->tenant();
  const uint64_t held = waiter->held_bytes();
  waiter->Done(std::move(answer));
  waiter.reset();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_tenant_.find(tenant);
  if (it != per_tenant_.end() && --it->second == 0) per_tenant_.erase(it);
  auto b = bytes_per_tenant_.find(tenant);
  if (held > 0 && b != bytes_per_tenant_.end()) {
    b->second -= std::min(b->second, held);
    if (b->second == 0) bytes_per_tenant_.erase(b);
  }
}

void Admission::Run() {
  for (;;) {
    std::vector<std::unique_ptr<Waiter>> exited, cancelled, stopped;
    std::vector<std::pair<std::unique_ptr<Waiter>, std::optional<Reservation>>> expired;
    std::vector<uint64_t> pass;
    bool stop = false;
    absl::Status stop_answer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto reservation_ends = [this] { return reserved_since_ + options_.reserve_for; };
      auto due = [&] {
        const absl::Time now = absl::Now();
        return stopping_ || serve_ || !ended_sessions_.empty() || !cancelled_.empty() ||
               !reclaim_answered_.empty() ||
               (!deadlines_.empty() && deadlines_.begin()->first <= now) ||
               (reserving_ != 0 && reservation_ends() <= now);
      };
      while (!due()) {
        absl::Time next = absl::InfiniteFuture();
        if (!deadlines_.empty()) next = deadlines_.begin()->first;
        if (reserving_ != 0) next = std::min(next, reservation_ends());
        asleep_ = true;
        if (next == absl::InfiniteFuture()) {
          wake_.wait(lock);
        } else {
          wake_.wait_for(lock, absl::ToChronoNanoseconds(
                                   std::max(next - absl::Now(), absl::ZeroDuration())));
        }
        asleep_ = false;
      }
      if (stopping_) {
        stop = true;
        stop_answer = stop_answer_;
        while (!entries_.empty()) stopped.push_back(TakeLocked(entries_.begin()->first));
      } else {
        if (!ended_sessions_.empty()) {
          std::vector<uint64_t> gone;
          const absl::flat_hash_set<uint64_t> ended(ended_sessions_.begin(),
                                                    ended_sessions_.end());
          for (const auto& [ticket, e] : entries_) {
            if (ended.contains(e.waiter->session())) gone.push_back(ticket);
          }
          for (uint64_t t : gone) exited.push_back(TakeLocked(t));
          // A session that ended gave back everything it had.
          for (uint64_t s : ended) ReclaimDoneLocked(s);
          ended_sessions_.clear();
        }
        for (uint64_t s : reclaim_answered_) ReclaimDoneLocked(s);
        reclaim_answered_.clear();
        for (uint64_t t : cancelled_) {
          if (std::unique_ptr<Waiter> w = TakeLocked(t)) cancelled.push_back(std::move(w));
        }
        cancelled_.clear();
        const absl::Time now = absl::Now();
        if (reserving_ != 0 && reservation_ends() <= now) EndReservationLocked();
        while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
          const uint64_t t = deadlines_.begin()->second;
          std::optional<Reservation> ahead = AheadOfLocked(t);
          expired.emplace_back(TakeLocked(t), std::move(ahead));
        }
        if (serve_) {
          serve_ = false;
          for (const auto& [order, ticket] : order_.InOrder()) pass.push_back(ticket);
        }
      }
    }
    for (auto& w : stopped) Answer(std::move(w), stop_answer);
    if (stop) return;
    for (auto& w : exited) {
      Answer(std::move(w), CallerExitedError());
    }
    for (auto& w : cancelled) {
      Answer(std::move(w), absl::CancelledError("the waiting caller went away"));
    }
    for (auto& [w, ahead] : expired) {
      admission::Answer a = w->Expire(ahead.has_value() ? &*ahead : nullptr);
      Answer(std::move(w), std::move(a));
    }
    // Waiters tried in this pass and not served, in serving order: each one
    // served after them bypassed them.
    std::vector<uint64_t> skipped;
    for (uint64_t ticket : pass) {
      Waiter* w = nullptr;
      std::optional<Reservation> ahead;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
        auto it = entries_.find(ticket);
        if (it == entries_.end()) continue;
        w = it->second.waiter.get();  // only this thread removes entries
        ahead = AheadOfLocked(ticket);
      }
      std::optional<admission::Answer> a = w->TryServe(ahead.has_value() ? &*ahead : nullptr);
      if (!a.has_value()) {
        const bool wants_room = w->WantsRoom();
        std::lock_guard<std::mutex> lock(mu_);
        auto it = entries_.find(ticket);
        if (it != entries_.end()) it->second.wants_room = wants_room;
        if (wants_room) skipped.push_back(ticket);
        continue;
      }
      std::unique_ptr<Waiter> taken;
      {
        std::lock_guard<std::mutex> lock(mu_);
        taken = TakeLocked(ticket);
        for (uint64_t s : skipped) {
          auto it = entries_.find(s);
          if (it != entries_.end() && it->second.wants_room) BypassLocked(s, it->second);
        }
      }
      Answer(std::move(taken), *std::move(a));
    }
  }
}

}  // namespace admission
}  // namespace gpumem
