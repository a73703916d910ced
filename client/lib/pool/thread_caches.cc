// Each thread keeps its caches in a thread_local table of kArenasPerThread
// slots keyed by arena id (ids are never reused, so a slot of a pool that is
// gone never matches again). A cache's owner pointer, and its life, are
// guarded by the process-wide registry mutex: a thread that exits detaches
// its caches under it, and ~ThreadCaches clears the owners under it.
#include "client/lib/pool/thread_caches.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "client/lib/pool/lease.h"
#include "client/lib/pool/size_classes.h"

namespace gpumem {
namespace client {

using size_classes::ClassSize;

namespace {

absl::Mutex* RegistryMu() {
  static absl::Mutex* mu = new absl::Mutex;
  return mu;
}

}  // namespace

// A thread is exiting (or its slot is reused): the cache's blocks go
// upstream and the cache is deleted.
void DetachCache(ThreadCaches::Cache* cache) {
  {
    absl::MutexLock reg(RegistryMu());
    ThreadCaches* owner = cache->owner;
    if (owner != nullptr) {
      owner->Drain(cache);
      absl::MutexLock lock(&owner->mu_);
      owner->caches_.erase(std::find(owner->caches_.begin(), owner->caches_.end(), cache));
      cache->owner = nullptr;
    }
  }
  delete cache;
}

namespace {
struct TlsCaches {
  struct Slot {
    uint64_t arena_id = 0;
    ThreadCaches::Cache* cache = nullptr;
  };
  Slot slot[ThreadCaches::kArenasPerThread];
  ~TlsCaches() {
    for (Slot& s : slot) {
      if (s.cache != nullptr) DetachCache(s.cache);
      s.cache = nullptr;
    }
  }
};
thread_local TlsCaches tls_caches;
}  // namespace

ThreadCaches::ThreadCaches(BlockResource* upstream, Options options)
    : upstream_(upstream), options_(options) {}

ThreadCaches::~ThreadCaches() {
  absl::MutexLock reg(RegistryMu());
  absl::MutexLock lock(&mu_);
  for (Cache* c : caches_) {
    c->Lock();
    for (auto& bin : c->bins) bin.n = 0;
    c->cached_bytes = 0;
    c->Unlock();
    c->owner = nullptr;  // its thread deletes it
  }
  caches_.clear();
}

ThreadCaches::Cache* ThreadCaches::CacheFor(const Arena& arena) {
  TlsCaches& t = tls_caches;
  for (auto& s : t.slot) {
    if (s.arena_id == arena.id) return s.cache;
  }
  TlsCaches::Slot* free_slot = nullptr;
  {
    absl::MutexLock reg(RegistryMu());
    for (auto& s : t.slot) {
      if (s.cache == nullptr || s.cache->owner == nullptr) {  // empty, or its owner is gone
        free_slot = &s;
        break;
      }
    }
  }
  if (free_slot == nullptr) return nullptr;  // served uncached
  if (free_slot->cache != nullptr) DetachCache(free_slot->cache);
  auto* c = new Cache;
  c->arena_id = arena.id;
  {
    absl::MutexLock reg(RegistryMu());
    absl::MutexLock lock(&mu_);
    c->owner = this;
    caches_.push_back(c);
  }
  free_slot->arena_id = arena.id;
  free_slot->cache = c;
  return c;
}

absl::StatusOr<Block> ThreadCaches::Allocate(uint64_t size, const Arena& arena) {
  Block b;
  if (TakeParked(size, arena, &b)) return b;
  return upstream_->Allocate(size, arena);
}

absl::Status ThreadCaches::Free(Block block, const ReuseAfter& after) {
  // Host memory only: device memory is parked for its stream by the pool,
  // which knows whether the stream captures a graph.
  if (Park(block)) return absl::OkStatus();
  return upstream_->Free(std::move(block), after);
}

std::vector<ThreadCaches::Cache*> ThreadCaches::Caches() {
  absl::MutexLock lock(&mu_);
  return caches_;
}

uint64_t ThreadCaches::CachedBytes() {
  uint64_t bytes = 0;
  absl::MutexLock lock(&mu_);
  for (Cache* c : caches_) {
    c->Lock();
    bytes += c->cached_bytes;
    c->Unlock();
  }
  return bytes;
}

// A block stays counted in cached_bytes until upstream has it back, so the
// in-use figure (carved minus cached) never counts it twice.
void ThreadCaches::Drain(Cache* cache) {
  std::vector<Block> blocks;
  cache->Lock();
  for (uint32_t cls = 0; cls < kClasses; ++cls) {
    Cache::Bin& bin = cache->bins[cls];
    for (uint32_t i = 0; i < bin.n; ++i) {
      Block b;
      b.ptr = bin.b[i].ptr;
      b.bytes = ClassSize(cls);
      b.lease = bin.b[i].lease;
      b.handle = bin.b[i].handle;
      b.cls = cls;
      blocks.push_back(std::move(b));
    }
    bin.n = 0;
  }
  cache->Unlock();
  for (Block& b : blocks) {
    const uint64_t bytes = b.bytes;
    upstream_->Free(std::move(b), ReuseAfter::DeviceWork()).IgnoreError();
    cache->Lock();
    cache->cached_bytes -= std::min(cache->cached_bytes, bytes);
    cache->Unlock();
  }
}

void ThreadCaches::DrainAll() {
  absl::MutexLock reg(RegistryMu());
  for (Cache* c : Caches()) Drain(c);
}

void ThreadCaches::DrainIdle() {
  absl::MutexLock reg(RegistryMu());
  for (Cache* c : Caches()) {
    c->Lock();
    const bool idle = c->ops == c->ops_seen && c->cached_bytes > 0;
    c->ops_seen = c->ops;
    c->Unlock();
    if (idle) Drain(c);
  }
}

std::vector<Block> ThreadCaches::TakeLost() {
  std::vector<Block> lost;
  absl::MutexLock reg(RegistryMu());
  for (Cache* c : Caches()) {
    c->Lock();
    for (uint32_t cls = 0; cls < kClasses; ++cls) {
      Cache::Bin& bin = c->bins[cls];
      uint32_t kept = 0;
      for (uint32_t i = 0; i < bin.n; ++i) {
        if (bin.b[i].lease->lost.load()) {
          Block b;
          b.ptr = bin.b[i].ptr;
          b.bytes = ClassSize(cls);
          b.lease = bin.b[i].lease;
          b.handle = bin.b[i].handle;
          b.cls = cls;
          c->cached_bytes -= std::min(c->cached_bytes, b.bytes);
          lost.push_back(std::move(b));
        } else {
          bin.b[kept++] = bin.b[i];
        }
      }
      bin.n = kept;
    }
    c->Unlock();
  }
  return lost;
}

}  // namespace client
}  // namespace gpumem
