// CachingPool: the client library's in-process allocator on leased memory.
// A request up to cache_max_request bytes is rounded up to a size class
// (size_classes.h) and served from a lease: a block of lease_bytes the pool
// allocated from the daemon, sub-allocated with the project's
// OffsetAllocator. Larger requests (and sharded ones) are one daemon
// allocation each. The daemon charges the tenant per lease, so its quota
// and ledger stay exact at lease granularity.
//
// Invariants: memory comes only from devices the placement allows (a
// placement is an arena; a block comes from one of its arena's leases);
// device memory freed is not reused until device work queued before the
// free has passed; a bad pointer is detected, never followed; a daemon
// restart loses nothing the library carries over; a fork() child never
// touches the parent's pool. Thread-safe, except that destruction must not
// race with other calls.
#ifndef GPUMEMD_CLIENT_LIB_POOL_CACHING_POOL_H_
#define GPUMEMD_CLIENT_LIB_POOL_CACHING_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/lib/cpp/client.h"
#include "client/lib/pool/free_fences.h"
#include "client/lib/include/gpumem.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

// A Status for one of the library's own codes (GPUMEM_E_FOREIGN_POINTER ..
// GPUMEM_E_FORKED, client/lib/include/gpumem.h, the one list of codes for the C ABI and
// this pool): the nearest standard code, with the library code as a payload
// (LibraryCodeOf).
absl::Status LibraryError(int code, absl::string_view message);
absl::Status ForkedError();
// The library code of `s`, or its standard code (0 for OK).
int LibraryCodeOf(const absl::Status& s);

struct PoolOptions {
  std::string socket_path;                 // empty: DefaultSocketPath()
  uint64_t lease_bytes = 64ull << 20;
  uint64_t cache_max_request = 0;          // 0: lease_bytes / 4
  int64_t idle_release_ms = 10000;
  int64_t reconnect_ms = 30000;            // how long one call waits for a daemon
};

// The library's figures, summed over leases and thread caches.
struct PoolStats {
  uint64_t generation = 0;     // daemon connections so far (1 = never restarted)
  uint64_t leases = 0;
  uint64_t leased_bytes = 0;   // held from the daemon as leases
  uint64_t in_use_bytes = 0;   // handed to the program from leases (class sizes)
  uint64_t cached_bytes = 0;   // free blocks parked in thread caches
  uint64_t large_blocks = 0;
  uint64_t large_bytes = 0;    // direct daemon allocations
  uint64_t lost_bytes = 0;     // abandoned at daemon restarts (address space kept reserved)
  uint64_t deferred_blocks = 0;  // freed, waiting for device work queued before the free
  uint64_t deferred_bytes = 0;
  struct LeaseRow {
    int device;
    uint64_t bytes, used_bytes, live_blocks;
  };
  std::vector<LeaseRow> rows;
};

// The hot path. Allocate: class -> this thread's cache for the arena (a
// thread_local table, no shared writes) -> pop a block under the cache's own
// spin lock (uncontended: taken by other threads only to drain it) -> mark
// the block's shadow word live. Free: lease table (an immutable sorted array
// swapped by pointer when leases come and go; old arrays are kept until the
// pool is destroyed) -> shadow word exchange -> push onto this thread's
// cache. Only a cache miss or overflow takes the pool mutex.
//
// The daemon is told the pool's leased and in-use bytes (UsageReport) with
// every lease taken or given back, so its GetStats shows them for this
// session; between those requests it shows the last reported ones. When the
// daemon asks for idle memory back (a StreamReply.reclaim, read by the
// client's stream reader thread even while the program makes no call), the
// watcher thread does what Trim() does and tells the daemon how many bytes
// it gave back.
//
// Daemon restart: the client library carries every lease and large block
// over it (client/lib/cpp/client.h: same ids, same addresses), so the pool carries
// on as it was; calls made meanwhile wait for the new daemon. Only what the
// library reports lost (a daemon that kept nothing, or stopped for good) is
// abandoned: never freed at the daemon, its address ranges never handed out
// again. Free of such a pointer answers GPUMEM_E_LOST. Blocks the program
// still holds stay mapped (orphaned host/device memory: writes are harmless
// but lost) until it frees them; then the memory is released but its
// addresses stay reserved (the mapper's retired slab: the CUDA address
// reservation, or an inaccessible host mapping).
//
// fork(): the child must not use the parent's pool (its daemon session,
// leases and threads are the parent's); every call in the child answers
// GPUMEM_E_FORKED without touching any lock.
class CachingPool {
 public:
  // Connects (UNAVAILABLE when no daemon answers).
  static absl::StatusOr<std::unique_ptr<CachingPool>> Create(PoolOptions options);
  ~CachingPool();  // drains caches, frees leases and large blocks at the daemon
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  struct Arena;
  // The arena of a placement (created on first use; lives as long as the
  // pool). Callers that allocate often keep it: finding it costs a lookup.
  absl::StatusOr<Arena*> ArenaFor(const v1::PlacementRequest& placement);
  absl::StatusOr<void*> Allocate(uint64_t size, Arena* arena);

  struct Shard {
    void* ptr;
    uint64_t size;
    int device;
  };
  // One block per shard on distinct devices, all or nothing.
  absl::StatusOr<std::vector<Shard>> AllocateSharded(
      uint64_t total, uint32_t shards, const v1::PlacementRequest& placement);
  // Frees `ptr`: back to the freeing thread's cache (a few per size class,
  // bounded in bytes) or to its lease; a lease with no block out goes back
  // to the daemon once it has been empty for idle_release_ms, or at once on
  // Trim(). A thread cache that sees no use for one reaper tick is emptied
  // into the leases first.
  // Bad pointers are detected, never followed: Free looks a pointer up in
  // the lease table and the lease's per-256-byte shadow table (one atomic
  // word each, swapped on free), so a double free, an interior or foreign
  // pointer gets a status and leaves the pool intact. Two threads freeing
  // the same pointer at once: exactly one succeeds.
  // Frees of device memory (CUDA handle kinds) are stream-ordered: the block
  // is not reused, given back to the daemon or unmapped until a fence taken
  // at the free has passed (client/lib/pool/free_fences.h). Free() waits for all the
  // work this process queued on the block's device before it: the next
  // cuCtxSynchronize of the device, run when the blocks waiting exceed 2
  // leases' worth (or 8192 blocks) on a free, when the daemon has no memory
  // left for an allocation, and by Trim() and the destructor. Host memory
  // (memfd, the sim backend) is reused at once.
  absl::Status Free(void* ptr);
  // The same, waiting only for the work queued on `stream` (a CUstream of
  // the block's device's primary context; null: its NULL stream) before the
  // free: PyTorch's contract for its allocator's free. Its fence is an
  // event, polled on every slow-path allocation and reaper tick, waited for
  // only when the daemon has no memory left, by Trim() and the destructor.
  absl::Status FreeAfterStream(void* ptr, void* stream);
  absl::StatusOr<int> DeviceOf(const void* ptr);
  // This process's CUDA ordinal of a live block's device, or -1 for host
  // memory (gpumem_device_ordinal).
  absl::StatusOr<int> OrdinalOf(const void* ptr);
  // Empties every thread cache and gives every empty lease back. Bytes given back.
  absl::StatusOr<uint64_t> Trim();
  PoolStats Stats();
  // The daemon's GetStats (reconnecting if needed).
  absl::StatusOr<v1::GetStatsResponse> DaemonStats();
  // The daemon's GetSession, GetUsage and GetLedger on the pool's connection
  // (this process's session), reconnecting if needed.
  absl::StatusOr<v1::Session> DaemonSession();
  absl::StatusOr<v1::GetUsageResponse> DaemonUsage();
  absl::StatusOr<v1::GetLedgerResponse> DaemonLedger(const v1::GetLedgerRequest& request);
  // Each device's UUID, by the daemon's index.
  absl::StatusOr<std::vector<std::string>> DeviceUuids();

  const PoolOptions& options() const { return options_; }
  // True in a fork() child of the process that created the pool.
  bool Forked() const;

  // Implementation types (public so the .cc's helpers can name them).
  struct Lease;
  struct ThreadCache;
  struct LeaseTable;
  struct LargeBlock;
  struct DeferredFree;

 private:
  explicit CachingPool(PoolOptions options);
  ThreadCache* CacheFor(Arena* arena);
  Lease* FindLease(uintptr_t p) const;

  absl::StatusOr<void*> AllocateSlow(uint64_t size, uint32_t cls, Arena* arena)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<void*> AllocateSlowLocked(uint64_t size, uint32_t cls, Arena* arena)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<void*> AllocateLarge(uint64_t size, const v1::PlacementRequest& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free and FreeAfterStream (`stream` null and `after_stream` false: Free).
  absl::Status FreeWith(void* ptr, bool after_stream, void* stream);
  absl::Status FreeLarge(uintptr_t p, bool after_stream, void* stream);
  // Stream-ordered frees: queues `d` until a fence taken now has passed.
  void Defer(DeferredFree d, const std::string& uuid, bool after_stream, void* stream);
  // The fences of device memory, made with the first lease or block of it.
  void EnsureFencesLocked(const Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the deferred blocks whose fence has passed.
  void CollectDeferredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (no pool lock held) for the fences of every deferred block (of
  // the Free() kind only, or all), then collects them.
  void WaitDeferred(bool device_rule_only) ABSL_LOCKS_EXCLUDED(mu_, deferred_mu_);
  bool HasDeferred() ABSL_LOCKS_EXCLUDED(deferred_mu_);
  void ReturnToLeaseLocked(Lease* lease, uintptr_t ptr, uint32_t handle, uint32_t cls)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainCacheLocked(ThreadCache* tc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t ReleaseEmptyLeasesLocked(absl::Duration min_idle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool's leased and in-use bytes, plus the deltas of the request about
  // to be sent (a lease taken or given back), for the daemon (UsageReport).
  v1::UsageReport UsageLocked(int64_t leased_delta, int64_t in_use_delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureConnectedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleDaemonLostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();
  // Before a call: what the library reported lost is applied first.
  void NoteLosses() ABSL_LOCKS_EXCLUDED(mu_);
  void ReserveLost(uintptr_t begin, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnmapLostLeaseLocked(Lease* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LostBlockFreedLocked(Lease* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free of a pointer lost at a restart (*found false: it is not one).
  absl::Status FreeLostLocked(uintptr_t p, bool* found) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsLost(uintptr_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchLoop();
  friend void DetachThreadCache(ThreadCache* tc);

  const PoolOptions options_;
  const uint64_t fork_epoch_;

  absl::Mutex mu_;
  std::unique_ptr<Client> client_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks the client library reported lost at a restart, for the watcher.
  absl::Mutex lost_mu_;
  absl::flat_hash_set<uint64_t> lost_ids_ ABSL_GUARDED_BY(lost_mu_);
  std::atomic<bool> daemon_lost_{false};
  std::atomic<bool> reclaim_wanted_{false};      // the daemon asked; the watcher trims
  std::vector<std::unique_ptr<Arena>> arenas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Arena*> arena_by_key_ ABSL_GUARDED_BY(mu_);
  // Every lease ever made (released ones too: a racing lookup may still read
  // them), and the current ones, published as an immutable sorted table.
  std::vector<std::unique_ptr<Lease>> leases_ ABSL_GUARDED_BY(mu_);
  std::atomic<const LeaseTable*> table_{nullptr};
  std::vector<std::unique_ptr<const LeaseTable>> tables_ ABSL_GUARDED_BY(mu_);
  std::vector<ThreadCache*> caches_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uintptr_t, std::unique_ptr<LargeBlock>> large_ ABSL_GUARDED_BY(mu_);
  // Lost at a daemon restart: leases and large blocks the program still
  // holds stay mapped (it may still be writing them) until it frees them;
  // then their addresses are reserved (lost_) so they are not reused.
  std::vector<Lease*> lost_leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uintptr_t, std::unique_ptr<LargeBlock>> lost_large_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Client>> retired_clients_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uintptr_t, uint64_t>> lost_ ABSL_GUARDED_BY(mu_);  // reserved ranges
  uint64_t lost_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // In-use bytes counted outside thread caches (slow path, exited threads).
  int64_t in_use_outside_caches_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Stream-ordered frees (see Free): blocks waiting for their fence,
  // oldest first. Lock order: mu_ before deferred_mu_.
  std::unique_ptr<FreeFences> fences_owner_ ABSL_GUARDED_BY(mu_);
  std::atomic<FreeFences*> fences_{nullptr};  // set once, with the first device lease
  absl::Mutex deferred_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // Free()'s blocks by device (FreeFences' index), each queue in fence
  // order; FreeAfterStream()'s in the order freed.
  std::vector<std::deque<DeferredFree>> device_queues_ ABSL_GUARDED_BY(deferred_mu_);
  std::deque<DeferredFree> stream_queue_ ABSL_GUARDED_BY(deferred_mu_);
  uint64_t deferred_count_ ABSL_GUARDED_BY(deferred_mu_) = 0;
  uint64_t deferred_bytes_ ABSL_GUARDED_BY(deferred_mu_) = 0;
  uint64_t deferred_device_rule_count_ ABSL_GUARDED_BY(deferred_mu_) = 0;
  uint64_t deferred_device_rule_bytes_ ABSL_GUARDED_BY(deferred_mu_) = 0;

  int wake_fd_ = -1;  // eventfd: stops the watcher
  std::thread watcher_;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_CACHING_POOL_H_
