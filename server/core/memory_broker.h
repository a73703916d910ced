// MemoryBroker: the daemon's core. It knows no transport and decides no
// thread policy: transports (server/service/) call it for a caller whose
// identity (pid, uid, gid) they read from the kernel, and choose where each
// call runs. Try* calls never call the backend and never wait (where the
// request needs backend work they answer kNeedsBackendWork, having changed
// nothing); the others may call the backend. No call waits for memory on
// its caller's thread: a waiting request is answered later, from
// admission's thread (server/admission/), through its callback.
//
// It composes the slab pools (pool/), placement (placement/) through the
// quota adaptor (quota/), the allocation table, sessions (session/), the
// tenant directory (tenants/), the ledger (ledger/) and, after a restart,
// the restore window (restart/restorer.h); what it does itself is commit
// allocations and order the checks of each call. Invariants: every
// allocation belongs to exactly one session and is counted in exactly one
// pool until it returns; every caller is charged to exactly one tenant; a
// slab belongs to one tenant for life. Any method may be called from any thread.
#ifndef GPUMEMD_SERVER_CORE_MEMORY_BROKER_H_
#define GPUMEMD_SERVER_CORE_MEMORY_BROKER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fd_channel.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/admission/admission.h"
#include "server/admission/reclaim_targets.h"
#include "server/backend/backend.h"
#include "server/allocations/allocation_table.h"
#include "server/core/daemon_counters.h"
#include "server/core/stats_view.h"
#include "server/defaults/defaults.h"
#include "server/ledger/tenant_ledger.h"
#include "server/placement/placer.h"
#include "server/pool/device_pools.h"
#include "server/quota/quota_book.h"
#include "server/restart/restorer.h"
#include "server/session/admin_group.h"
#include "server/session/session_registry.h"
#include "server/session/session_tenants.h"
#include "server/state/durable_state.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

struct BrokerOptions {
  PoolOptions pool;
  // The slab handle kinds offered to clients, the first the default; empty
  // means every kind the backend makes. Start() refuses a kind the backend
  // cannot make.
  std::vector<HandleKind> handle_kinds;
  uint64_t default_alignment = 256;
  // A larger AllocateRequest.alignment is refused INVALID_ARGUMENT (a block
  // aligned past its slab's size would take a slab of its own).
  uint64_t max_alignment = defaults::kMaxAlignment;
  // How often idle slabs are looked for.
  absl::Duration maintenance_interval = absl::Seconds(1);
  admission::AdmissionOptions admission;
  // What a restart needs is kept as it happens: the durable records
  // (server/state/) and slabs' handles (server/restart/). May be null.
  state::DurableState* state = nullptr;
  SlabKeeper* slab_keeper = nullptr;
  // How long after a restart clients have to come back (rebind a
  // connection-bound session, give back a slab's handle).
  absl::Duration restore_grace = defaults::kRestoreGrace;
  // Reclaim before refusing (SetReclaimSender); zero: off.
  absl::Duration reclaim_wait = defaults::kReclaimWait;
  // Tenants (the directory in force, replaced by reloads), quotas and the
  // ledger; each may be null (each uid its own tenant, no quota, no
  // ledger). They must outlive the broker. With a QuotaBook, carving goes
  // through the quota adaptor: a tenant never holds more than its quota,
  // and an allocation's bytes are credited back after its block is
  // released. With a ledger, every allocation's ALLOCATE and ending events
  // are appended at the table's commit points (allocation_table.h).
  const tenants::TenantDirectoryHolder* tenants = nullptr;
  quota::QuotaBook* quotas = nullptr;
  ledger::TenantLedger* ledger = nullptr;
};

class MemoryBroker {
 public:
  // UNAVAILABLE "gpumemd is stopping": the answer to an allocation asked
  // while the daemon drains (by the broker, or by a service that can no
  // longer hand the request to a worker).
  static absl::Status StoppingError();

  // `backend` must outlive the broker.
  MemoryBroker(Backend* backend, BrokerOptions options);
  ~MemoryBroker();
  MemoryBroker(const MemoryBroker&) = delete;
  MemoryBroker& operator=(const MemoryBroker&) = delete;

  // Makes pool reservations and starts the maintenance thread. (The admin
  // group is root only until SetAdminGroup.)
  absl::Status Start();
  // Refuses new allocations from now on (UNAVAILABLE "gpumemd is
  // stopping", SIGTERM); Free, GetStats, GetSession and slab handles still
  // work, so sessions can finish and let go. Calls already past their check
  // finish. Idempotent.
  void BeginDrain();
  // Answers every waiting Allocate now (FAILED_PRECONDITION) and lets no new
  // one wait: the first step of shutting down.
  void StopWaiting();
  // Answers every waiter, waits for calls in flight, releases every
  // allocation and slab (retained ones too); from then on every call answers
  // FAILED_PRECONDITION "gpumemd is shutting down". Idempotent.
  void Shutdown();
  // Stops serving for a restart: waiters are answered UNAVAILABLE, nothing
  // is released, recorded or closed: what BrokerOptions::state and
  // slab_keeper hold is left as it is for the next daemon. Idempotent.
  void ShutdownForRestart();

  // ---- A restart: the Restorer's calls (restart/restorer.h), each in the
  // call gate, so none runs once Shutdown has begun ----
  using RestoreOutcome = gpumem::RestoreOutcome;
  // Before serving, after Start: Restorer::Restore.
  RestoreOutcome Restore(const state::Snapshot& previous, std::map<uint64_t, int> slab_fds);
  absl::StatusOr<v1::ResumeResponse> Resume(const PeerCred& caller,
                                            const v1::ResumeRequest& request);
  // `fd` is taken, whatever the answer.
  absl::Status AcceptSlabHandle(const PeerCred& caller, uint64_t slab_id, int fd);
  absl::StatusOr<std::shared_ptr<Session>> RebindConnection(const PeerCred& caller,
                                                            absl::string_view token);
  // The name of tenant `id` (restored tenants the config no longer has
  // included; "uid-N" without configured tenants).
  std::string TenantName(uint32_t id) const;
  // Waits until no allocation is live or `timeout` passes; true if none is.
  bool WaitUntilNoAllocations(absl::Duration timeout);
  size_t live_allocations() const;

  // Config reload. How long an empty slab is kept before it goes back:
  void SetEmptySlabRelease(absl::Duration after);
  // How long a request is held for reclaims (zero: not held).
  void SetReclaimWait(absl::Duration wait);
  // Fair waiting's limits (admission.h).
  void SetFairness(uint32_t bypass_limit, absl::Duration reserve_for) {
    admission_.SetFairness(bypass_limit, reserve_for);
  }
  // The admin group ("" for root only). INVALID_ARGUMENT if the group does
  // not exist; the group in force stays then.
  absl::Status SetAdminGroup(const std::string& group);

  // ---- Allocate ----
  using AllocateAnswer = absl::StatusOr<v1::AllocateResponse>;
  // A waiting request's answer, called exactly once, from admission's thread.
  using AllocateCallback = std::function<void(AllocateAnswer)>;
  struct AllocateOutcome {
    enum class Kind {
      kAnswered,          // `answer` is the answer
      kNeedsBackendWork,  // TryAllocate only: nothing changed; call Allocate
      kWaiting,           // the request waits; the callback will answer it
    };
    Kind kind = Kind::kAnswered;
    AllocateAnswer answer;
    uint64_t wait_ticket = 0;  // kWaiting: for CancelWait
  };
  // Serves `request` without calling the backend. A request with wait_ms
  // that nothing can serve now waits (kWaiting) and `on_waited` answers it
  // later; without a callback it is answered at once, as without wait_ms.
  //  - A waiter waits until a release or a quota change makes room (then
  //    admission's thread places it) or its time is up (then the usual
  //    answer). Waiters are served by tenant priority, then arrival, and
  //    fairly: one bypassed AdmissionOptions::bypass_limit times reserves
  //    the room that frees up on its devices for at most reserve_for
  //    (admission.h, pool/reserving_carver.h), for waiting and fresh
  //    requests behind it alike; one whose process exits is answered at
  //    once; at most AdmissionOptions::max_waiting_per_tenant wait per
  //    tenant (beyond: RESOURCE_EXHAUSTED naming the limit).
  //  - A request refused for room that idle leases of other sessions could
  //    cover waits for reclaims too, with or without wait_ms
  //    (SetReclaimSender).
  //  - A failure leaves the pools as they were: blocks carved for it are
  //    released and slabs created for it go back to the device. A backend
  //    failure reaches the caller with the backend's code, naming the device
  //    and the operation; it is never reported as a refusal.
  //  - A handle kind the daemon does not offer is FAILED_PRECONDITION
  //    naming the kinds it offers. Legacy IPC handle bytes go in the reply,
  //    and the session is recorded as given the slab's handle, as with an
  //    exported fd.
  //  - At most the tenant's max_sessions sessions are charged to a tenant
  //    at once (session/session_tenants.h).
  //  - A retry (request_key) of an Allocate a previous daemon carried out
  //    gets those allocations back (Restorer::RetakeByKey), never new ones.
  AllocateOutcome TryAllocate(const PeerCred& caller, const v1::AllocateRequest& request,
                              AllocateCallback on_waited = nullptr);
  // The same, calling the backend where needed (never kNeedsBackendWork).
  AllocateOutcome Allocate(const PeerCred& caller, const v1::AllocateRequest& request,
                           AllocateCallback on_waited);
  // Allocate, and for a waiting request wait on this thread for its answer
  // (for tests and callers that own their thread).
  AllocateAnswer AllocateAndWait(const PeerCred& caller, const v1::AllocateRequest& request);
  // The transport gave up on a waiting request (its caller went away): it
  // is answered CANCELLED, unless it was answered already.
  void CancelWait(uint64_t ticket);

  // ---- Free ----
  // Without calling the backend: the answer, or nullopt when the block's
  // slab is dedicated (it goes back to the backend with the block) and
  // nothing was changed.
  std::optional<absl::StatusOr<v1::FreeResponse>> TryFree(const PeerCred& caller,
                                                          const v1::FreeRequest& request);
  // Who may free what: session/free_permission.h. To a caller that is not
  // an administrator, another's allocation is NOT_FOUND, as an id that does
  // not exist.
  absl::StatusOr<v1::FreeResponse> Free(const PeerCred& caller, const v1::FreeRequest& request);

  // Memory pressure. When an Allocate is refused for room, `sender` asks
  // other sessions to give back idle leases (whom: admission/
  // reclaim_targets.h), on the refused caller's thread with no broker lock
  // held. Set it before any call is served; it must not call back into the
  // broker. Reclaim before refusing: when what the sessions asked could give
  // back would serve it, the request waits in admission (given a callback,
  // with or without wait_ms) until those sessions have answered
  // (ReclaimAnswered) or ended and it was tried once more, or at most
  // reclaim_wait (SetReclaimWait) after it came; then it is placed or
  // refused as usual (a longer wait_ms waits that long).
  using ReclaimSender = admission::ReclaimSender;
  void SetReclaimSender(ReclaimSender sender) { reclaim_sender_ = std::move(sender); }
  // Told the id of each session that ends, after its memory returned and its
  // waiting requests were answered, on the thread that ended it (the
  // session watcher's, or the caller of EndConnection / EndTenant), with no
  // broker lock held; never once Shutdown began. For a transport that keeps
  // something per session (a request ring: server/service/ring_transport.h).
  // Null: nobody. May be set or cleared at any time; once the setter
  // returns, the previous listener is not running and will not run.
  using SessionEndListener = std::function<void(uint64_t session_id)>;
  void SetSessionEndListener(SessionEndListener listener);
  // The caller's live session, made if needed (as GetSession does), for such
  // a transport; PERMISSION_DENIED for a caller that can have none.
  absl::StatusOr<std::shared_ptr<Session>> SessionOf(const PeerCred& caller);

  // The caller answered a reclaim (StreamRequest.reclaimed): requests held
  // for it are tried once more now rather than at the end of their hold.
  void ReclaimAnswered(const PeerCred& caller);

  // What `caller` may see: device figures and counters to everyone;
  // sessions and tenants only of the caller's own uid unless the caller is
  // an administrator (root, or a member of the admin group: SetAdminGroup).
  // A caller through a tenant's socket sees only that tenant and the
  // sessions opened through its socket. Never calls the backend's slab
  // operations; on cuda it asks the driver for its free figures.
  StatsView Stats(const PeerCred& caller, bool include_slabs = false) const;
  // The caller's session, with the tenant it is charged to (or, before its
  // first allocation, the one the directory in force would charge it to;
  // absent when the config gives the caller none).
  absl::StatusOr<v1::Session> GetSession(const PeerCred& caller);
  // A new fd for a slab's handle, for the slab-handle channel. A slab's
  // handle is only given to sessions of its tenant, and the caller's session
  // is recorded as holding the slab, so a slab released while such a
  // session lives stays counted as retained (server/pool/slab_pool.h) until
  // they end or close it. Calls the backend (export).
  absl::StatusOr<SlabFd> ExportSlab(const PeerCred& caller, uint64_t slab_id);
  // The caller's process closed (unmapped) a slab it was given.
  absl::Status CloseSlab(const PeerCred& caller, uint64_t slab_id);

  // Sessions of callers in another pid namespace, bound to a connection
  // (see SessionRegistry::BindConnection): made when the caller's slab
  // channel says hello, ended when it closes, found by token for gRPC.
  absl::StatusOr<std::shared_ptr<Session>> BindConnection(const PeerCred& caller);
  void EndConnection(uint64_t session_id);
  absl::StatusOr<uint64_t> ResolveSessionToken(absl::string_view token,
                                               const PeerCred& caller) const;

  // Root, or a member of the admin group.
  bool IsAdmin(const PeerCred& caller) const { return admins_.IsAdmin(caller); }
  const Backend& backend() const { return *backend_; }
  // Index, UUID and total of every device.
  const std::vector<placement::DeviceView>& devices() const { return pools_.views(); }
  // The kinds offered, the default first (valid after Start).
  const std::vector<HandleKind>& handle_kinds() const { return options_.handle_kinds; }
  // The tenant the directory in force gives a caller (PERMISSION_DENIED
  // when the config gives it none): what a new session of it is charged to.
  // What a session is charged to for its life: session/session_tenants.h.
  // Each request reads the directory once (a snapshot; no lock is held
  // across placement or backend work); a waiting Allocate queues with its
  // tenant's priority in the directory in force when it queues.
  absl::StatusOr<tenants::TenantRef> TenantOf(const PeerCred& caller) const;
  // Quotas changed (SetQuota, a reload): waiting requests are tried again.
  void QuotasChanged() { admission_.Kick(); }
  // Tests: the admission thread has done everything asked of it so far
  // (each waiter tried after the last change) and sleeps.
  bool AdmissionIdle() const { return admission_.Idle(); }

  // ---- Removing a tenant (DeleteTenant) ----
  struct TenantEnded {
    uint32_t sessions = 0;     // sessions ended
    uint64_t allocations = 0;  // their allocations, freed
  };
  // Ends tenant `tenant` (`name` in messages). First, behind a barrier (the
  // calls in flight finish, new ones wait for it), what the tenant holds is
  // counted: live allocations with `end_sessions` false are
  // FAILED_PRECONDITION naming them, and nothing changes. Otherwise
  // `unlist` runs inside the barrier (it takes the tenant out of the
  // directory in force, so no call after it is charged to the tenant) and
  // every session charged to the tenant or opened through its socket is
  // marked ended (nothing more is committed for it, not even for a waiting
  // request); then those sessions end (their memory returns, their waiting
  // requests are answered) and the
  // tenant's empty slabs go back to their devices. Calls the backend; the
  // caller must hold no lock that a call into the broker takes.
  absl::StatusOr<TenantEnded> EndTenant(uint32_t tenant, absl::string_view name,
                                        bool end_sessions, const std::function<void()>& unlist);

 private:
  class RequestWaiter;  // an Allocate waiting in admission (memory_broker.cc)
  // A request checked and ready to place.
  struct Prepared {
    placement::PreparedRequest placement;
    HandleKind kind = HandleKind::kMemfd;
    std::optional<UsageFigures> usage;
    uint64_t size_bytes = 0;
    uint64_t request_key = 0;  // the request's (0: none)
  };
  // What one placement attempt gave.
  struct Placed {
    bool needs_backend_work = false;  // kExistingSlabsOnly only; nothing changed
    AllocateAnswer answer;
  };

  absl::Status ShuttingDown() const;
  absl::StatusOr<HandleKind> RequestedKind(const v1::AllocateRequest& request) const;
  AllocateOutcome Serve(const PeerCred& caller, const v1::AllocateRequest& request,
                        AllocateCallback on_waited, PoolCarver::Mode mode);
  // An Allocate's final answer: counted, and its usage report kept if it
  // succeeded.
  AllocateAnswer Finish(AllocateAnswer answer, Session& session, const Prepared& prepared);
  // Free; with `needs_backend_work` (TryFree) a block whose release would
  // call the backend is left alone and *needs_backend_work set.
  absl::StatusOr<v1::FreeResponse> FreeIn(const PeerCred& caller,
                                          const v1::FreeRequest& request,
                                          bool* needs_backend_work);
  // Places and commits one request: the body of Allocate, and of serving a
  // waiter.
  // `ahead`: the reservation of a waiting request ahead of this one, if any.
  Placed Place(const PeerCred& caller, Session& session, const tenants::TenantRef& tenant,
               const Prepared& prepared, PoolCarver::Mode mode,
               const admission::Reservation* ahead);
  // What a waiting request reserves, if it comes to that (admission::Claim).
  admission::Claim ClaimOf(const Prepared& prepared, const tenants::TenantRef& tenant) const;
  // The answer's entry for allocation `id`.
  void Describe(uint64_t id, const AllocationRecord& r, v1::Allocation* a) const;
  // A retry after a restart (request_key set), answered with what the
  // first attempt made (Restorer::RetakeByKey); nullopt, nothing changed,
  // otherwise.
  std::optional<v1::AllocateResponse> RetakeByKey(const Session& session,
                                                  const Prepared& prepared);
  // Gives taken records' blocks back to their pools and credits their
  // quotas; room may have appeared for waiters.
  void Return(const std::vector<AllocationRecord>& records);
  void OnSessionEnd(const std::shared_ptr<Session>& session, std::vector<uint64_t> ids);
  void Maintain();
  // The grace time after a restart is over: the Restorer's three steps,
  // each outside the gate or in it as it needs.
  void FinishRestore();

  // Constant after construction (options_.handle_kinds: after Start, before
  // serving), or thread-safe rooms, each with its own lock.
  Backend* const backend_;
  BrokerOptions options_;
  // The directory in force (options_.tenants, or one of uid tenants).
  std::unique_ptr<tenants::TenantDirectoryHolder> own_tenants_;
  const tenants::TenantDirectoryHolder* tenants_;
  AdminGroup admins_;
  DaemonCounters counters_;
  std::atomic<bool> draining_{false};
  placement::PlacerOptions placer_options_;
  std::vector<std::vector<PeerLink>> peer_rows_;  // [from][to], for Stats
  DevicePools pools_;
  AllocationTable table_;
  admission::Admission admission_;
  SessionTenants session_tenants_;
  ReclaimSender reclaim_sender_;  // set before serving, then read only
  absl::Mutex session_end_mu_;     // held (shared) while the listener runs
  SessionEndListener session_end_listener_ ABSL_GUARDED_BY(session_end_mu_);
  std::atomic<int64_t> reclaim_wait_ms_;
  std::unique_ptr<SessionRegistry> sessions_;
  std::unique_ptr<Restorer> restorer_;

  // The call gate: every call holds it shared for its duration; Shutdown
  // takes it exclusively, so it waits for calls in flight and none starts
  // after (EndTenant too, as a barrier).
  mutable absl::Mutex gate_;
  bool shut_down_ ABSL_GUARDED_BY(gate_) = false;
  std::atomic<bool> restarting_{false};  // shut down by ShutdownForRestart

  // The maintenance thread's clock, and its stop.
  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread maintenance_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CORE_MEMORY_BROKER_H_
