// CachingPool: the client library's in-process allocator on leased memory,
// composed once from the layers of block_resource.h: ThreadCaches over
// FreeQueue over SizeClassCache over LeaseSource, with GiveBack returning
// idle memory and LostBlocks carrying what daemon restarts lost. The pool
// itself checks pointers, applies restart losses and reads figures; each
// policy lives in its layer.
//
// Invariants: memory comes only from devices the placement allows (a
// placement is an arena); device memory freed is not reused until device
// work queued before the free has passed; a bad pointer is detected, never
// followed; a daemon restart loses nothing the library carries over; a
// fork() child never touches the parent's pool. Thread-safe, except that
// destruction must not race with other calls.
#ifndef GPUMEMD_CLIENT_LIB_POOL_CACHING_POOL_H_
#define GPUMEMD_CLIENT_LIB_POOL_CACHING_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/lib/cpp/client.h"
#include "client/lib/pool/arena.h"
#include "client/lib/pool/free_queue.h"
#include "client/lib/pool/give_back.h"
#include "client/lib/pool/lease_source.h"
#include "client/lib/pool/library_error.h"
#include "client/lib/pool/lost_blocks.h"
#include "client/lib/pool/size_class_cache.h"
#include "client/lib/pool/thread_caches.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

struct PoolOptions {
  std::string socket_path;  // empty: DefaultSocketPath()
  uint64_t lease_bytes = 64ull << 20;
  uint64_t cache_max_request = 0;  // 0: lease_bytes / 4
  int64_t idle_release_ms = 10000;
};

// The library's figures, summed over leases and thread caches.
struct PoolStats {
  uint64_t generation = 0;  // daemons served by so far (1 = never restarted)
  uint64_t leases = 0;
  uint64_t leased_bytes = 0;  // held from the daemon as leases
  uint64_t in_use_bytes = 0;  // handed to the program from leases (class sizes)
  uint64_t cached_bytes = 0;  // free blocks parked in thread caches
  uint64_t large_blocks = 0;
  uint64_t large_bytes = 0;      // direct daemon allocations
  std::map<uint32_t, uint64_t> large_bytes_by_device;  // the same, by daemon device
  uint64_t lost_bytes = 0;       // abandoned at daemon restarts (address space kept reserved)
  uint64_t deferred_blocks = 0;  // freed, waiting for device work queued before the free
  uint64_t deferred_bytes = 0;
  uint64_t graph_held_blocks = 0;  // of those, freed into a CUDA graph capture: held
  uint64_t graph_held_bytes = 0;   // until the graph is destroyed
  struct LeaseRow {
    int device;
    uint64_t bytes, used_bytes, live_blocks;
  };
  std::vector<LeaseRow> rows;
};

// Daemon restart: the client library carries every lease and whole block
// over it (client/lib/cpp/client.h: same ids, same addresses), so the pool
// carries on as it was; calls made meanwhile wait for the new daemon. Only
// what the library reports lost is abandoned: never freed at the daemon,
// its address ranges never handed out again; a free of such a pointer
// answers GPUMEM_E_LOST. Blocks the program still holds stay mapped
// (orphaned memory: writes are harmless but lost) until it frees them.
//
// fork(): the child must not use the parent's pool (its session, leases
// and threads are the parent's); every call in the child answers
// GPUMEM_E_FORKED without touching any lock.
class CachingPool {
 public:
  using Arena = ::gpumem::client::Arena;
  using Shard = ::gpumem::client::Shard;

  // Connects (UNAVAILABLE when no daemon answers).
  static absl::StatusOr<std::unique_ptr<CachingPool>> Create(PoolOptions options);
  ~CachingPool();  // waits for deferred frees, gives everything back to the daemon
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  // The arena of a placement (made on first use; lives as long as the
  // pool). Callers that allocate often keep it: finding it costs a lookup.
  absl::StatusOr<Arena*> ArenaFor(const v1::PlacementRequest& placement);
  absl::StatusOr<void*> Allocate(uint64_t size, Arena* arena);
  // The same for work on `stream` (PyTorch's malloc): a block this thread
  // freed on the same stream (FreeAfterStream) is reused at once, without
  // waiting for its fence: the stream runs the new owner's work after the
  // old owner's. Streams must outlive the blocks freed on them (PyTorch's
  // do: its streams come from a pool kept for the process's life).
  absl::StatusOr<void*> AllocateOnStream(uint64_t size, Arena* arena, void* stream);
  // One block per shard on distinct devices, all or nothing.
  absl::StatusOr<std::vector<Shard>> AllocateSharded(uint64_t total, uint32_t shards,
                                                     const v1::PlacementRequest& placement);
  // Frees `ptr`. A double free, an interior or a foreign pointer gets a
  // status and leaves the pool intact (BlockShadow: of two threads freeing
  // one block exactly one succeeds). Device memory is reused only after all
  // the work this process queued on its device before the free
  // (FreeQueue); host memory at once.
  absl::Status Free(void* ptr);
  // The same, waiting only for the work queued on `stream` (a CUstream of
  // the block's device's primary context; null: its NULL stream) before the
  // free: PyTorch's contract for its allocator's free.
  absl::Status FreeAfterStream(void* ptr, void* stream);
  absl::StatusOr<int> DeviceOf(const void* ptr);
  // This process's CUDA ordinal of a live block's device, or -1 for host
  // memory (gpumem_device_ordinal).
  absl::StatusOr<int> OrdinalOf(const void* ptr);
  // [ptr, ptr + size) of a live block's memory as a dma-buf fd (the
  // caller's to close) for a NIC (ibv_reg_dmabuf_mr), and where ptr is in
  // it: the fd covers the range widened to host pages
  // (cuMemGetHandleForAddressRange). The range must lie in the block's
  // lease or whole block. FAILED_PRECONDITION for host memory (the sim
  // backend) and for a device without dma-buf support.
  struct DmaBuf {
    int fd = -1;
    uint64_t offset = 0;
  };
  absl::StatusOr<DmaBuf> ExportDmaBuf(const void* ptr, uint64_t size);
  // Waits for deferred frees, empties every thread cache and gives every
  // empty lease back. Bytes given back.
  absl::StatusOr<uint64_t> Trim();
  PoolStats Stats();
  // The pool's daemon connection (this process's session), for the calls
  // the pool does not make itself (GetStats, GetSession, GetUsage, ...).
  absl::StatusOr<Client*> Daemon();

  const PoolOptions& options() const { return options_; }
  // True in a fork() child of the process that created the pool.
  bool Forked() const;

 private:
  absl::StatusOr<void*> AllocateOnStream(uint64_t size, Arena* arena, void* stream,
                                         bool on_stream);
  explicit CachingPool(PoolOptions options);
  absl::Status FreeWith(void* ptr, const ReuseAfter& after);
  // What the library reported lost at restarts, applied to every layer.
  void ApplyLosses();
  bool IsLost(uintptr_t p);

  // Constant after Create; each part is thread-safe on its own.
  const PoolOptions options_;
  const uint64_t fork_epoch_;
  ArenaTable arenas_;
  LostBlocks lost_;
  // The stack, bottom to top (block_resource.h), and its give-back.
  std::unique_ptr<LeaseSource> source_;
  std::unique_ptr<SizeClassCache> size_classes_;
  std::unique_ptr<FreeQueue> free_queue_;
  std::unique_ptr<ThreadCaches> thread_caches_;
  std::unique_ptr<GiveBack> give_back_;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_CACHING_POOL_H_
