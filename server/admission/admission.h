// Admission: Allocate requests that wait for memory (AllocateRequest.wait_ms),
// held without a thread each.
//
// A request that nothing can serve now becomes a Waiter and is handed to
// Admission, and its caller's thread goes back to serving others. From then
// on one thread of Admission's own decides its fate:
//  - when room may have appeared (Kick: a release, a quota change) it tries
//    the waiters in serving order, higher tenant priority first, then
//    earlier arrival (waiter_queue.h); each that can be served now is, and
//    those that cannot keep waiting;
//  - at a waiter's deadline it gets its usual answer as things stand then
//    (Waiter::Expire: one last try, else the refusal);
//  - a waiter whose session ends is answered at once (the process is gone)
//    and the others are tried again;
//  - a waiter its transport gave up on (Cancel) is answered CANCELLED;
//  - at Stop every waiter is answered FAILED_PRECONDITION.
// Every waiter is answered exactly once, through Waiter::Done, on that
// thread, with no Admission lock held; after Done the waiter is destroyed.
//
// Limits: at most the tenant's limit (Waiter::max_waiting, else
// `max_waiting_per_tenant`) of one tenant's requests wait at once; Enqueue
// refuses one more with RESOURCE_EXHAUSTED naming the tenant and the limit.
//
// No wake-up is lost: a caller reads kicks() before it tries to place its
// request, and passes that number to Enqueue; if a release happened in
// between, the new waiter is tried as if it had been queued first.
//
// Thread-safe. Waiters only ever run on Admission's thread (TryServe,
// Expire, Done), so they need no lock of their own for that. (Its lock is a
// std::mutex with a condition variable: ThreadSanitizer sees those natively,
// while it cannot see Debian's Abseil evaluate a Condition.)
#ifndef GPUMEMD_SERVER_ADMISSION_ADMISSION_H_
#define GPUMEMD_SERVER_ADMISSION_ADMISSION_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/admission/waiter_queue.h"

namespace gpumem {
namespace admission {

using Answer = absl::StatusOr<v1::AllocateResponse>;

// One waiting request, as the core made it. Admission reads the fields and
// calls the methods on its own thread only.
class Waiter {
 public:
  // `max_waiting`: how many of its tenant's requests may wait at once (0:
  // AdmissionOptions::max_waiting_per_tenant).
  Waiter(uint64_t session, uint32_t tenant, std::string tenant_name, int32_t priority,
         uint32_t max_waiting, absl::Time deadline)
      : session_(session), tenant_(tenant), tenant_name_(std::move(tenant_name)),
        priority_(priority), max_waiting_(max_waiting), deadline_(deadline) {}
  virtual ~Waiter() = default;

  // Serves the request if it can be served now (may call the backend): the
  // answer, or nullopt while nothing can serve it.
  virtual std::optional<Answer> TryServe() = 0;
  // The deadline passed: the answer as things stand now.
  virtual Answer Expire() = 0;
  // Called exactly once with the request's answer.
  virtual void Done(Answer answer) = 0;

  uint64_t session() const { return session_; }
  uint32_t tenant() const { return tenant_; }
  const std::string& tenant_name() const { return tenant_name_; }
  int32_t priority() const { return priority_; }
  uint32_t max_waiting() const { return max_waiting_; }
  absl::Time deadline() const { return deadline_; }

 private:
  const uint64_t session_;
  const uint32_t tenant_;
  const std::string tenant_name_;
  const int32_t priority_;
  const uint32_t max_waiting_;
  const absl::Time deadline_;
};

struct AdmissionOptions {
  uint32_t max_waiting_per_tenant = 1024;
};

class Admission {
 public:
  explicit Admission(AdmissionOptions options);
  ~Admission();  // Stop()
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Releases so far; read before trying to place a request that may wait.
  uint64_t kicks() const;

  // Queues `waiter`, which could not be served when kicks() was `seen`. On
  // success the waiter is Admission's (the pointer is taken) and the answer
  // is a ticket for Cancel. Otherwise `waiter` is left with the caller:
  // RESOURCE_EXHAUSTED when its tenant has max_waiting_per_tenant requests
  // waiting, FAILED_PRECONDITION once stopped.
  absl::StatusOr<uint64_t> Enqueue(std::unique_ptr<Waiter>& waiter, uint64_t seen);

  // Room may have appeared: the waiters are tried again soon.
  void Kick();
  // `session` ended: its waiters are answered now, the others tried again.
  void SessionEnded(uint64_t session);
  // The transport gave up on the request (its caller went away): answered
  // CANCELLED unless it was answered already.
  void Cancel(uint64_t ticket);
  // Answers every waiter with `answer` (FAILED_PRECONDITION "gpumemd is
  // shutting down" by default), refuses new ones, and joins the thread.
  // Idempotent.
  void Stop(absl::Status answer = absl::FailedPreconditionError("gpumemd is shutting down"));

  // Requests waiting now, in all and per tenant id.
  uint64_t waiting() const;
  absl::flat_hash_map<uint32_t, uint32_t> waiting_by_tenant() const;

 private:
  struct Entry {
    std::unique_ptr<Waiter> waiter;
    WaiterQueue<uint64_t>::Ticket order;
  };
  void Run();
  // Removes `ticket`'s waiter from every index (mu_ held); the caller
  // answers it.
  std::unique_ptr<Waiter> TakeLocked(uint64_t ticket);
  // Answers one waiter taken from the queue and counts it out (mu_ not held).
  void Answer(std::unique_ptr<Waiter> waiter, admission::Answer answer);

  const AdmissionOptions options_;
  // Everything below is guarded by mu_; entries are removed only by the
  // admission thread, so a Waiter it is trying stays alive without the lock.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  uint64_t kicks_ = 0;
  bool serve_ = false;  // a pass over the waiters is due
  bool stopping_ = false;
  absl::Status stop_answer_;
  uint64_t next_ticket_ = 1;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  WaiterQueue<uint64_t> order_;                         // serving order
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;  // (deadline, ticket)
  std::vector<uint64_t> ended_sessions_;
  std::vector<uint64_t> cancelled_;
  absl::flat_hash_map<uint32_t, uint32_t> per_tenant_;
  std::thread thread_;
};

}  // namespace admission
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_ADMISSION_ADMISSION_H_
