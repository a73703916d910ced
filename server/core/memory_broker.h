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
// tenant directory (tenants/) and the ledger (ledger/). Invariants: every
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

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fd_channel.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/admission/admission.h"
#include "server/backend/backend.h"
#include "server/core/allocation_table.h"
#include "server/core/daemon_counters.h"
#include "server/core/stats_view.h"
#include "server/ledger/tenant_ledger.h"
#include "server/placement/placer.h"
#include "server/pool/device_pools.h"
#include "server/quota/quota_book.h"
#include "server/session/admin_group.h"
#include "server/session/session_registry.h"
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
  uint64_t max_alignment = uint64_t{2} << 20;
  // How often idle slabs are looked for.
  absl::Duration maintenance_interval = absl::Seconds(1);
  admission::AdmissionOptions admission;
  // What a restart needs is kept as it happens: the durable records
  // (server/state/) and slabs' handles (server/restart/). May be null.
  state::DurableState* state = nullptr;
  SlabKeeper* slab_keeper = nullptr;
  // How long after a restart clients have to come back (rebind a
  // connection-bound session, give back a slab's handle).
  absl::Duration restore_grace = absl::Seconds(30);
  // Reclaim before refusing (SetReclaimSender); zero: off.
  absl::Duration reclaim_wait = absl::Milliseconds(300);
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

  // ---- A restart (memory_broker_restore.cc) ----
  // A restart loses nothing: Restore takes back what a previous daemon kept
  // (its sessions whose processes still run, its slabs with their handles
  // from systemd's fd store or waiting for a client to give one back, every
  // allocation of those in its exact place and charge, with its id) before
  // anything is served. Clients confirm with Resume; what cannot survive
  // (legacy IPC memory, a slab whose handle never comes back within
  // restore_grace, a session whose process is gone) is closed, saying why.
  // An Allocate retried with the request_key of one the previous daemon
  // carried out but whose answer was lost gets that allocation back
  // (RetakeByKey), never a second one.
  struct RestoreOutcome {
    size_t sessions = 0, sessions_gone = 0;
    size_t slabs = 0, slabs_awaiting_handle = 0, slabs_dropped = 0;
    size_t allocations = 0, allocations_closed = 0;
    std::vector<uint64_t> dropped_slabs;  // their records (and stored fds) go
    std::vector<std::pair<uint64_t, uint64_t>> dropped_holders;  // (slab, session)
    std::vector<uint64_t> refused_handles;  // kept handles the backend refused
    // For the ledger (TenantLedger::Resume): the allocations that survived,
    // as ALLOCATE events at their own time, and why the others were closed.
    std::vector<ledger::LedgerEvent> survivors;
    std::map<uint64_t, std::string> closed;
    std::vector<std::string> notes;  // what was dropped and why, a line each
    std::string Summary() const;
  };
  // Before serving, after Start: takes back what `previous` recorded, with
  // the slab handles of `slab_fds` (taken: each is adopted or closed).
  RestoreOutcome Restore(const state::Snapshot& previous, std::map<uint64_t, int> slab_fds);
  // A client re-presents what it held (proto ResumeRequest).
  absl::StatusOr<v1::ResumeResponse> Resume(const PeerCred& caller,
                                            const v1::ResumeRequest& request);
  // A client gives back the handle of a slab waiting for it (`fd` taken).
  // Accepted only from a session of the slab's tenant that the last daemon
  // gave the slab's handle to, and only if it is that slab's handle
  // (Backend::AdoptSlab checks).
  absl::Status AcceptSlabHandle(const PeerCred& caller, uint64_t slab_id, int fd);
  // A client of a restored connection-bound session binds its new slab
  // channel to it with the session's token.
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
  //    at once: the first Allocate or slab export of one more is
  //    RESOURCE_EXHAUSTED naming the tenant and the limit, until one ends.
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
  // Allowed to the owning session, any process of the same uid, and root;
  // otherwise PERMISSION_DENIED. The uid rule does not reach allocations
  // made through a tenant's own socket (only root's does); a caller through
  // a tenant's socket may free only that tenant's allocations (another's id
  // is NOT_FOUND, saying nothing of its owner).
  absl::StatusOr<v1::FreeResponse> Free(const PeerCred& caller, const v1::FreeRequest& request);

  // Memory pressure. When an Allocate is refused for capacity (placement
  // found no room; quota refusals are the tenant's own affair), `sender` is
  // called once for each other session whose last UsageReport shows idle
  // leased bytes (leased > in use) and that holds memory on a refused
  // device, on the refused caller's thread with no broker lock held. It
  // answers whether the request reached the session (a live stream of it),
  // so that only sessions that can answer hold the request. Set it before
  // any call is served; it must not call back into the broker.
  // Reclaim before refusing: when free plus the leased bytes of the sessions
  // asked reach the request's size on a refused device, the request waits
  // in admission (given a callback, with or without wait_ms) until those
  // sessions have answered (ReclaimAnswered) or ended and it was tried once
  // more, or at most reclaim_wait (SetReclaimWait) after it came; then it is
  // placed or refused as usual (a longer wait_ms waits that long).
  using ReclaimSender =
      std::function<bool(uint64_t session_id, const v1::ReclaimRequest& request)>;
  void SetReclaimSender(ReclaimSender sender) { reclaim_sender_ = std::move(sender); }
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
  // Without configured tenants each call is charged to its caller's uid.
  // With them, a session's tenant is fixed the first time the session needs
  // one (its first Allocate or slab export), from the directory in force
  // then, and kept for the session's life: a reload that moves the uid to
  // another tenant, or removes its tenant, changes nothing for a live
  // session. A waiting Allocate queues with its tenant's priority in the
  // directory in force when it queues. Each request reads the directory once
  // (a snapshot; no lock is held across placement or backend work). A
  // caller through a tenant's socket (PeerCred::socket_tenant) is that
  // tenant at once, whatever its uid, and never root nor an administrator.
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
  // The tenant `session` is charged to (fixed at its first call), with its
  // priority as the directory in force says.
  absl::StatusOr<tenants::TenantRef> TenantOfSession(Session& session, const PeerCred& caller);
  // Places and commits one request: the body of Allocate, and of serving a
  // waiter.
  // `ahead`: the reservation of a waiting request ahead of this one, if any.
  Placed Place(const PeerCred& caller, Session& session, const tenants::TenantRef& tenant,
               const Prepared& prepared, PoolCarver::Mode mode,
               const admission::Reservation* ahead);
  // What a waiting request reserves, if it comes to that (admission::Claim).
  admission::Claim ClaimOf(const Prepared& prepared, const tenants::TenantRef& tenant) const;
  // A retry after a restart (request_key set): the restored allocations of
  // `session` that an Allocate with this key made before the restart, not
  // claimed yet and just as `prepared` asks (shard count, each shard's
  // size, handle kind, alignment), are claimed and answered, charged
  // nothing more and with no ledger event; nullopt (nothing changed) when
  // there are none or they do not match.
  std::optional<v1::AllocateResponse> RetakeByKey(Session& session, const Prepared& prepared);
  // The answer's entry for allocation `id`.
  void Describe(uint64_t id, const AllocationRecord& r, v1::Allocation* a) const;
  // Gives taken records' blocks back to their pools and credits their
  // quotas; room may have appeared for waiters.
  void Return(const std::vector<AllocationRecord>& records);
  // Sends reclaims for a refused request (see SetReclaimSender): the
  // sessions the reclaim reached, and whether free bytes plus their leases
  // on some refused device reach what the request needs.
  struct ReclaimAsked {
    std::vector<uint64_t> sessions;
    bool could_cover = false;
  };
  ReclaimAsked RequestReclaim(const Session& requester, uint64_t bytes_wanted,
                              const absl::Status& refusal);
  // Counts `session` as one of `tenant`'s live sessions the first time it is
  // charged to it: RESOURCE_EXHAUSTED when the tenant has max_sessions.
  absl::Status CountSession(const Session& session, const tenants::TenantRef& tenant);
  void OnSessionEnd(const std::shared_ptr<Session>& session, std::vector<uint64_t> ids);
  void Maintain();
  // The grace time after a restart is over: slabs whose handle did not come
  // back lose their blocks; connection-bound sessions nobody rebound end.
  void FinishRestore();
  // Its first step, under the gate: the blocks of slabs whose handle did not
  // come back are closed, the slabs dropped.
  void FinishRestoreSlabs() ABSL_SHARED_LOCKS_REQUIRED(gate_);

  Backend* backend_;
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

  // Every call holds this shared for its duration; Shutdown takes it
  // exclusively, so it waits for calls in flight and none starts after.
  mutable absl::Mutex gate_;
  bool shut_down_ ABSL_GUARDED_BY(gate_) = false;
  std::atomic<bool> restarting_{false};  // shut down by ShutdownForRestart

  ReclaimSender reclaim_sender_;  // set before serving, then read only
  std::atomic<int64_t> reclaim_wait_ms_;

  // Live sessions counted per tenant (CountSession), by session.
  absl::Mutex session_count_mu_;
  absl::flat_hash_map<uint64_t, uint32_t> counted_sessions_
      ABSL_GUARDED_BY(session_count_mu_);
  absl::flat_hash_map<uint32_t, uint32_t> sessions_per_tenant_
      ABSL_GUARDED_BY(session_count_mu_);

  std::unique_ptr<SessionRegistry> sessions_;

  // After a Restore: names of restored tenants the directory no longer has
  // (ids of their own), why closed allocations were closed, and the
  // restored allocations of each session not yet confirmed by its Resume.
  mutable absl::Mutex restore_mu_;
  absl::flat_hash_map<uint32_t, std::string> restored_names_ ABSL_GUARDED_BY(restore_mu_);
  std::map<uint64_t, std::string> closed_ ABSL_GUARDED_BY(restore_mu_);
  // The session each closed allocation was of: only it (or an admin) is
  // told why, anyone else hears "no such allocation".
  std::map<uint64_t, uint64_t> closed_session_ ABSL_GUARDED_BY(restore_mu_);
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> unconfirmed_
      ABSL_GUARDED_BY(restore_mu_);
  // Restored allocations with a request_key, by (session, key), ids in
  // increasing order (a sharded request's shards in shard order): what a
  // retried Allocate may claim (RetakeByKey) while they are unconfirmed.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>> restored_keys_
      ABSL_GUARDED_BY(restore_mu_);
  // Whether restored_keys_ may be non-empty: read without restore_mu_ so
  // that an Allocate, which always carries a key from the client library,
  // takes that lock only while a restore's keys are still unclaimed.
  std::atomic<bool> any_restored_keys_{false};
  absl::Time restore_deadline_ ABSL_GUARDED_BY(restore_mu_) = absl::InfiniteFuture();
  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread maintenance_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CORE_MEMORY_BROKER_H_
