// Inline definitions of ThreadCaches' hot path: the cache itself and the
// parking and taking of a block under its spin lock. Included at the end of
// thread_caches.h and nowhere else, so that the pool compiles the hit path
// in place; finding this thread's cache (CacheFor, the thread_local table)
// and everything else stay out of line in thread_caches.cc.
#ifndef GPUMEMD_CLIENT_LIB_POOL_THREAD_CACHES_INL_H_
#define GPUMEMD_CLIENT_LIB_POOL_THREAD_CACHES_INL_H_

#include <sched.h>

#include <atomic>
#include <cstdint>

#include "client/lib/pool/lease.h"
#include "client/lib/pool/size_classes.h"

namespace gpumem {
namespace client {

struct ThreadCaches::Cache {
  struct Parked {
    uintptr_t ptr;
    Lease* lease;
    uint32_t handle;
    const void* stream;  // device memory: the stream it was freed on
  };
  struct Bin {
    uint32_t n = 0;
    Parked b[kPerClass];
  };

  void Lock() {
    for (int spins = 0; busy.exchange(true, std::memory_order_acquire); ++spins) {
      if (spins > 64) sched_yield();
    }
  }
  void Unlock() { busy.store(false, std::memory_order_release); }

  std::atomic<bool> busy{false};
  ThreadCaches* owner = nullptr;  // the registry mutex; null once detached or the owner is gone
  uint64_t arena_id = 0;
  // Under the spin lock:
  uint64_t cached_bytes = 0;
  uint64_t ops = 0, ops_seen = 0;  // allocations and frees; as of the last DrainIdle
  Bin bins[kClasses];
};

inline bool ThreadCaches::TakeParked(uint64_t size, const Arena& arena, Block* out,
                                     const void* stream, bool on_stream) {
  if (size > options_.max_request) return false;
  const uint32_t cls = size_classes::ClassOf(size);
  if (cls >= kClasses) return false;
  Cache* c = CacheFor(arena);
  if (c == nullptr) return false;
  c->Lock();
  ++c->ops;
  Cache::Bin& bin = c->bins[cls];
  // The newest that fits: host memory, or device memory of this stream.
  uint32_t i = bin.n;
  while (i > 0) {
    const Cache::Parked& e = bin.b[i - 1];
    if (!e.lease->on_device || (on_stream && e.stream == stream)) break;
    --i;
  }
  if (i == 0) {
    c->Unlock();
    return false;
  }
  const Cache::Parked p = bin.b[i - 1];
  bin.b[i - 1] = bin.b[--bin.n];
  const uint64_t bytes = size_classes::ClassSize(cls);
  c->cached_bytes -= bytes;
  c->Unlock();
  out->ptr = p.ptr;
  out->bytes = bytes;
  out->lease = p.lease;
  out->handle = p.handle;
  out->cls = cls;
  return true;
}

inline bool ThreadCaches::Park(const Block& block, const ReuseAfter& after, Evicted* evicted) {
  Lease* lease = block.lease;
  if (lease == nullptr || block.cls >= kClasses) return false;
  if (lease->on_device && !after.stream_ordered) return false;
  Cache* c = CacheFor(*lease->arena);
  if (c == nullptr) return false;
  c->Lock();
  ++c->ops;
  Cache::Bin& bin = c->bins[block.cls];
  // A lease lost to a daemon restart is never cached again (checked under
  // the cache lock, which TakeLost takes after it is set).
  if ((bin.n == kPerClass && evicted == nullptr) ||
      c->cached_bytes + (bin.n == kPerClass ? 0 : block.bytes) > options_.max_cached_bytes ||
      lease->lost.load(std::memory_order_relaxed)) {
    c->Unlock();
    return false;
  }
  if (bin.n == kPerClass) {  // the oldest makes room
    const Cache::Parked old = bin.b[0];
    for (uint32_t i = 1; i < bin.n; ++i) bin.b[i - 1] = bin.b[i];
    --bin.n;
    c->cached_bytes -= block.bytes;
    evicted->any = true;
    evicted->block.ptr = old.ptr;
    evicted->block.bytes = block.bytes;  // the same class
    evicted->block.lease = old.lease;
    evicted->block.handle = old.handle;
    evicted->block.cls = block.cls;
    evicted->after = old.lease->on_device ? ReuseAfter::StreamWork(const_cast<void*>(old.stream))
                                          : ReuseAfter::DeviceWork();
  }
  bin.b[bin.n++] =
      Cache::Parked{block.ptr, lease, block.handle, lease->on_device ? after.stream : nullptr};
  c->cached_bytes += block.bytes;
  c->Unlock();
  return true;
}

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_THREAD_CACHES_INL_H_
