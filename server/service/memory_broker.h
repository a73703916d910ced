// MemoryBroker: the daemon's core, without any transport.
//
// It owns one SlabPool per device, the table of live allocations and the
// session registry, and answers the API's requests for a caller whose
// identity (pid, uid, gid) the transport read from the kernel. The gRPC
// service (gpumem_service.h) and the slab-handle channel (socket_listener.h)
// are thin layers over it, and tests drive it directly.
//
// What it guarantees:
//  - Every allocation belongs to exactly one session (the caller's process)
//    and is returned to its pool when that session ends, by Free, or at
//    Shutdown; its bytes are counted in exactly one pool meanwhile.
//  - Every caller is charged to a tenant (BrokerOptions.tenants; without it
//    each uid is a tenant of its own). Slabs belong to one tenant for life: a slab's handle is only given to
//    sessions of its tenant, and the sessions given it are recorded, so a
//    slab released while one of them lives stays counted as retained (see
//    server/pool/slab_pool.h) until they end or close it.
//  - A session's tenant is fixed the first time the session needs one (its
//    first Allocate or slab export), from the tenant directory in force
//    then, and kept for the session's life: a config reload that moves the
//    caller's uid to another tenant, or removes its tenant, changes nothing
//    for a live session (its allocations and slabs stay its tenant's; a
//    removed tenant's quota stays enforced on them); new sessions resolve
//    with the new directory. The priority a waiting Allocate queues with
//    is its tenant's priority in the directory in force when it queues.
//    Each request reads the directory once (a snapshot; no lock is held
//    across placement or backend work).
//  - An Allocate that fails leaves the pools as they were: blocks carved for
//    it are released and slabs created for it go back to the device. A
//    backend failure reaches the caller with the backend's code, naming the
//    device and the operation; it is never reported as a refusal.
//  - Free is allowed to the owning session, any process of the same uid, and
//    root; otherwise PERMISSION_DENIED.
//  - A request for a handle kind the daemon does not offer is
//    FAILED_PRECONDITION naming the kinds it offers. Legacy IPC handle bytes
//    go in the Allocate reply, and the session is recorded as given the
//    slab's handle, as with an exported fd.
//  - Stats shows device figures to everyone, and sessions and tenants only
//    of the caller's own uid unless the caller is an administrator (root, or
//    a member of BrokerOptions::admin_group).
//  - After BeginDrain (SIGTERM) Allocate is UNAVAILABLE "gpumemd is
//    stopping"; Free, GetStats, GetSession and slab handles still work, so
//    sessions can finish and let go.
//  - With a QuotaBook, carving goes through the quota adaptor
//    (server/quota/quota_carver.h): a tenant never holds more than its
//    quota; an allocation's bytes are credited back after its block is
//    released.
//  - With a ledger, an allocation's ALLOCATE event is appended when it is
//    committed to the table, and its ending event (FREE, SESSION_END,
//    DAEMON_STOP) when it leaves the table, before its bytes are credited:
//    replaying the ledger never shows a tenant holding more than it did.
//    Appending is a queue push; the ledger writes on its own thread.
//  - Waiting admission: an Allocate with wait_ms that nothing can serve now
//    waits until a release or a quota change makes room (the thread that
//    released places it) or the time is up (then the usual refusal).
//    Waiters are tried by tenant priority, then arrival
//    (admission/waiter_queue.h); one whose process exits is dropped.
//  - Shutdown waits for calls in flight, releases every allocation and slab
//    (retained ones too), and from then on every call answers
//    FAILED_PRECONDITION "gpumemd is shutting down".
//
// Thread-safety: every method may be called from any thread. Locks are
// held for in-memory bookkeeping only: each device's pool has its own lock
// (so allocations on different devices do not wait for each other) and
// backend work runs outside it; the allocation table has one short lock.
#ifndef GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_
#define GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_

#include <atomic>
#include <functional>
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
#include "server/admission/waiter_queue.h"
#include "server/backend/backend.h"
#include "server/ledger/tenant_ledger.h"
#include "server/placement/placer.h"
#include "server/pool/slab_pool.h"
#include "server/quota/quota_book.h"
#include "server/service/daemon_counters.h"  // issue 25
#include "server/session/session_registry.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

struct BrokerOptions {
  PoolOptions pool;
  // The slab handle kinds offered to clients, the first the default; empty
  // means every kind the backend makes. Start() refuses a kind the backend
  // cannot make.
  std::vector<HandleKind> handle_kinds;
  uint64_t default_alignment = 256;
  // How often idle slabs are looked for.
  absl::Duration maintenance_interval = absl::Seconds(1);
  // Members of this group (besides root) see every session and tenant in
  // Stats. Empty: root only. Resolved at Start; an unknown group fails it.
  std::string admin_group;
  // Tenants (the directory in force, replaced by reloads), quotas and the
  // ledger; each may be null (each uid its own tenant, no quota, no
  // ledger). They must outlive the broker.
  const tenants::TenantDirectoryHolder* tenants = nullptr;
  quota::QuotaBook* quotas = nullptr;
  ledger::TenantLedger* ledger = nullptr;
};

class MemoryBroker {
 public:
  // `backend` must outlive the broker.
  MemoryBroker(Backend* backend, BrokerOptions options);
  ~MemoryBroker();
  MemoryBroker(const MemoryBroker&) = delete;
  MemoryBroker& operator=(const MemoryBroker&) = delete;

  // Resolves the admin group, makes pool reservations and starts the
  // maintenance thread.
  absl::Status Start();
  // Releases every allocation and slab; later calls fail. Idempotent.
  void Shutdown();
  // Refuses new allocations from now on (UNAVAILABLE); everything else keeps
  // working. Calls already past their check finish. Idempotent.
  void BeginDrain();
  // Waits until no allocation is live or `timeout` passes; true if none is.
  bool WaitUntilNoAllocations(absl::Duration timeout);
  size_t live_allocations() const;

  // Config reload. How long an empty slab is kept before it goes back:
  void SetEmptySlabRelease(absl::Duration after);
  // The admin group ("" for root only). INVALID_ARGUMENT if the group does
  // not exist; the group in force stays then.
  absl::Status SetAdminGroup(const std::string& group);

  // Where an Allocate (or Free) may do backend work (create a slab, release
  // empty ones to make room). kNotHere is for a thread that serves many clients
  // (the Stream's completion-queue thread): a request that would need backend
  // work returns NeedsBackendWork() having changed nothing (no block, no
  // charge, no event, no reclaim request), to be run again kAllowed on a
  // thread of its own; everything else gets the answer kAllowed would give.
  enum class BackendWork { kAllowed, kNotHere };
  static bool NeedsBackendWork(const absl::Status& status);

  absl::StatusOr<v1::AllocateResponse> Allocate(const PeerCred& caller,
                                                const v1::AllocateRequest& request,
                                                BackendWork work = BackendWork::kAllowed);
  // kNotHere: NeedsBackendWork(), with nothing changed, when the block's
  // slab is dedicated (it goes back to the backend) or requests are waiting
  // (a release places them). A waiter that starts waiting just after that
  // check is still placed by this Free.
  absl::StatusOr<v1::FreeResponse> Free(const PeerCred& caller,
                                        const v1::FreeRequest& request,
                                        BackendWork work = BackendWork::kAllowed);
  // Memory pressure. When an Allocate is refused for capacity (placement
  // found no room; quota refusals are the tenant's own affair), `sender` is
  // called once for each other session whose last UsageReport shows idle
  // leased bytes (leased > in use) and that holds memory on a refused
  // device, on the refused caller's thread with no broker lock held. Set it
  // before any call is served; it must not call back into the broker.
  using ReclaimSender =
      std::function<void(uint64_t session_id, const v1::ReclaimRequest& request)>;
  void SetReclaimSender(ReclaimSender sender) { reclaim_sender_ = std::move(sender); }

  // What `caller` may see (see the class comment).
  v1::GetStatsResponse Stats(const PeerCred& caller, bool include_slabs = false) const;
  absl::StatusOr<v1::Session> GetSession(const PeerCred& caller);
  // A new fd for a slab's handle, for the slab-handle channel; the caller's
  // session is recorded as holding the slab.
  absl::StatusOr<SlabFd> ExportSlab(const PeerCred& caller, uint64_t slab_id);
  // The caller's process closed (unmapped) a slab it was given.
  absl::Status CloseSlab(const PeerCred& caller, uint64_t slab_id);

  // Sessions of callers in another pid namespace, bound to a connection
  // (see SessionRegistry::BindConnection): made when the caller's slab
  // channel says hello, ended when it closes, found by token for gRPC.
  absl::StatusOr<SessionInfo> BindConnection(const PeerCred& caller);
  void EndConnection(uint64_t session_id);
  absl::StatusOr<uint64_t> ResolveSessionToken(absl::string_view token,
                                               const PeerCred& caller) const;

  // Root, or a member of the admin group.
  bool IsAdmin(const PeerCred& caller) const;
  const Backend& backend() const { return *backend_; }
  // The kinds offered, the default first (valid after Start).
  const std::vector<HandleKind>& handle_kinds() const { return options_.handle_kinds; }
  // The tenant the directory in force gives a caller (PERMISSION_DENIED
  // when the config gives it none): what a new session of it is charged to.
  absl::StatusOr<tenants::TenantRef> TenantOf(const PeerCred& caller) const;
  // Tries the waiting Allocates again (after a quota change).
  void ServeWaiters();
  // Fails every waiting Allocate with FAILED_PRECONDITION and lets no new
  // one wait: the first step of shutting down.
  void StopWaiting();

 private:
  // One live allocation (a million of them is a normal day: keep it small;
  // the tenant's name is looked up when an event needs it).
  struct Record {
    uint64_t session = 0;
    uint64_t charged = 0;  // bytes charged to the quota and the ledger
    PoolBlock block;
    uid_t uid = 0;
    pid_t pid = 0;
    uint32_t tenant = 0;
    uint32_t device = 0;
  };
  // Tenant `id`'s name in the directory in force (removed tenants
  // included), or "uid-N" without configured tenants.
  std::string TenantName(uint32_t id) const;
  // An Allocate waiting for memory (wait_ms); lives on its caller's stack.
  struct Waiter {
    PeerCred caller;
    tenants::TenantRef tenant;
    uint64_t session = 0;
    const placement::PreparedRequest* prepared = nullptr;
    HandleKind kind = HandleKind::kMemfd;
    bool done = false;
    absl::StatusOr<v1::AllocateResponse> result;
  };
  struct SessionUse {
    absl::flat_hash_set<uint64_t> ids;
    uint64_t bytes = 0;
  };
  struct SessionTenant {
    uid_t uid = 0;
    tenants::TenantRef tenant;
  };
  // The tenant `session` is charged to (fixed at its first call; see the
  // class comment), its priority as the directory in force says.
  absl::StatusOr<tenants::TenantRef> TenantOfSession(uint64_t session, const PeerCred& caller);
  class PoolCarver;
  // issue 25: Allocate's body; Allocate counts its refusals.
  absl::StatusOr<v1::AllocateResponse> AllocateUncounted(const PeerCred& caller,
                                                         const v1::AllocateRequest& request,
                                                         BackendWork work);
  // issue 25: the tenant a session is charged to, or would be now (not fixed).
  absl::StatusOr<tenants::TenantRef> SessionTenantOf(uint64_t session,
                                                     const PeerCred& caller) const;
  // The offered kind a request asks for, or FAILED_PRECONDITION.
  absl::StatusOr<HandleKind> RequestedKind(const v1::AllocateRequest& request) const;

  static absl::Status ShuttingDown();
  void OnSessionEnd(uint64_t session_id);
  // A client's caching-pool usage report (proto UsageReport): checked before
  // the request is served, kept as the session's latest once it is.
  static absl::Status CheckUsage(const v1::UsageReport& usage);
  void RecordUsage(uint64_t session_id, const v1::UsageReport& usage);
  // Sends reclaims for a refused request (see SetReclaimSender).
  void RequestReclaim(uint64_t requester_session, uint64_t bytes_wanted,
                      const absl::Status& refusal);
  // Places and commits one request (the body of Allocate, and of serving
  // a waiter).
  absl::StatusOr<v1::AllocateResponse> Place(const PeerCred& caller,
                                             const tenants::TenantRef& tenant,
                                             uint64_t session,
                                             const placement::PreparedRequest& prepared,
                                             HandleKind kind,
                                             BackendWork work = BackendWork::kAllowed);
  // Removes a record under table_mu_ and appends its ending event `why`;
  // the caller releases its block and credits it after (Return).
  Record TakeRecordLocked(absl::flat_hash_map<uint64_t, Record>::iterator it,
                          ledger::EventKind why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);
  // Releases a taken record's block, credits its quota, serves waiters.
  void Return(const std::vector<Record>& records);
  void AppendEvent(ledger::EventKind kind, uint64_t id, const Record& r);
  placement::DeviceSnapshot Snapshot() const;
  void Maintain();

  Backend* backend_;
  BrokerOptions options_;
  // The admin group's gid, -1 for none: set by Start and SetAdminGroup,
  // read without locks by IsAdmin.
  std::atomic<int64_t> admin_gid_{-1};
  // Set by BeginDrain; read without locks at the top of Allocate.
  std::atomic<bool> draining_{false};
  // Fixed at construction (devices never change), read without locks:
  uint64_t largest_device_bytes_ = 0;
  std::vector<placement::DeviceView> device_views_;  // index, UUID, total
  placement::PlacerOptions placer_options_;
  std::vector<std::vector<v1::PeerLink>> peer_rows_;  // [from][to], GetStats
  std::vector<std::unique_ptr<SlabPool>> pools_;      // one per device, own locks

  // Every call holds this shared for its duration; Shutdown takes it
  // exclusively, so it waits for calls in flight and none starts after.
  mutable absl::Mutex gate_;
  bool shut_down_ ABSL_GUARDED_BY(gate_) = false;

  ReclaimSender reclaim_sender_;  // set before serving, then read only
  std::atomic<uint64_t> next_id_{1};
  mutable absl::Mutex table_mu_ ABSL_ACQUIRED_AFTER(gate_);
  absl::flat_hash_map<uint64_t, Record> allocations_ ABSL_GUARDED_BY(table_mu_);
  absl::flat_hash_map<uint64_t, SessionUse> by_session_ ABSL_GUARDED_BY(table_mu_);
  // Each live session's last usage report; erased when the session ends.
  absl::flat_hash_map<uint64_t, v1::UsageReport> usage_reports_ ABSL_GUARDED_BY(table_mu_);
  // Each live session's tenant once fixed; erased when the session ends.
  // A leaf lock (nothing is taken under it).
  mutable absl::Mutex tenant_mu_;
  absl::flat_hash_map<uint64_t, SessionTenant> session_tenants_ ABSL_GUARDED_BY(tenant_mu_);

  // Waiting admission. A release bumps releases_ and, if waiting_ > 0,
  // serves the waiters; a request about to wait re-checks releases_ after
  // counting itself in waiting_, so no release is missed (both seq_cst).
  std::atomic<uint64_t> releases_{0};
  std::atomic<int> waiting_{0};
  absl::Mutex wait_mu_ ABSL_ACQUIRED_AFTER(gate_);
  admission::WaiterQueue<Waiter> waiters_ ABSL_GUARDED_BY(wait_mu_);
  bool stop_waiting_ ABSL_GUARDED_BY(wait_mu_) = false;

  DaemonCounters counters_;  // issue 25: GetStats' counters and waiting per tenant

  std::unique_ptr<SessionRegistry> sessions_;
  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread maintenance_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_
