// ThreadCaches: which thread keeps a freed block for its next allocation;
// the top of the pool's stack. A thread's free parks a small host block in
// the thread's own cache for the block's arena, and the thread's next
// allocation of that size class takes it back, under the cache's own spin
// lock, which other threads take only to drain or read it. What a cache
// cannot serve or hold passes upstream.
//
// Invariants: a cache belongs to one thread and one arena (a thread has
// caches for at most kArenasPerThread arenas; more are served uncached) and
// holds at most kPerClass blocks of each of the kClasses smallest classes
// and max_cached_bytes in all, of leases not lost; device memory only when
// freed on a stream, and only for that stream's next allocation (the
// FreeQueue holds the rest). When its thread exits, a
// cache's blocks go upstream. Lock order: the process-wide registry mutex,
// then whatever upstream takes; mu_ and the spin locks are taken last.
#ifndef GPUMEMD_CLIENT_LIB_POOL_THREAD_CACHES_H_
#define GPUMEMD_CLIENT_LIB_POOL_THREAD_CACHES_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/pool/block_resource.h"

namespace gpumem {
namespace client {

class ThreadCaches final : public BlockResource {
 public:
  // Classes kept: up to 1 MiB (size_classes::ClassOf(1 MiB) == 79).
  static constexpr uint32_t kClasses = 80;
  static constexpr uint32_t kPerClass = 8;
  static constexpr int kArenasPerThread = 4;

  struct Options {
    uint64_t max_request = 16ull << 20;      // larger requests pass upstream
    uint64_t max_cached_bytes = 8ull << 20;  // per cache
  };

  // `upstream` must outlive the caches.
  ThreadCaches(BlockResource* upstream, Options options);
  // Detaches every cache; their blocks are dropped, not passed upstream
  // (the leases they are in go with the pool).
  ~ThreadCaches() override;
  ThreadCaches(const ThreadCaches&) = delete;
  ThreadCaches& operator=(const ThreadCaches&) = delete;

  absl::StatusOr<Block> Allocate(uint64_t size, const Arena& arena) override;
  absl::Status Free(Block block, const ReuseAfter& after) override;

  // The hot path (inline, thread_caches_inl.h), for callers that want to
  // skip the StatusOr: TakeParked fills *out with a block parked in this
  // thread's cache for the class of `size`, or says there is none (then
  // Allocate passes the request upstream); Park parks `block` here, or says
  // it cannot (then Free passes it upstream).
  // Device memory is parked only when freed stream-ordered, under its
  // stream S, and taken only by a request on S (`stream`, `on_stream`):
  // work queued on S after the new owner has it runs after the old owner's
  // (the stream's order), so no fence is needed; host memory is taken by
  // any request.
  bool TakeParked(uint64_t size, const Arena& arena, Block* out,
                  const void* stream = nullptr, bool on_stream = false);
  // With `evicted`, a full bin makes room: its oldest block comes out in
  // *evicted (with the rule it was freed under), for the caller to pass
  // upstream, so blocks of a stream nobody allocates on do not keep
  // another stream's from the cache.
  struct Evicted {
    bool any = false;
    Block block;
    ReuseAfter after;
  };
  bool Park(const Block& block, const ReuseAfter& after = ReuseAfter::DeviceWork(),
            Evicted* evicted = nullptr);

  // Bytes parked in all caches.
  uint64_t CachedBytes() ABSL_LOCKS_EXCLUDED(mu_);
  // Every cache's blocks go upstream.
  void DrainAll();
  // The blocks of caches with no allocation or free since the last call go
  // upstream.
  void DrainIdle();
  // Takes out and returns the cached blocks of lost leases (Lease::lost).
  std::vector<Block> TakeLost();

  struct Cache;

 private:
  friend void DetachCache(Cache* cache);
  // This thread's cache for `arena`, made on first use; null when the
  // thread has caches for kArenasPerThread other arenas.
  Cache* CacheFor(const Arena& arena);
  // Snapshot of caches_; the registry mutex keeps them alive.
  std::vector<Cache*> Caches() ABSL_LOCKS_EXCLUDED(mu_);
  void Drain(Cache* cache);

  BlockResource* const upstream_;
  const Options options_;

  absl::Mutex mu_;
  std::vector<Cache*> caches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace gpumem

#include "client/lib/pool/thread_caches_inl.h"  // IWYU pragma: export

#endif  // GPUMEMD_CLIENT_LIB_POOL_THREAD_CACHES_H_
