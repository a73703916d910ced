// See admission.h. The admission thread sleeps until something is due: a
// pass (serve_), an ended session, a cancel, the earliest deadline, or
// stop. It collects what is due under the lock and answers outside it; a
// pass tries the waiters one by one, taking the lock only to find each.
#include "server/admission/admission.h"

#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace admission {

Admission::Admission(AdmissionOptions options) : options_(options) {
  thread_ = std::thread([this] { Run(); });
}

Admission::~Admission() { Stop(); }

uint64_t Admission::kicks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kicks_;
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
  ++count;
  const uint64_t ticket = next_ticket_++;
  Entry& e = entries_[ticket];
  e.order = order_.Add(waiter->priority(), ticket);
  deadlines_.emplace(waiter->deadline(), ticket);
  e.waiter = std::move(waiter);
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

std::unique_ptr<Waiter> Admission::TakeLocked(uint64_t ticket) {
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return nullptr;
  std::unique_ptr<Waiter> w = std::move(it->second.waiter);
  order_.Remove(it->second.order);
  deadlines_.erase({w->deadline(), ticket});
  entries_.erase(it);
  return w;
}

void Admission::Answer(std::unique_ptr<Waiter> waiter, admission::Answer answer) {
  const uint32_t tenant = waiter->tenant();
  waiter->Done(std::move(answer));
  waiter.reset();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_tenant_.find(tenant);
  if (it != per_tenant_.end() && --it->second == 0) per_tenant_.erase(it);
}

void Admission::Run() {
  for (;;) {
    std::vector<std::unique_ptr<Waiter>> exited, cancelled, expired, stopped;
    std::vector<uint64_t> pass;
    bool stop = false;
    absl::Status stop_answer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto due = [this] {
        return stopping_ || serve_ || !ended_sessions_.empty() || !cancelled_.empty() ||
               (!deadlines_.empty() && deadlines_.begin()->first <= absl::Now());
      };
      while (!due()) {
        if (deadlines_.empty()) {
          wake_.wait(lock);
        } else {
          wake_.wait_for(lock, absl::ToChronoNanoseconds(std::max(
                                   deadlines_.begin()->first - absl::Now(),
                                   absl::ZeroDuration())));
        }
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
          ended_sessions_.clear();
        }
        for (uint64_t t : cancelled_) {
          if (std::unique_ptr<Waiter> w = TakeLocked(t)) cancelled.push_back(std::move(w));
        }
        cancelled_.clear();
        const absl::Time now = absl::Now();
        while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
          expired.push_back(TakeLocked(deadlines_.begin()->second));
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
      Answer(std::move(w), absl::FailedPreconditionError("the waiting process has exited"));
    }
    for (auto& w : cancelled) {
      Answer(std::move(w), absl::CancelledError("the waiting caller went away"));
    }
    for (auto& w : expired) {
      admission::Answer a = w->Expire();
      Answer(std::move(w), std::move(a));
    }
    for (uint64_t ticket : pass) {
      Waiter* w = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
        auto it = entries_.find(ticket);
        if (it == entries_.end()) continue;
        w = it->second.waiter.get();  // only this thread removes entries
      }
      std::optional<admission::Answer> a = w->TryServe();
      if (!a.has_value()) continue;
      std::unique_ptr<Waiter> taken;
      {
        std::lock_guard<std::mutex> lock(mu_);
        taken = TakeLocked(ticket);
      }
      Answer(std::move(taken), *std::move(a));
    }
  }
}

}  // namespace admission
}  // namespace gpumem
