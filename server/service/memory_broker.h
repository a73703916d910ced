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
//  - Each uid is a tenant of its own (configured tenants come with the
//    ledger): a slab holds blocks of one uid at a time, is scrubbed before it
//    passes to another, and its handle is only given to a caller whose uid
//    holds a live block in it.
//  - An Allocate that fails leaves the pools as they were: blocks carved for
//    it are released and slabs created for it go back to the device.
//  - Free is allowed to the owning session, any process of the same uid, and
//    root; otherwise PERMISSION_DENIED.
//  - After Shutdown every call is FAILED_PRECONDITION and no slab is held.
//  - After BeginDrain (SIGTERM) Allocate is UNAVAILABLE "gpumemd is
//    stopping"; Free, GetStats, GetSession and slab handles still work, so
//    sessions can finish and let go.
//
// Thread-safety: all methods may be called from any thread; one mutex
// serializes pool changes (the allocator work under it is O(1) per slab).
#ifndef GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_
#define GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fd_channel.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/backend.h"
#include "server/placement/placer.h"
#include "server/pool/slab_pool.h"
#include "server/session/session_registry.h"

namespace gpumem {

struct BrokerOptions {
  PoolOptions pool;
  uint64_t default_alignment = 256;
  // How often idle slabs are looked for.
  absl::Duration maintenance_interval = absl::Seconds(1);
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
  // Refuses new allocations from now on (UNAVAILABLE); everything else keeps
  // working. Calls already past their check finish. Idempotent.
  void BeginDrain();
  // Waits until no allocation is live or `timeout` passes; true if none is.
  bool WaitUntilNoAllocations(absl::Duration timeout);
  size_t live_allocations() const;
  // Config reload: how long an empty slab is kept before it goes back.
  void SetEmptySlabRelease(absl::Duration after);

  absl::StatusOr<v1::AllocateResponse> Allocate(const PeerCred& caller,
                                                const v1::AllocateRequest& request);
  absl::StatusOr<v1::FreeResponse> Free(const PeerCred& caller,
                                        const v1::FreeRequest& request);
  v1::GetStatsResponse Stats(bool include_slabs = false) const;
  absl::StatusOr<v1::Session> GetSession(const PeerCred& caller);
  // A new fd for a slab's handle, for the slab-handle channel.
  absl::StatusOr<SlabFd> ExportSlab(const PeerCred& caller, uint64_t slab_id);

  const Backend& backend() const { return *backend_; }

 private:
  struct Record {
    uint64_t session = 0;
    uid_t uid = 0;
    uint32_t device = 0;
    PoolBlock block;
  };
  class PoolCarver;

  static absl::Status ShuttingDown();
  bool IsShutDown() const;
  void OnSessionEnd(uint64_t session_id);
  void ReleaseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  // Set by BeginDrain; read without the lock at the top of Allocate and
  // again under it.
  std::atomic<bool> draining_{false};
  std::vector<std::unique_ptr<SlabPool>> pools_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Record> allocations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> by_session_
      ABSL_GUARDED_BY(mu_);
  // slab id -> uid -> live blocks of that uid in the slab.
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<uid_t, uint64_t>> slab_users_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> slab_device_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SessionRegistry> sessions_;
  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread maintenance_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_MEMORY_BROKER_H_
