// Admission: Allocate requests that wait for memory (AllocateRequest.wait_ms,
// or a short hold while other sessions give back idle leases), held without
// a thread each. A request that nothing can serve now becomes a Waiter, is
// handed to Admission, and its caller's thread goes back to serving others.
// From then on Admission's one thread decides its fate: when room may have
// appeared (Kick) it tries the waiters in serving order (higher tenant
// priority, then earlier arrival: waiter_queue.h); a waiter is otherwise
// answered at its deadline, when its session ends, when cancelled, or at Stop.
//
// Invariants: every waiter is answered exactly once, through Waiter::Done,
// on Admission's thread with no Admission lock held, and destroyed after;
// no wake-up is lost (Enqueue); no waiter starves behind requests after it
// in serving order (fair waiting: AdmissionOptions::bypass_limit).
// Thread-safe; Waiters run only on Admission's thread, so need no lock.
#ifndef GPUMEMD_SERVER_ADMISSION_ADMISSION_H_
#define GPUMEMD_SERVER_ADMISSION_ADMISSION_H_

#include <atomic>
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
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/admission/waiter_queue.h"
#include "server/backend/backend.h"
#include "server/defaults/defaults.h"

namespace gpumem {
namespace admission {

using Answer = absl::StatusOr<v1::AllocateResponse>;

// What a waiting request needs, for fair waiting: a block of `bytes` on one
// of `devices`, carved for `tenant` (of handle kind `kind`). `what` names
// it in refusals of others.
struct Claim {
  uint32_t tenant = 0;
  HandleKind kind = HandleKind::kMemfd;
  std::vector<uint32_t> devices;
  uint64_t bytes = 0;
  std::string what;
};

// The reservation in force: the claim of the waiter that reserves, and its
// priority (only requests of that priority or lower are behind it).
struct Reservation {
  Claim claim;
  int32_t priority = 0;
};

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
  // answer, or nullopt while nothing can serve it. `ahead`: the reservation
  // of a waiter ahead of this one, to be respected (null: none).
  virtual std::optional<Answer> TryServe(const Reservation* ahead) = 0;
  // The deadline passed: the answer as things stand now.
  virtual Answer Expire(const Reservation* ahead) = 0;
  // Called exactly once with the request's answer.
  virtual void Done(Answer answer) = 0;
  // Whether its last try was refused for room (only such waiters are
  // bypassed and reserve; one refused by its own quota is not helped by it).
  virtual bool WantsRoom() const { return true; }
  // The devices of its claim on which its block could fit beside what
  // other tenants hold there (empty: none, so it does not reserve). Called
  // with Admission's lock held, from any thread (a fresh request's
  // NoteServed too): it must be thread-safe and must not call Admission.
  virtual std::vector<uint32_t> FittingDevices() const { return claim_.devices; }

  // What the daemon keeps for it while it waits, in bytes: what the core
  // keeps for it, its compact form and what its transport keeps (counted
  // against max_waiting_bytes_per_tenant); set before Enqueue.
  void set_held_bytes(uint64_t bytes) { held_bytes_ = bytes; }
  uint64_t held_bytes() const { return held_bytes_; }

  // What it would reserve (see Claim); set before Enqueue.
  void set_claim(Claim claim) { claim_ = std::move(claim); }
  const Claim& claim() const { return claim_; }
  // A reclaim hold: a request refused for room that idle leases of other
  // sessions could cover is queued with the `sessions` asked to give them
  // back. Its deadline is the hold's bound; once each has answered
  // (ReclaimAnswered) or ended, the deadline becomes `answered_deadline` if
  // earlier (the one it would have had without the hold: now, for a request
  // without wait_ms), so it is tried once more and answered without waiting
  // out the bound. Set before Enqueue.
  void HoldForReclaim(std::vector<uint64_t> sessions, absl::Time answered_deadline) {
    reclaim_from_ = std::move(sessions);
    answered_deadline_ = answered_deadline;
  }
  const std::vector<uint64_t>& reclaim_from() const { return reclaim_from_; }
  absl::Time answered_deadline() const { return answered_deadline_; }

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
  Claim claim_;
  uint64_t held_bytes_ = 0;
  std::vector<uint64_t> reclaim_from_;
  absl::Time answered_deadline_ = absl::InfinitePast();
};

struct AdmissionOptions {
  uint32_t max_waiting_per_tenant = defaults::kMaxWaitingRequests;
  // The bytes one tenant's waiters may hold at once (Waiter::held_bytes);
  // 0: no limit. The daemon's is --max_waiting_bytes_per_tenant.
  uint64_t max_waiting_bytes_per_tenant = 0;
  // The longest wait_ms a request may ask for (CheckWait); zero: no limit.
  // The daemon's is --max_wait_ms.
  absl::Duration max_wait = absl::ZeroDuration();
  // Fair waiting (priority, then arrival, without starving anyone):
  //  - A waiter that wants room (WantsRoom: its last try was refused for
  //    capacity or fragmentation) is *bypassed* each time a request behind it
  //    in serving order (lower priority, or the same priority and later) is
  //    served while it waits: a waiter served in a pass after it was tried,
  //    or a fresh request served at once (NoteServed).
  //  - After `bypass_limit` bypasses it reserves: the first such waiter in
  //    serving order becomes the one Reservation. Requests behind it are
  //    tried with the reservation (TryServe/Expire's `ahead`, and
  //    ReservationAhead for fresh requests); the core refuses them any carve
  //    that would take, on those devices, room the reserving request could
  //    use while it does not fit (server/pool/reserving_carver.h). So the
  //    memory that frees up there accumulates for it. Requests ahead of it
  //    (higher priority) are not affected.
  //  - It reserves only if it could fit beside other tenants' blocks
  //    (Waiter::FittingDevices), and then only on those devices. One that
  //    could not fit anywhere keeps waiting without reserving, its bypass
  //    count starts again from zero, and reservations_declined() counts it.
  //  - A reservation ends when its waiter is answered, or after
  //    `reserve_for`: then its bypass count starts again from zero and the
  //    others are tried at once. So a request behind it is held back by it
  //    at most `reserve_for` at a time, with at least `bypass_limit` others
  //    served between two reservations of the same waiter.
  uint32_t bypass_limit = defaults::kWaitBypassLimit;
  absl::Duration reserve_for = defaults::kWaitReserve;
};

class Admission {
 public:
  explicit Admission(AdmissionOptions options);
  ~Admission();  // Stop()
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Releases so far; read before trying to place a request that may wait,
  // and passed to Enqueue, so that no wake-up is lost.
  uint64_t kicks() const;

  // OK if a request may ask to wait `wait_ms`; INVALID_ARGUMENT naming the
  // limit and its setting otherwise. Fixed for Admission's life: no lock.
  absl::Status CheckWait(uint64_t wait_ms) const;

  // Queues `waiter`, which could not be served when kicks() was `seen` (if
  // a release happened since, it is tried as if it had been queued first). On
  // success the waiter is Admission's (the pointer is taken) and the answer
  // is a ticket for Cancel. Otherwise `waiter` is left with the caller:
  // RESOURCE_EXHAUSTED when its tenant has max_waiting_per_tenant requests
  // waiting (Waiter::max_waiting if set) or its waiters' bytes would pass
  // max_waiting_bytes_per_tenant, naming the tenant, the limit and its
  // setting; FAILED_PRECONDITION once stopped.
  absl::StatusOr<uint64_t> Enqueue(std::unique_ptr<Waiter>& waiter, uint64_t seen);

  // Room may have appeared: the waiters are tried again soon.
  void Kick();
  // `session` ended: its waiters are answered now, the others tried again.
  void SessionEnded(uint64_t session);
  // The transport gave up on the request (its caller went away): answered
  // CANCELLED unless it was answered already.
  void Cancel(uint64_t ticket);
  // `session` answered a reclaim (it gave back what it could): reclaim holds
  // that wait for it wait no longer for it.
  void ReclaimAnswered(uint64_t session);

  // Fair waiting. A request of `priority` was served without waiting (a
  // fresh one): the waiters it bypassed count it. Cheap when none waits.
  void NoteServed(int32_t priority);
  // The reservation a fresh request of `priority` must respect, if any.
  std::optional<Reservation> ReservationAhead(int32_t priority) const;
  // Config reload.
  void SetFairness(uint32_t bypass_limit, absl::Duration reserve_for);
  // Answers every waiter with `answer` (the broker passes its own words for
  // why; FAILED_PRECONDITION by default), refuses new ones, and joins the
  // thread. Idempotent.
  void Stop(absl::Status answer = absl::FailedPreconditionError("waiting has stopped"));

  // Requests waiting now, in all and per tenant id.
  uint64_t waiting() const;
  absl::flat_hash_map<uint32_t, uint32_t> waiting_by_tenant() const;
  // Tests: whether nothing is due and the thread is asleep (every event so
  // far has been handled).
  bool Idle() const;
  // Tests and stats: whether a reservation is in force, and reservations
  // made so far.
  bool reserving() const;
  uint64_t reservations_made() const;
  // Times a waiter at its bypass limit did not reserve because it could not
  // fit beside other tenants' blocks (FittingDevices was empty).
  uint64_t reservations_declined() const;
  // The bytes each tenant's waiters hold now (tenants with none absent).
  absl::flat_hash_map<uint32_t, uint64_t> waiting_bytes_by_tenant() const;

 private:
  struct Entry {
    std::unique_ptr<Waiter> waiter;
    WaiterQueue<uint64_t>::Ticket order;
    absl::Time deadline;  // the waiter's, or earlier once its hold is answered
    absl::flat_hash_set<uint64_t> reclaim_pending;
    uint32_t bypasses = 0;
    bool wants_room = true;  // the waiter's WantsRoom after its last try
  };
  void Run();
  // Removes `ticket`'s waiter from every index (mu_ held); the caller
  // answers it.
  std::unique_ptr<Waiter> TakeLocked(uint64_t ticket);
  // Answers one waiter taken from the queue and counts it out (mu_ not held).
  void Answer(std::unique_ptr<Waiter> waiter, admission::Answer answer);
  // `session` answered or ended: holds waiting for it stop (mu_ held).
  void ReclaimDoneLocked(uint64_t session);
  // One more bypass of `ticket`; may make it the reservation (mu_ held).
  void BypassLocked(uint64_t ticket, Entry& e);
  // The reservation ahead of `ticket` in serving order, if any (mu_ held).
  std::optional<Reservation> AheadOfLocked(uint64_t ticket) const;
  void EndReservationLocked();

  AdmissionOptions options_;  // fairness fields change on reload (mu_)
  const absl::Duration max_wait_;  // options_.max_wait, read without the lock
  // Everything below is guarded by mu_; entries are removed only by the
  // admission thread, so a Waiter it is trying stays alive without the lock.
  // A std::mutex with a condition variable: ThreadSanitizer sees those
  // natively, while it cannot see Debian's Abseil evaluate a Condition.
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
  std::vector<uint64_t> reclaim_answered_;
  absl::flat_hash_map<uint32_t, uint32_t> per_tenant_;
  absl::flat_hash_map<uint32_t, uint64_t> bytes_per_tenant_;  // held_bytes sums
  // The reservation (0: none), since when, and what it claims.
  uint64_t reserving_ = 0;
  absl::Time reserved_since_;
  Reservation reservation_;
  uint64_t reservations_made_ = 0;
  uint64_t reservations_declined_ = 0;
  bool asleep_ = false;
  // Read without the lock on hot paths (NoteServed, ReservationAhead).
  std::atomic<size_t> entry_count_{0};
  std::atomic<bool> has_reservation_{false};
  std::thread thread_;
};

}  // namespace admission
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_ADMISSION_ADMISSION_H_
