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
//    each uid is a tenant of its own): a slab holds blocks of one tenant at a
//    time, is scrubbed before it passes to another, and its handle is only
//    given to a caller whose uid holds a live block in it.
//  - With a QuotaBook, carving goes through the quota adaptor
//    (server/quota/quota_carver.h): a tenant never holds more than its quota;
//    every allocation's bytes are credited back when it ends.
//  - With a ledger, every allocation and its end are appended to it at the
//    commit point, under the lock (a queue push; the ledger writes on its own
//    thread).
//  - Waiting admission: an Allocate with wait_ms that nothing can serve now
//    waits (without holding the lock) until a Free, a session end or a quota
//    change makes room, or the time is up (then the usual refusal). Waiters
//    are tried by tenant priority, then arrival (admission/waiter_queue.h);
//    one whose process exits is dropped.
//  - An Allocate that fails leaves the pools as they were: blocks carved for
//    it are released and slabs created for it go back to the device.
//  - Free is allowed to the owning session, any process of the same uid, and
//    root; otherwise PERMISSION_DENIED.
//  - After Shutdown every call is FAILED_PRECONDITION and no slab is held.
//
// Thread-safety: all methods may be called from any thread; one mutex
// serializes pool changes (the allocator work under it is O(1) per slab).
#ifndef GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_
#define GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_

#include <atomic>
#include <memory>
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
#include "server/session/session_registry.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

struct BrokerOptions {
  PoolOptions pool;
  uint64_t default_alignment = 256;
  // How often idle slabs are looked for.
  absl::Duration maintenance_interval = absl::Seconds(1);
  // Tenants, quotas and the ledger; each may be null (each uid its own
  // tenant, no quota, no ledger). They must outlive the broker.
  const tenants::TenantDirectory* tenants = nullptr;
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

  // Makes pool reservations and starts the maintenance thread.
  absl::Status Start();
  // Releases every allocation and slab; later calls fail. Idempotent.
  void Shutdown();

  absl::StatusOr<v1::AllocateResponse> Allocate(const PeerCred& caller,
                                                const v1::AllocateRequest& request);
  absl::StatusOr<v1::FreeResponse> Free(const PeerCred& caller,
                                        const v1::FreeRequest& request);
  v1::GetStatsResponse Stats(bool include_slabs = false) const;
  absl::StatusOr<v1::Session> GetSession(const PeerCred& caller);
  // A new fd for a slab's handle, for the slab-handle channel.
  absl::StatusOr<SlabFd> ExportSlab(const PeerCred& caller, uint64_t slab_id);

  const Backend& backend() const { return *backend_; }

  // The tenant `caller` is charged to (PERMISSION_DENIED when none).
  absl::StatusOr<tenants::TenantRef> TenantOf(const PeerCred& caller) const;
  // Tries the waiting requests again (after a quota change).
  void ServeWaiters();
  // Fails every waiting Allocate with FAILED_PRECONDITION and lets no new one
  // wait: the first step of shutting down.
  void StopWaiting();

 private:
  struct Record {
    uint64_t session = 0;
    uid_t uid = 0;
    pid_t pid = 0;
    uint32_t tenant = 0;
    std::string tenant_name;
    uint32_t device = 0;
    uint64_t charged = 0;  // bytes charged to the quota and the ledger
    PoolBlock block;
  };
  class PoolCarver;
  struct Waiter {
    PeerCred caller;
    tenants::TenantRef tenant;
    uint64_t session = 0;
    const placement::PreparedRequest* prepared = nullptr;
    bool done = false;
    absl::StatusOr<v1::AllocateResponse> result;
  };

  static absl::Status ShuttingDown();
  bool IsShutDown() const;
  void OnSessionEnd(uint64_t session_id);
  absl::StatusOr<v1::AllocateResponse> PlaceLocked(
      const PeerCred& caller, const tenants::TenantRef& tenant, uint64_t session,
      const placement::PreparedRequest& prepared) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ServeWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(uint64_t id, ledger::EventKind why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  placement::DeviceSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddSessionStatsLocked(v1::GetStatsResponse* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Maintain();

  Backend* backend_;
  BrokerOptions options_;
  // Fixed at construction (devices never change), read without mu_:
  uint64_t largest_device_bytes_ = 0;
  std::vector<placement::DeviceView> device_views_;  // index, UUID, total
  placement::PlacerOptions placer_options_;
  std::vector<std::vector<v1::PeerLink>> peer_rows_;  // [from][to], GetStats
  mutable absl::Mutex mu_;
  // Set once, under mu_ (Shutdown); read without the lock by the checks at
  // the top of Allocate/GetSession, and under it everywhere else.
  std::atomic<bool> shut_down_{false};
  std::vector<std::unique_ptr<SlabPool>> pools_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Record> allocations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> by_session_
      ABSL_GUARDED_BY(mu_);
  // slab id -> uid -> live blocks of that uid in the slab.
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<uid_t, uint64_t>> slab_users_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> slab_device_ ABSL_GUARDED_BY(mu_);
  admission::WaiterQueue<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stop_waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<SessionRegistry> sessions_;
  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread maintenance_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_
