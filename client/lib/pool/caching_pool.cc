// CachingPool: the composition of the stack, the pointer checks at its top
// (the lease table and BlockShadow for carved blocks, the lease source's
// table for whole blocks) and the restart losses applied across layers.
#include "client/lib/pool/caching_pool.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/lib/pool/size_classes.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "common/cuda_driver.h"

namespace gpumem {
namespace client {

using size_classes::ClassSize;
using size_classes::kGranule;

namespace {
// Incremented in every fork() child, so a pool knows it was inherited.
std::atomic<uint64_t> g_fork_epoch{0};
void OnForkChild() { g_fork_epoch.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

CachingPool::CachingPool(PoolOptions options)
    : options_(std::move(options)), fork_epoch_(g_fork_epoch.load()) {}

absl::StatusOr<std::unique_ptr<CachingPool>> CachingPool::Create(PoolOptions options) {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, OnForkChild); });
  if (options.socket_path.empty()) options.socket_path = DefaultSocketPath();
  if (options.lease_bytes < (64u << 10) || options.lease_bytes % kGranule) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease size ", options.lease_bytes,
                     " must be at least 64 KiB and a multiple of 256 bytes"));
  }
  if (options.cache_max_request == 0) options.cache_max_request = options.lease_bytes / 4;
  options.cache_max_request = std::min(options.cache_max_request, options.lease_bytes);
  if (options.idle_release_ms < 0) options.idle_release_ms = 0;
  std::unique_ptr<CachingPool> pool(new CachingPool(std::move(options)));
  const PoolOptions& o = pool->options_;
  CachingPool* p = pool.get();

  absl::StatusOr<std::unique_ptr<LeaseSource>> source =
      LeaseSource::Connect(o.socket_path, &p->lost_);
  if (!source.ok()) return source.status();
  p->source_ = *std::move(source);
  p->size_classes_ = std::make_unique<SizeClassCache>(
      p->source_.get(), &p->lost_,
      SizeClassCache::Options{o.lease_bytes, o.cache_max_request,
                              [p] { return p->thread_caches_->CachedBytes(); }});
  FreeQueue::Options queue;
  queue.max_device_rule_bytes = 2 * o.lease_bytes;
  // Past that bound the watcher synchronizes; the freeing thread goes on.
  // (Frees start after Create has returned, give_back_ set.)
  queue.request_wait = [p] { p->give_back_->RequestDeviceWait(); };
  p->free_queue_ = std::make_unique<FreeQueue>(p->size_classes_.get(), std::move(queue));
  p->thread_caches_ = std::make_unique<ThreadCaches>(
      p->free_queue_.get(), ThreadCaches::Options{o.cache_max_request, o.lease_bytes / 8});
  absl::StatusOr<std::unique_ptr<GiveBack>> give_back =
      GiveBack::Create(o.idle_release_ms,
                       GiveBack::Layers{p->thread_caches_.get(), p->free_queue_.get(),
                                        p->size_classes_.get(), p->source_.get()},
                       [p] {
                         if (p->lost_.pending()) p->ApplyLosses();
                       });
  if (!give_back.ok()) return give_back.status();
  p->give_back_ = *std::move(give_back);

  // Both run on the client's own threads: they only flag the work for the
  // watcher (they must not wait for a pool call, which may be waiting for
  // the restart to finish).
  GiveBack* gb = p->give_back_.get();
  Client& daemon = p->source_->daemon();
  daemon.OnReclaimRequest([gb](const v1::ReclaimRequest&) { gb->RequestReclaim(); });
  daemon.OnRestart([p, gb](const Client::RestartReport& report) {
    if (p->lost_.Report(report)) gb->Wake();
  });
  p->give_back_->Start();
  return pool;
}

CachingPool::~CachingPool() {
  if (Forked()) {
    // The parent's leases, session and threads: nothing may be freed or
    // unmapped from here (a free would reach the daemon as the parent's
    // uid), and the watcher thread does not exist here. Leak it all.
    (void)give_back_.release();
    (void)thread_caches_.release();
    (void)free_queue_.release();
    (void)size_classes_.release();
    (void)source_.release();
    return;
  }
  if (give_back_ != nullptr) give_back_->Stop();
  if (free_queue_ != nullptr) {
    // Blocks freed while device work used them go back once it is done.
    free_queue_->WaitAll();
    // Blocks the library reported lost must not be freed at the daemon.
    if (lost_.pending()) ApplyLosses();
  }
  thread_caches_.reset();
  free_queue_.reset();
  size_classes_.reset();  // gives the leases back
  source_.reset();        // whole blocks, then the connection (its threads end)
  give_back_.reset();     // which they may have woken until then
}

bool CachingPool::Forked() const {
  return g_fork_epoch.load(std::memory_order_relaxed) != fork_epoch_;
}

absl::StatusOr<CachingPool::Arena*> CachingPool::ArenaFor(const v1::PlacementRequest& placement) {
  if (Forked()) return ForkedError();
  return arenas_.For(placement);
}

absl::StatusOr<void*> CachingPool::Allocate(uint64_t size, Arena* arena) {
  return AllocateOnStream(size, arena, nullptr, false);
}

absl::StatusOr<void*> CachingPool::AllocateOnStream(uint64_t size, Arena* arena, void* stream) {
  return AllocateOnStream(size, arena, stream, true);
}

absl::StatusOr<void*> CachingPool::AllocateOnStream(uint64_t size, Arena* arena, void* stream,
                                                    bool on_stream) {
  if (Forked()) return ForkedError();
  if (lost_.pending()) ApplyLosses();
  if (size == 0) return absl::InvalidArgumentError("size 0: ask for at least 1 byte");
  Block b;
  if (!thread_caches_->TakeParked(size, *arena, &b, stream, on_stream)) {
    absl::StatusOr<Block> fresh = thread_caches_->Allocate(size, *arena);
    if (!fresh.ok()) return fresh.status();
    b = *std::move(fresh);
  }
  if (b.lease != nullptr) b.lease->shadow.MarkLive(b.ptr - b.lease->base, b.handle, b.cls);
  return reinterpret_cast<void*>(b.ptr);
}

absl::StatusOr<std::vector<CachingPool::Shard>> CachingPool::AllocateSharded(
    uint64_t total, uint32_t shards, const v1::PlacementRequest& placement) {
  if (Forked()) return ForkedError();
  if (total == 0 || shards == 0) {
    return absl::InvalidArgumentError("sharded allocation needs a size and a shard count above 0");
  }
  if (lost_.pending()) ApplyLosses();
  return source_->AllocateSharded(total, shards, placement);
}

absl::Status CachingPool::Free(void* ptr) { return FreeWith(ptr, ReuseAfter::DeviceWork()); }

absl::Status CachingPool::FreeAfterStream(void* ptr, void* stream) {
  return FreeWith(ptr, ReuseAfter::StreamWork(stream));
}

absl::Status CachingPool::FreeWith(void* ptr, const ReuseAfter& after) {
  if (Forked()) return ForkedError();
  if (lost_.pending()) ApplyLosses();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (Lease* lease = size_classes_->FindLease(p)) {
    const uint64_t off = p - lease->base;
    if (off & (kGranule - 1)) {
      return LibraryError(
          GPUMEM_E_DOUBLE_FREE,
          absl::StrFormat("%p is inside a block of this client but not its start", ptr));
    }
    const BlockShadow::Word w = lease->shadow.Take(off);
    if (!w.live) {
      return LibraryError(
          GPUMEM_E_DOUBLE_FREE,
          absl::StrFormat(
              "%p is not a live block: freed already (double free), or not the start of one", ptr));
    }
    Block b;
    b.ptr = p;
    b.bytes = ClassSize(w.cls);
    b.lease = lease;
    b.handle = w.handle;
    b.cls = w.cls;
    // Device memory freed on a stream is kept for that stream, unless the
    // stream captures a graph (then every replay uses it: FreeQueue holds it).
    ThreadCaches::Evicted evicted;
    if ((!lease->on_device || (after.stream_ordered && free_queue_->MayReuseOnStream(after.stream))) &&
        thread_caches_->Park(b, after, &evicted)) {
      if (evicted.any) return free_queue_->Free(std::move(evicted.block), evicted.after);
      return absl::OkStatus();
    }
    return thread_caches_->Free(std::move(b), after);
  }
  if (p == 0) return absl::OkStatus();  // free(NULL) does nothing
  if (std::unique_ptr<Buffer> whole = source_->TakeWhole(p)) {
    Block b;
    b.ptr = p;
    b.bytes = whole->size();
    b.whole = std::move(whole);
    return thread_caches_->Free(std::move(b), after);
  }
  if (source_->FreeLost(p) || size_classes_->FreeLost(p) || IsLost(p)) {
    return LibraryError(
        GPUMEM_E_LOST,
        absl::StrFormat("%p was lost when the daemon restarted; the pointer is invalid", ptr));
  }
  return LibraryError(GPUMEM_E_FOREIGN_POINTER,
                      absl::StrFormat("%p was not allocated by this client", ptr));
}

absl::StatusOr<int> CachingPool::DeviceOf(const void* ptr) {
  if (Forked()) return ForkedError();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (Lease* lease = size_classes_->FindLease(p)) {
    const uint64_t off = p - lease->base;
    if ((off & (kGranule - 1)) == 0 && lease->shadow.IsLive(off)) return lease->device;
    return LibraryError(GPUMEM_E_DOUBLE_FREE,
                        absl::StrFormat("%p is not the start of a live block", ptr));
  }
  if (auto whole = source_->FindWhole(p)) return whole->device;
  if (IsLost(p)) {
    return LibraryError(GPUMEM_E_LOST, "the block was lost when the daemon restarted");
  }
  return LibraryError(GPUMEM_E_FOREIGN_POINTER,
                      absl::StrFormat("%p was not allocated by this client", ptr));
}

absl::StatusOr<int> CachingPool::OrdinalOf(const void* ptr) {
  if (Forked()) return ForkedError();
  absl::StatusOr<int> daemon_index = DeviceOf(ptr);  // a live block, or why not
  if (!daemon_index.ok()) return daemon_index.status();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  bool on_device = false;
  std::string uuid;
  if (Lease* lease = size_classes_->FindLease(p)) {
    on_device = lease->on_device;
    uuid = lease->uuid;
  } else {
    auto whole = source_->FindWhole(p);
    if (!whole) return LibraryError(GPUMEM_E_FOREIGN_POINTER, "not a live block");
    on_device = whole->on_device;
    uuid = std::move(whole->uuid);
  }
  if (!on_device) return -1;
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok()) return d.status();
  absl::StatusOr<CudaDeviceContext> dev = CudaDeviceContext::Find(**d, uuid);
  if (!dev.ok()) return dev.status();
  return dev->ordinal;
}

absl::StatusOr<CachingPool::DmaBuf> CachingPool::ExportDmaBuf(const void* ptr, uint64_t size) {
  if (Forked()) return ForkedError();
  absl::StatusOr<int> daemon_index = DeviceOf(ptr);  // a live block, or why not
  if (!daemon_index.ok()) return daemon_index.status();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  uintptr_t lo, hi;
  bool on_device;
  std::string uuid;
  if (Lease* lease = size_classes_->FindLease(p)) {
    lo = lease->base;
    hi = lease->base + lease->size;
    on_device = lease->on_device;
    uuid = lease->uuid;
  } else {
    auto whole = source_->FindWhole(p);
    if (!whole) return LibraryError(GPUMEM_E_FOREIGN_POINTER, "not a live block");
    lo = p;
    hi = p + whole->size;
    on_device = whole->on_device;
    uuid = std::move(whole->uuid);
  }
  if (size == 0 || size > hi - p) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%u bytes from %p: the block's memory ends %u bytes after it", size, ptr, hi - p));
  }
  if (!on_device) {
    return absl::FailedPreconditionError(
        "host memory (the sim backend) has no dma-buf: its slab is a memfd mapping");
  }
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok()) return d.status();
  absl::StatusOr<CudaDeviceContext> dev = CudaDeviceContext::Find(**d, uuid);
  if (!dev.ok()) return dev.status();
  int supported = 0;
  CUdevice cu_dev;
  if ((*d)->cuDeviceGet(&cu_dev, dev->ordinal) != CUDA_SUCCESS ||
      (*d)->cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, cu_dev) !=
          CUDA_SUCCESS ||
      !supported) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", uuid, " does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)"));
  }
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = std::max(lo, p / page * page);
  const uintptr_t end = std::min(hi, (p + size + page - 1) / page * page);
  ScopedCudaContext scope(**d, dev->ctx);
  absl::Status s = dev->Entered(**d, scope);
  int fd = -1;
  if (s.ok()) {
    s = CudaStatus(**d,
                   (*d)->cuMemGetHandleForAddressRange(&fd, start, end - start,
                                                       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                   "cuMemGetHandleForAddressRange", absl::StrCat("device ", uuid));
  }
  if (!s.ok()) return s;
  return DmaBuf{fd, p - start};
}

absl::StatusOr<uint64_t> CachingPool::Trim() {
  if (Forked()) return ForkedError();
  if (lost_.pending()) ApplyLosses();
  return give_back_->Trim();
}

PoolStats CachingPool::Stats() {
  PoolStats st;
  // Each daemon the pool was served by: a restart the library came through
  // counts too.
  st.generation = 1 + source_->daemon().restarts();
  const SizeClassCache::Figures leases = size_classes_->Stats();
  st.cached_bytes = thread_caches_->CachedBytes();
  st.in_use_bytes =
      leases.carved_bytes > st.cached_bytes ? leases.carved_bytes - st.cached_bytes : 0;
  st.leases = leases.leases;
  st.leased_bytes = leases.leased_bytes;
  for (const auto& r : leases.rows) {
    st.rows.push_back({r.device, r.bytes, r.used_bytes, r.blocks_out});
  }
  const LeaseSource::Figures wholes = source_->Stats();
  st.large_blocks = wholes.blocks;
  st.large_bytes = wholes.bytes;
  st.large_bytes_by_device = wholes.bytes_by_device;
  st.lost_bytes = leases.lost_bytes + wholes.lost_bytes;
  const FreeQueue::Figures deferred = free_queue_->Stats();
  st.deferred_blocks = deferred.blocks;
  st.deferred_bytes = deferred.bytes;
  st.graph_held_blocks = deferred.graph_blocks;
  st.graph_held_bytes = deferred.graph_bytes;
  return st;
}

absl::StatusOr<Client*> CachingPool::Daemon() {
  if (Forked()) return ForkedError();
  return &source_->daemon();
}

// Most restarts lose nothing: the library re-presents every block and they
// carry on as they were.
void CachingPool::ApplyLosses() {
  const absl::flat_hash_set<uint64_t> ids = lost_.TakeIds();
  if (ids.empty()) return;
  if (size_classes_->MarkLost(ids)) {
    // Cached blocks of lost leases are nobody's: only blocks the program
    // holds keep a lost lease mapped.
    size_classes_->ForgetCached(thread_caches_->TakeLost());
  }
  source_->MarkLost(ids);
}

bool CachingPool::IsLost(uintptr_t p) {
  return source_->IsLost(p) || size_classes_->InLostLease(p) || lost_.Reserved(p);
}

}  // namespace client
}  // namespace gpumem
