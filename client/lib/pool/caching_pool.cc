// CachingPool: leases, thread caches, the lease table and daemon-restart
// handling (see caching_pool.h for what is guaranteed).
//
// Lock order: RegistryMu() (thread caches <-> pools) -> CachingPool::mu_ ->
// a ThreadCache's spin lock. The hot path takes only the spin lock.
#include "client/lib/pool/caching_pool.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fd_channel.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/pool/size_classes.h"
#include "common/alloc/offset_allocator.h"

namespace gpumem {
namespace client {

using size_classes::ClassOf;
using size_classes::ClassSize;
using size_classes::kGranuleShift;

namespace {

constexpr char kLibraryCodeUrl[] = "gpumem.client/library-code";
// Classes kept in thread caches: up to 1 MiB (ClassOf(1 MiB) == 79).
constexpr uint32_t kThreadClasses = 80;
constexpr uint32_t kPerBin = 8;
constexpr int kTlsSlots = 4;
// Words per granule in the shadow table. Blocks of different threads lie side
// by side in a lease, so their words share cache lines; a line per word (8)
// would cost 8 times the host memory for no gain.
constexpr uint64_t kShadowStride = 1;

// Shadow word of a 256-byte granule that starts a block.
constexpr uint64_t kLive = 1ull << 63;
constexpr uint64_t kFreed = 1ull << 62;  // a block started here and was freed
uint64_t LiveWord(uint32_t handle, uint32_t cls) {
  return kLive | (static_cast<uint64_t>(cls) << 32) | handle;
}
uint32_t HandleOf(uint64_t w) { return static_cast<uint32_t>(w); }
uint32_t ClassOfWord(uint64_t w) { return static_cast<uint32_t>(w >> 32) & 0xFFFFu; }

// Incremented in every fork() child, so a pool knows it was inherited.
std::atomic<uint64_t> g_fork_epoch{0};
void OnForkChild() { g_fork_epoch.fetch_add(1, std::memory_order_relaxed); }

std::atomic<uint64_t> g_next_id{1};

absl::Mutex* RegistryMu() {
  static absl::Mutex* mu = new absl::Mutex;
  return mu;
}

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

absl::Status ForkedError() {
  return LibraryError(GPUMEM_E_FORKED,
                      "this client belongs to the parent process (fork() child); "
                      "connect a new client in the child");
}

absl::Status LibraryError(int code, absl::string_view message) {
  absl::StatusCode near = absl::StatusCode::kFailedPrecondition;
  if (code == GPUMEM_E_FOREIGN_POINTER || code == GPUMEM_E_DOUBLE_FREE) {
    near = absl::StatusCode::kInvalidArgument;
  } else if (code == GPUMEM_E_LOST) {
    near = absl::StatusCode::kDataLoss;
  }
  absl::Status s(near, message);
  s.SetPayload(kLibraryCodeUrl, absl::Cord(absl::StrCat(static_cast<int>(code))));
  return s;
}

int LibraryCodeOf(const absl::Status& s) {
  auto p = s.GetPayload(kLibraryCodeUrl);
  int code = 0;
  if (p.has_value() && absl::SimpleAtoi(std::string(*p), &code)) return code;
  return s.raw_code();
}

struct CachingPool::Arena {
  uint64_t id;
  v1::PlacementRequest placement;
  std::vector<Lease*> leases;  // mu_
};

struct CachingPool::Lease {
  Buffer buffer;               // mu_
  uintptr_t base = 0;
  uint64_t size = 0;
  int device = -1;
  Arena* arena = nullptr;
  std::atomic<uint64_t>* shadow = nullptr;  // a word per granule, kShadowStride apart
  std::atomic<uint64_t>& Word(uint64_t offset) const {
    return shadow[(offset >> kGranuleShift) * kShadowStride];
  }
  uint64_t shadow_bytes = 0;
  std::unique_ptr<OffsetAllocator> alloc;   // mu_
  uint64_t blocks_out = 0;                  // mu_: live or thread-cached
  absl::Time empty_since;                   // mu_
  bool released = false;                    // mu_
  std::atomic<bool> lost{false};
  // Device memory (a CUDA handle kind): its frees are stream-ordered.
  bool on_device = false;
  std::string uuid;
};

struct CachingPool::LeaseTable {
  std::vector<uintptr_t> base;  // sorted
  std::vector<Lease*> lease;
};

struct CachingPool::LargeBlock {
  Buffer buffer;
  uint64_t generation = 0;  // the daemon connection it came from
};

// A freed block waiting for its fence: a lease's block (lease set) or a
// large block (large set).
struct CachingPool::DeferredFree {
  uintptr_t ptr = 0;
  uint64_t bytes = 0;
  Lease* lease = nullptr;
  uint32_t handle = 0, cls = 0;
  std::unique_ptr<LargeBlock> large;
  FreeFences::Fence fence;
  bool fence_ok = false;   // false: nothing to wait for (the device failed)
  bool device_rule = false;  // Free()'s rule, not FreeAfterStream()'s
};

namespace {
bool OnDevice(const Buffer& b) {
  return b.allocation().handle_kind() != v1::HANDLE_KIND_MEMFD &&
         b.allocation().handle_kind() != v1::HANDLE_KIND_UNSPECIFIED;
}
}  // namespace

namespace {
struct CachedBlock {
  uintptr_t ptr;
  CachingPool::Lease* lease;
  uint32_t handle;
};
}  // namespace

struct CachingPool::ThreadCache {
  std::atomic<bool> busy{false};
  CachingPool* pool = nullptr;  // RegistryMu(); null once detached or the pool is gone
  Arena* arena = nullptr;
  uint64_t arena_id = 0;
  // Under the spin lock:
  int64_t in_use = 0;  // may go negative: blocks freed here were taken elsewhere
  uint64_t cached_bytes = 0;
  uint64_t ops = 0, ops_seen = 0;
  struct Bin {
    uint32_t n = 0;
    CachedBlock b[kPerBin];
  };
  Bin bins[kThreadClasses];

  void Lock() {
    for (int spins = 0; busy.exchange(true, std::memory_order_acquire); ++spins) {
      if (spins > 64) sched_yield();
    }
  }
  void Unlock() { busy.store(false, std::memory_order_release); }
};

void DetachThreadCache(CachingPool::ThreadCache* tc);

namespace {
struct TlsCaches {
  struct Slot {
    uint64_t arena_id = 0;
    CachingPool::ThreadCache* tc = nullptr;
  };
  Slot slot[kTlsSlots];
  ~TlsCaches() {
    for (Slot& s : slot) {
      if (s.tc != nullptr) DetachThreadCache(s.tc);
      s.tc = nullptr;
    }
  }
};
thread_local TlsCaches tls_caches;
}  // namespace

// A thread is exiting (or its slot is reused): its cache's blocks go back to
// their leases and the cache is deleted.
void DetachThreadCache(CachingPool::ThreadCache* tc) {
  {
    absl::MutexLock reg(RegistryMu());
    CachingPool* pool = tc->pool;
    if (pool != nullptr) {
      absl::MutexLock lock(&pool->mu_);
      pool->DrainCacheLocked(tc);
      tc->Lock();
      pool->in_use_outside_caches_ += tc->in_use;
      tc->Unlock();
      pool->caches_.erase(std::find(pool->caches_.begin(), pool->caches_.end(), tc));
      tc->pool = nullptr;
    }
  }
  delete tc;
}

CachingPool::CachingPool(PoolOptions options)
    : options_(std::move(options)),
      fork_epoch_(g_fork_epoch.load()) {}

absl::StatusOr<std::unique_ptr<CachingPool>> CachingPool::Create(PoolOptions options) {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, OnForkChild); });
  if (options.socket_path.empty()) options.socket_path = DefaultSocketPath();
  if (options.lease_bytes < (64u << 10) || options.lease_bytes % size_classes::kGranule) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease size ", options.lease_bytes,
        " must be at least 64 KiB and a multiple of 256 bytes"));
  }
  if (options.cache_max_request == 0) options.cache_max_request = options.lease_bytes / 4;
  options.cache_max_request = std::min(options.cache_max_request, options.lease_bytes);
  if (options.idle_release_ms < 0) options.idle_release_ms = 0;
  if (options.reconnect_ms < 0) options.reconnect_ms = 0;
  std::unique_ptr<CachingPool> pool(new CachingPool(std::move(options)));
  // Before connecting: the client's stream reader writes it.
  pool->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (pool->wake_fd_ < 0) return absl::InternalError("eventfd failed");
  {
    absl::MutexLock lock(&pool->mu_);
    absl::Status s = pool->ConnectLocked();
    if (!s.ok()) return s;
  }
  CachingPool* raw = pool.get();
  pool->watcher_ = std::thread([raw] { raw->WatchLoop(); });
  return pool;
}

CachingPool::~CachingPool() {
  if (Forked()) {
    // The parent's leases and session: nothing may be freed or unmapped from
    // here (a free would reach the daemon as the parent's uid). Leak it all.
    if (watcher_.joinable()) new std::thread(std::move(watcher_));  // no such thread here
    new auto(std::move(leases_));
    new auto(std::move(large_));
    new auto(std::move(lost_large_));
    (void)client_.release();
    new auto(std::move(retired_clients_));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Blocks freed while device work used them go back once it is done.
  WaitDeferred(/*device_rule_only=*/false);
  if (watcher_.joinable()) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    watcher_.join();
  }
  absl::MutexLock reg(RegistryMu());
  absl::MutexLock lock(&mu_);
  // Blocks the library reported lost must not be freed at the daemon.
  EnsureConnectedLocked().IgnoreError();
  for (ThreadCache* tc : caches_) {
    tc->Lock();
    for (auto& bin : tc->bins) bin.n = 0;
    tc->Unlock();
    tc->pool = nullptr;  // its thread deletes it
  }
  caches_.clear();
  large_.clear();  // Buffer destructors free at the daemon
  for (auto& [ptr, block] : lost_large_) block->buffer.Abandon();
  lost_large_.clear();
  for (auto& lease : leases_) {
    if (lease->lost.load()) {
      lease->buffer.Abandon();
    } else if (!lease->released) {
      lease->buffer = Buffer();
    }
    if (lease->shadow != nullptr) munmap(lease->shadow, lease->shadow_bytes);
  }
  leases_.clear();
  table_.store(nullptr);
  tables_.clear();
  client_.reset();
  retired_clients_.clear();  // joins their stream readers, which write wake_fd_
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool CachingPool::Forked() const {
  return g_fork_epoch.load(std::memory_order_relaxed) != fork_epoch_;
}

absl::StatusOr<CachingPool::Arena*> CachingPool::ArenaFor(
    const v1::PlacementRequest& placement) {
  if (Forked()) return ForkedError();
  std::string key;
  {
    google::protobuf::io::StringOutputStream out(&key);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    placement.SerializeToCodedStream(&coded);
  }
  absl::MutexLock lock(&mu_);
  auto it = arena_by_key_.find(key);
  if (it != arena_by_key_.end()) return it->second;
  auto arena = std::make_unique<Arena>();
  arena->id = g_next_id.fetch_add(1);
  arena->placement = placement;
  Arena* raw = arena.get();
  arenas_.push_back(std::move(arena));
  arena_by_key_[key] = raw;
  return raw;
}

CachingPool::ThreadCache* CachingPool::CacheFor(Arena* arena) {
  TlsCaches& t = tls_caches;
  for (auto& s : t.slot) {
    if (s.arena_id == arena->id) return s.tc;
  }
  TlsCaches::Slot* free_slot = nullptr;
  {
    absl::MutexLock reg(RegistryMu());
    for (auto& s : t.slot) {
      if (s.tc == nullptr || s.tc->pool == nullptr) {  // empty, or its pool is gone
        free_slot = &s;
        break;
      }
    }
  }
  if (free_slot == nullptr) return nullptr;  // served uncached
  if (free_slot->tc != nullptr) DetachThreadCache(free_slot->tc);
  auto* tc = new ThreadCache;
  tc->arena = arena;
  tc->arena_id = arena->id;
  {
    absl::MutexLock reg(RegistryMu());
    absl::MutexLock lock(&mu_);
    tc->pool = this;
    caches_.push_back(tc);
  }
  free_slot->arena_id = arena->id;
  free_slot->tc = tc;
  return tc;
}

CachingPool::Lease* CachingPool::FindLease(uintptr_t p) const {
  const LeaseTable* t = table_.load(std::memory_order_acquire);
  if (t == nullptr || t->base.empty()) return nullptr;
  auto it = std::upper_bound(t->base.begin(), t->base.end(), p);
  if (it == t->base.begin()) return nullptr;
  Lease* lease = t->lease[(it - t->base.begin()) - 1];
  return p - lease->base < lease->size ? lease : nullptr;
}

absl::StatusOr<void*> CachingPool::Allocate(uint64_t size, Arena* arena) {
  if (Forked()) return ForkedError();
  if (daemon_lost_.load(std::memory_order_relaxed)) NoteLosses();
  if (size == 0) return absl::InvalidArgumentError("size 0: ask for at least 1 byte");
  if (size > options_.cache_max_request) return AllocateSlow(size, 0, arena);
  const uint32_t cls = ClassOf(size);
  if (cls < kThreadClasses && !daemon_lost_.load(std::memory_order_relaxed)) {
    ThreadCache* tc = CacheFor(arena);
    if (tc != nullptr) {
      tc->Lock();
      ++tc->ops;
      ThreadCache::Bin& bin = tc->bins[cls];
      if (bin.n > 0) {
        const CachedBlock b = bin.b[--bin.n];
        const uint64_t bytes = ClassSize(cls);
        tc->cached_bytes -= bytes;
        tc->in_use += static_cast<int64_t>(bytes);
        tc->Unlock();
        b.lease->Word(b.ptr - b.lease->base).store(
            LiveWord(b.handle, cls), std::memory_order_release);
        return reinterpret_cast<void*>(b.ptr);
      }
      tc->Unlock();
    }
  }
  return AllocateSlow(size, cls, arena);
}

absl::StatusOr<void*> CachingPool::AllocateSlow(uint64_t size, uint32_t cls,
                                                Arena* arena) {
  absl::StatusOr<void*> out = absl::UnknownError("not tried");
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      absl::MutexLock lock(&mu_);
      CollectDeferredLocked();
      out = AllocateSlowLocked(size, cls, arena);
    }
    // The daemon has no memory left: blocks freed while device work used
    // them will do once that work is done.
    if (out.ok() || out.status().code() != absl::StatusCode::kResourceExhausted ||
        !HasDeferred()) {
      break;
    }
    WaitDeferred(/*device_rule_only=*/false);
  }
  return out;
}

absl::StatusOr<void*> CachingPool::AllocateSlowLocked(uint64_t size, uint32_t cls,
                                                      Arena* arena) {
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  if (size > options_.cache_max_request || ClassSize(cls) > options_.lease_bytes) {
    return AllocateLarge(size, arena->placement);
  }
  const uint64_t bytes = ClassSize(cls);
  OffsetAllocator::Block b;
  Lease* lease = nullptr;
  for (Lease* l : arena->leases) {
    if (l->alloc->Allocate(bytes, 1, &b)) {
      lease = l;
      break;
    }
  }
  if (lease == nullptr) {
    const uint64_t align = options_.lease_bytes >= (2u << 20) ? (2u << 20) : PageSize();
    client_->SetUsageReport(UsageLocked(static_cast<int64_t>(options_.lease_bytes),
                                        static_cast<int64_t>(bytes)));
    absl::StatusOr<Buffer> buf =
        client_->Allocate(options_.lease_bytes, arena->placement, align);
    if (!buf.ok()) {
      // No room for a whole lease: the request alone may still fit.
      if (buf.status().code() == absl::StatusCode::kResourceExhausted) {
        return AllocateLarge(size, arena->placement);
      }
      return absl::Status(buf.status().code(),
                          absl::StrCat("leasing ", options_.lease_bytes,
                                       " bytes from the daemon: ", buf.status().message()));
    }
    auto l = std::make_unique<Lease>();
    l->base = reinterpret_cast<uintptr_t>(buf->data());
    l->size = buf->size();
    l->device = static_cast<int>(buf->device_index());
    l->arena = arena;
    l->shadow_bytes = (l->size >> kGranuleShift) * kShadowStride * sizeof(uint64_t);
    void* shadow = mmap(nullptr, l->shadow_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (shadow == MAP_FAILED || l->base == 0 || l->base % size_classes::kGranule) {
      if (shadow != MAP_FAILED) munmap(shadow, l->shadow_bytes);
      return absl::InternalError(absl::StrCat(
          "lease of ", l->size, " bytes could not be set up (host memory, or a "
          "block that is not 256-byte aligned)"));
    }
    l->shadow = static_cast<std::atomic<uint64_t>*>(shadow);
    l->alloc = std::make_unique<OffsetAllocator>(l->size);
    l->on_device = OnDevice(*buf);
    l->uuid = buf->device_uuid();
    if (l->on_device) EnsureFencesLocked(*buf);
    l->buffer = std::move(*buf);
    lease = l.get();
    leases_.push_back(std::move(l));
    arena->leases.push_back(lease);
    PublishLeasesLocked();
    if (!lease->alloc->Allocate(bytes, 1, &b)) {
      return absl::InternalError("a fresh lease could not hold a cached block");
    }
  }
  ++lease->blocks_out;
  in_use_outside_caches_ += static_cast<int64_t>(bytes);
  lease->Word(b.offset).store(LiveWord(b.handle, cls),
                                                 std::memory_order_release);
  return reinterpret_cast<void*>(lease->base + b.offset);
}

absl::StatusOr<void*> CachingPool::AllocateLarge(uint64_t size,
                                                 const v1::PlacementRequest& p) {
  absl::StatusOr<Buffer> buf = client_->Allocate(size, p);
  if (!buf.ok()) return buf.status();
  void* data = buf->data();
  if (OnDevice(*buf)) EnsureFencesLocked(*buf);
  auto block = std::make_unique<LargeBlock>();
  block->buffer = std::move(*buf);
  block->generation = generation_;
  large_[reinterpret_cast<uintptr_t>(data)] = std::move(block);
  return data;
}

absl::StatusOr<std::vector<CachingPool::Shard>> CachingPool::AllocateSharded(
    uint64_t total, uint32_t shards, const v1::PlacementRequest& placement) {
  if (Forked()) return ForkedError();
  if (total == 0 || shards == 0) {
    return absl::InvalidArgumentError("sharded allocation needs a size and a shard count above 0");
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  absl::StatusOr<std::vector<Buffer>> bufs =
      client_->AllocateSharded(total, shards, placement);
  if (!bufs.ok()) return bufs.status();
  std::vector<Shard> out;
  for (Buffer& b : *bufs) {
    out.push_back({b.data(), b.size(), static_cast<int>(b.device_index())});
    if (OnDevice(b)) EnsureFencesLocked(b);
    auto block = std::make_unique<LargeBlock>();
    block->buffer = std::move(b);
    block->generation = generation_;
    large_[reinterpret_cast<uintptr_t>(out.back().ptr)] = std::move(block);
  }
  return out;
}

absl::Status CachingPool::Free(void* ptr) { return FreeWith(ptr, false, nullptr); }

absl::Status CachingPool::FreeAfterStream(void* ptr, void* stream) {
  return FreeWith(ptr, true, stream);
}

absl::Status CachingPool::FreeWith(void* ptr, bool after_stream, void* stream) {
  if (Forked()) return ForkedError();
  if (daemon_lost_.load(std::memory_order_relaxed)) NoteLosses();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Lease* lease = FindLease(p);
  if (lease == nullptr) return FreeLarge(p, after_stream, stream);
  const uint64_t off = p - lease->base;
  if (off & (size_classes::kGranule - 1)) {
    return LibraryError(GPUMEM_E_DOUBLE_FREE, absl::StrFormat(
        "%p is inside a block of this client but not its start", ptr));
  }
  const uint64_t word =
      lease->Word(off).exchange(kFreed, std::memory_order_acq_rel);
  if ((word & kLive) == 0) {
    return LibraryError(GPUMEM_E_DOUBLE_FREE, absl::StrFormat(
        "%p is not a live block: freed already (double free), or not the start of one",
        ptr));
  }
  const uint32_t cls = ClassOfWord(word);
  const uint64_t bytes = ClassSize(cls);
  if (lease->on_device) {
    DeferredFree d;
    d.ptr = p;
    d.bytes = bytes;
    d.lease = lease;
    d.handle = HandleOf(word);
    d.cls = cls;
    Defer(std::move(d), lease->uuid, after_stream, stream);
    return absl::OkStatus();
  }
  if (cls < kThreadClasses) {
    ThreadCache* tc = CacheFor(lease->arena);
    if (tc != nullptr) {
      tc->Lock();
      ++tc->ops;
      ThreadCache::Bin& bin = tc->bins[cls];
      // A lease lost to a daemon restart is never cached again (checked under
      // the cache lock, which the restart handler takes after setting it).
      if (bin.n < kPerBin && tc->cached_bytes + bytes <= options_.lease_bytes / 8 &&
          !lease->lost.load(std::memory_order_relaxed)) {
        bin.b[bin.n++] = CachedBlock{p, lease, HandleOf(word)};
        tc->cached_bytes += bytes;
        tc->in_use -= static_cast<int64_t>(bytes);
        tc->Unlock();
        return absl::OkStatus();
      }
      tc->Unlock();
    }
  }
  absl::MutexLock lock(&mu_);
  if (lease->lost.load()) {
    LostBlockFreedLocked(lease);
    return LibraryError(GPUMEM_E_LOST, absl::StrFormat(
        "%p was lost when the daemon restarted; the pointer is invalid", ptr));
  }
  in_use_outside_caches_ -= static_cast<int64_t>(bytes);
  ReturnToLeaseLocked(lease, p, HandleOf(word), cls);
  return absl::OkStatus();
}

absl::Status CachingPool::FreeLarge(uintptr_t p, bool after_stream, void* stream) {
  if (p == 0) return absl::OkStatus();  // free(NULL) does nothing
  absl::MutexLock lock(&mu_);
  absl::Status connected = EnsureConnectedLocked();  // notices a restart first
  auto it = large_.find(p);
  if (it != large_.end()) {
    std::unique_ptr<LargeBlock> block = std::move(it->second);
    large_.erase(it);
    if (!connected.ok()) {  // cannot happen after a restart: that moves it to lost_large_
      return connected;
    }
    if (OnDevice(block->buffer)) {
      DeferredFree d;
      d.ptr = p;
      d.bytes = block->buffer.size();
      const std::string uuid = block->buffer.device_uuid();
      d.large = std::move(block);
      mu_.Unlock();  // Defer may wait; it takes the locks it needs
      Defer(std::move(d), uuid, after_stream, stream);
      mu_.Lock();
      return absl::OkStatus();
    }
    return block->buffer.Free();
  }
  bool found;
  absl::Status lost = FreeLostLocked(p, &found);
  if (found) return lost;
  return LibraryError(GPUMEM_E_FOREIGN_POINTER, absl::StrFormat(
      "%p was not allocated by this client", reinterpret_cast<void*>(p)));
}

void CachingPool::EnsureFencesLocked(const Buffer& b) {
  if (fences_owner_ != nullptr) return;
  (void)b;
  // The mapper that opened the block loaded the driver already.
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok()) return;  // frees then wait for nothing (cannot happen: it is mapped)
  fences_owner_ = std::make_unique<FreeFences>(*d);
  fences_.store(fences_owner_.get(), std::memory_order_release);
}

void CachingPool::Defer(DeferredFree d, const std::string& uuid, bool after_stream,
                        void* stream) {
  FreeFences* fences = fences_.load(std::memory_order_acquire);
  if (fences != nullptr) {
    absl::StatusOr<FreeFences::Fence> f =
        after_stream ? fences->AfterStream(uuid, static_cast<CUstream>(stream))
                     : fences->AfterDevice(uuid);
    // A stream this library cannot record on (another context's): the
    // device's work, which covers it when it is of the primary context.
    if (!f.ok() && after_stream) f = fences->AfterDevice(uuid);
    if (f.ok()) {
      d.fence = *f;
      d.fence_ok = true;
    }
  }
  d.device_rule = d.fence_ok && d.fence.event == nullptr;
  bool over;
  {
    absl::MutexLock dl(&deferred_mu_);
    deferred_bytes_ += d.bytes;
    ++deferred_count_;
    if (d.device_rule) {
      deferred_device_rule_bytes_ += d.bytes;
      ++deferred_device_rule_count_;
      if (device_queues_.size() <= static_cast<size_t>(d.fence.device)) {
        device_queues_.resize(d.fence.device + 1);
      }
      device_queues_[d.fence.device].push_back(std::move(d));
    } else {
      stream_queue_.push_back(std::move(d));
    }
    over = deferred_device_rule_bytes_ > 2 * options_.lease_bytes ||
           deferred_device_rule_count_ > 8192;
  }
  // Free()'s blocks are bounded: past two leases' worth (or 8192 blocks),
  // one synchronize of their devices gives them all back.
  if (over) WaitDeferred(/*device_rule_only=*/true);
}

bool CachingPool::HasDeferred() {
  absl::MutexLock dl(&deferred_mu_);
  return deferred_count_ > 0;
}

void CachingPool::CollectDeferredLocked() {
  std::vector<DeferredFree> ready;
  {
    absl::MutexLock dl(&deferred_mu_);
    if (deferred_count_ == 0) return;
    FreeFences* fences = fences_.load(std::memory_order_acquire);
    auto passed = [&](const DeferredFree& d) {
      return !d.fence_ok || fences == nullptr || fences->Passed(d.fence);
    };
    auto take = [&](DeferredFree& d) {
      deferred_bytes_ -= d.bytes;
      --deferred_count_;
      if (d.device_rule) {
        deferred_device_rule_bytes_ -= d.bytes;
        --deferred_device_rule_count_;
      }
      if (d.fence_ok && fences != nullptr) fences->Release(d.fence);
      ready.push_back(std::move(d));
    };
    // A device's queue is in fence order: what passed is a prefix.
    for (std::deque<DeferredFree>& q : device_queues_) {
      while (!q.empty() && passed(q.front())) {
        take(q.front());
        q.pop_front();
      }
    }
    // Events of different streams pass in any order: look at the oldest few.
    std::deque<DeferredFree> keep;
    int looked = 0;
    while (!stream_queue_.empty() && looked++ < 64) {
      DeferredFree& d = stream_queue_.front();
      if (passed(d)) {
        take(d);
      } else {
        keep.push_back(std::move(d));
      }
      stream_queue_.pop_front();
    }
    while (!keep.empty()) {
      stream_queue_.push_front(std::move(keep.back()));
      keep.pop_back();
    }
  }
  for (DeferredFree& d : ready) {
    if (d.lease != nullptr) {
      if (d.lease->lost.load()) {
        LostBlockFreedLocked(d.lease);
      } else {
        in_use_outside_caches_ -= static_cast<int64_t>(d.bytes);
        ReturnToLeaseLocked(d.lease, d.ptr, d.handle, d.cls);
      }
    } else if (d.large->generation != generation_ || client_ == nullptr) {
      // Its daemon went away meanwhile: a new one may have reused the id.
      const uint64_t size = d.large->buffer.size();
      d.large->buffer.Abandon();
      ReserveLost(d.ptr, size);
    } else {
      d.large->buffer.Free().IgnoreError();  // a daemon gone reclaims it itself
    }
  }
}

void CachingPool::WaitDeferred(bool device_rule_only) {
  std::vector<FreeFences::Fence> wait;
  FreeFences* fences = fences_.load(std::memory_order_acquire);
  {
    absl::MutexLock dl(&deferred_mu_);
    // The oldest fence of each device: waiting for it synchronizes the
    // device, which covers every fence taken before that began.
    for (const std::deque<DeferredFree>& q : device_queues_) {
      if (!q.empty()) wait.push_back(q.front().fence);
    }
    if (!device_rule_only) {
      for (const DeferredFree& d : stream_queue_) {
        if (d.fence_ok) wait.push_back(d.fence);
      }
    }
  }
  for (const FreeFences::Fence& f : wait) {
    if (fences != nullptr) fences->Wait(f).IgnoreError();  // failed: counts as passed
  }
  absl::MutexLock lock(&mu_);
  // Everything waited for has passed now, whatever the order.
  for (int round = 0; round < 1 + static_cast<int>(wait.size() / 64); ++round) {
    CollectDeferredLocked();
  }
}

absl::StatusOr<int> CachingPool::DeviceOf(const void* ptr) {
  if (Forked()) return ForkedError();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (Lease* lease = FindLease(p)) {
    const uint64_t off = p - lease->base;
    if ((off & (size_classes::kGranule - 1)) == 0 &&
        (lease->Word(off).load(std::memory_order_acquire) & kLive)) {
      return lease->device;
    }
    return LibraryError(GPUMEM_E_DOUBLE_FREE, absl::StrFormat("%p is not the start of a live block", ptr));
  }
  absl::MutexLock lock(&mu_);
  auto it = large_.find(p);
  if (it != large_.end()) return static_cast<int>(it->second->buffer.device_index());
  if (IsLost(p)) return LibraryError(GPUMEM_E_LOST, "the block was lost when the daemon restarted");
  return LibraryError(GPUMEM_E_FOREIGN_POINTER, absl::StrFormat("%p was not allocated by this client", ptr));
}

absl::StatusOr<int> CachingPool::OrdinalOf(const void* ptr) {
  if (Forked()) return ForkedError();
  absl::StatusOr<int> daemon_index = DeviceOf(ptr);  // a live block, or why not
  if (!daemon_index.ok()) return daemon_index.status();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  bool on_device = false;
  std::string uuid;
  if (Lease* lease = FindLease(p)) {
    on_device = lease->on_device;
    uuid = lease->uuid;
  } else {
    absl::MutexLock lock(&mu_);
    auto it = large_.find(p);
    if (it == large_.end()) return LibraryError(GPUMEM_E_FOREIGN_POINTER, "not a live block");
    on_device = OnDevice(it->second->buffer);
    uuid = it->second->buffer.device_uuid();
  }
  if (!on_device) return -1;
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok()) return d.status();
  absl::StatusOr<CudaDeviceContext> dev = CudaDeviceContext::Find(**d, uuid);
  if (!dev.ok()) return dev.status();
  return dev->ordinal;
}

void CachingPool::ReturnToLeaseLocked(Lease* lease, uintptr_t ptr, uint32_t handle,
                                      uint32_t cls) {
  if (lease->lost.load() || lease->released) return;  // nothing to give back to
  OffsetAllocator::Block b;
  b.offset = ptr - lease->base;
  b.size = ClassSize(cls);
  b.handle = handle;
  lease->alloc->Free(b);
  if (--lease->blocks_out == 0) lease->empty_since = absl::Now();
}

void CachingPool::DrainCacheLocked(ThreadCache* tc) {
  std::vector<std::pair<CachedBlock, uint32_t>> blocks;
  tc->Lock();
  for (uint32_t c = 0; c < kThreadClasses; ++c) {
    ThreadCache::Bin& bin = tc->bins[c];
    for (uint32_t i = 0; i < bin.n; ++i) blocks.push_back({bin.b[i], c});
    bin.n = 0;
  }
  tc->cached_bytes = 0;
  tc->Unlock();
  for (const auto& [b, c] : blocks) ReturnToLeaseLocked(b.lease, b.ptr, b.handle, c);
}

uint64_t CachingPool::ReleaseEmptyLeasesLocked(absl::Duration min_idle) {
  const absl::Time now = absl::Now();
  uint64_t released = 0;
  for (auto& arena : arenas_) {
    auto& ls = arena->leases;
    for (size_t i = 0; i < ls.size();) {
      Lease* l = ls[i];
      if (l->blocks_out != 0 || now - l->empty_since < min_idle) {
        ++i;
        continue;
      }
      l->released = true;
      released += l->size;
      if (client_ != nullptr) {
        client_->SetUsageReport(UsageLocked(-static_cast<int64_t>(l->size), 0));
      }
      l->buffer.Free().IgnoreError();  // a daemon that is gone reclaims it itself
      // Readers that found the lease just before see zero words (not live).
      madvise(l->shadow, l->shadow_bytes, MADV_DONTNEED);
      l->alloc.reset();
      ls.erase(ls.begin() + i);
    }
  }
  if (released > 0) PublishLeasesLocked();
  return released;
}

v1::UsageReport CachingPool::UsageLocked(int64_t leased_delta, int64_t in_use_delta) {
  int64_t leased = leased_delta;
  for (auto& arena : arenas_) {
    for (Lease* l : arena->leases) leased += static_cast<int64_t>(l->size);
  }
  int64_t in_use = in_use_outside_caches_ + in_use_delta;
  for (ThreadCache* tc : caches_) {
    tc->Lock();
    in_use += tc->in_use;
    tc->Unlock();
  }
  leased = std::max<int64_t>(leased, 0);
  in_use = std::clamp<int64_t>(in_use, 0, leased);
  v1::UsageReport usage;
  usage.set_leased_bytes(static_cast<uint64_t>(leased));
  usage.set_in_use_bytes(static_cast<uint64_t>(in_use));
  return usage;
}

void CachingPool::PublishLeasesLocked() {
  auto t = std::make_unique<LeaseTable>();
  std::vector<Lease*> all;
  for (auto& arena : arenas_) all.insert(all.end(), arena->leases.begin(), arena->leases.end());
  std::sort(all.begin(), all.end(), [](Lease* a, Lease* b) { return a->base < b->base; });
  for (Lease* l : all) {
    t->base.push_back(l->base);
    t->lease.push_back(l);
  }
  table_.store(t.get(), std::memory_order_release);
  tables_.push_back(std::move(t));  // earlier tables stay readable (header)
}

absl::Status CachingPool::ConnectLocked() {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options_.socket_path);
  if (!c.ok()) return c.status();
  client_ = std::move(*c);
  // Both run on the client's own threads: they only flag the work for the
  // watcher (they must not wait for mu_, which a call waiting for the
  // restart may hold).
  client_->OnReclaimRequest([this](const v1::ReclaimRequest&) {
    reclaim_wanted_.store(true);
    Wake();
  });
  client_->OnRestart([this](const Client::RestartReport& report) {
    if (report.lost.empty()) return;  // every lease and block survived
    {
      absl::MutexLock lock(&lost_mu_);
      for (const auto& [id, why] : report.lost) lost_ids_.insert(id);
    }
    daemon_lost_.store(true);
    Wake();
  });
  ++generation_;
  Wake();
  return absl::OkStatus();
}

void CachingPool::NoteLosses() {
  absl::MutexLock lock(&mu_);
  if (!stopping_) HandleDaemonLostLocked();
}

void CachingPool::Wake() {
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

absl::Status CachingPool::EnsureConnectedLocked() {
  if (daemon_lost_.load() && client_ != nullptr) HandleDaemonLostLocked();
  if (client_ != nullptr) return absl::OkStatus();
  if (stopping_) return LibraryError(GPUMEM_E_CLOSED, "the client is closing");
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options_.reconnect_ms);
  absl::Duration backoff = absl::Milliseconds(10);
  for (;;) {
    absl::Status s = ConnectLocked();
    if (s.ok()) return s;
    if (absl::Now() + backoff > deadline) {
      return absl::UnavailableError(absl::StrCat(
          "no gpumemd answers at ", options_.socket_path, " (waited ",
          options_.reconnect_ms, " ms; set GPUMEM_RECONNECT_MS to wait longer): ",
          s.message()));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

// Leases and large blocks the client library reported lost at a restart
// (most restarts lose nothing: the library re-presents every block and they
// carry on as they were).
void CachingPool::HandleDaemonLostLocked() {
  absl::flat_hash_set<uint64_t> ids;
  {
    absl::MutexLock lock(&lost_mu_);
    ids.swap(lost_ids_);
    daemon_lost_.store(false);
  }
  if (ids.empty()) return;
  bool any_lease = false;
  for (auto& arena : arenas_) {
    for (auto it = arena->leases.begin(); it != arena->leases.end();) {
      Lease* l = *it;
      if (!ids.contains(l->buffer.id())) {
        ++it;
        continue;
      }
      l->lost.store(true);
      lost_bytes_ += l->size;
      lost_leases_.push_back(l);
      it = arena->leases.erase(it);
      any_lease = true;
    }
  }
  if (any_lease) {
    PublishLeasesLocked();
    // Cached blocks of lost leases are nobody's: only blocks the program
    // holds keep a lost lease mapped.
    for (ThreadCache* tc : caches_) {
      tc->Lock();
      for (uint32_t cls = 0; cls < kThreadClasses; ++cls) {
        auto& bin = tc->bins[cls];
        uint32_t kept = 0;
        for (uint32_t i = 0; i < bin.n; ++i) {
          if (bin.b[i].lease->lost.load()) {
            --bin.b[i].lease->blocks_out;
            const uint64_t bytes = ClassSize(cls);
            tc->cached_bytes -= std::min<uint64_t>(tc->cached_bytes, bytes);
          } else {
            bin.b[kept++] = bin.b[i];
          }
        }
        bin.n = kept;
      }
      tc->Unlock();
    }
  }
  for (auto it = large_.begin(); it != large_.end();) {
    if (!ids.contains(it->second->buffer.id())) {
      ++it;
      continue;
    }
    lost_bytes_ += it->second->buffer.size();
    lost_large_[it->first] = std::move(it->second);
    large_.erase(it++);
  }
  for (size_t i = 0; i < lost_leases_.size();) {
    if (lost_leases_[i]->blocks_out == 0) {
      UnmapLostLeaseLocked(lost_leases_[i]);
      lost_leases_.erase(lost_leases_.begin() + i);
    } else {
      ++i;
    }
  }
}

void CachingPool::UnmapLostLeaseLocked(Lease* l) {
  const uintptr_t base = l->base;
  const uint64_t size = l->size;
  l->buffer.Abandon();
  madvise(l->shadow, l->shadow_bytes, MADV_DONTNEED);
  ReserveLost(base, size);
}

absl::Status CachingPool::FreeLostLocked(uintptr_t p, bool* found) {
  *found = true;
  const absl::Status lost = LibraryError(GPUMEM_E_LOST, absl::StrFormat(
      "%p was lost when the daemon restarted; the pointer is invalid",
      reinterpret_cast<void*>(p)));
  auto it = lost_large_.find(p);
  if (it != lost_large_.end()) {
    const uint64_t size = it->second->buffer.size();
    it->second->buffer.Abandon();
    lost_large_.erase(it);
    ReserveLost(p, size);
    return lost;
  }
  for (size_t i = 0; i < lost_leases_.size(); ++i) {
    Lease* l = lost_leases_[i];
    if (p - l->base >= l->size) continue;
    const uint64_t off = p - l->base;
    if ((off & (size_classes::kGranule - 1)) == 0 &&
        (l->Word(off).exchange(kFreed) & kLive)) {
      LostBlockFreedLocked(l);
    }
    return lost;
  }
  if (IsLost(p)) return lost;
  *found = false;
  return absl::OkStatus();
}

void CachingPool::LostBlockFreedLocked(Lease* l) {
  if (--l->blocks_out != 0) return;
  auto it = std::find(lost_leases_.begin(), lost_leases_.end(), l);
  if (it != lost_leases_.end()) lost_leases_.erase(it);
  UnmapLostLeaseLocked(l);
}

// Records a lost block's addresses, so a stale pointer into them answers
// GPUMEM_E_LOST. They are kept from being handed out again by the mapper
// (Buffer::Abandon retires the slab: the CUDA address reservation, or an
// inaccessible host mapping, stays until the client goes), not here: a CUDA
// reservation is not a host mapping, so no host mmap could hold it.
void CachingPool::ReserveLost(uintptr_t begin, uint64_t size) {
  for (auto& [b, n] : lost_) {
    if (begin >= b && begin + size <= b + n) return;
  }
  lost_.push_back({begin, size});
}

bool CachingPool::IsLost(uintptr_t p) {
  if (lost_large_.contains(p)) return true;
  for (Lease* l : lost_leases_) {
    if (p - l->base < l->size) return true;
  }
  for (auto& [b, n] : lost_) {
    if (p - b < n) return true;
  }
  return false;
}

void CachingPool::WatchLoop() {
  const int tick_ms = static_cast<int>(
      std::clamp<int64_t>(options_.idle_release_ms / 2, 10, 1000));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    struct pollfd p = {wake_fd_, POLLIN, 0};
    const int r = poll(&p, 1, tick_ms);
    if (r < 0 && errno != EINTR) return;
    if (p.revents != 0) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof(v));
      if (daemon_lost_.load()) {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        HandleDaemonLostLocked();
      }
      if (reclaim_wanted_.exchange(false)) {
        // The daemon asked for idle memory back: what Trim() does.
        absl::MutexLock lock(&mu_);
        if (stopping_ || client_ == nullptr) continue;
        CollectDeferredLocked();
        for (ThreadCache* tc : caches_) DrainCacheLocked(tc);
        const uint64_t freed = ReleaseEmptyLeasesLocked(absl::ZeroDuration());
        client_->ReportReclaimed(freed).IgnoreError();  // a daemon gone reclaims all
      }
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (client_ == nullptr) continue;
    // Blocks whose device work has finished go back first.
    CollectDeferredLocked();
    // Reaper: a cache unused for a whole tick goes back to the leases; then
    // leases empty for the idle time go back to the daemon.
    for (ThreadCache* tc : caches_) {
      tc->Lock();
      const bool idle = tc->ops == tc->ops_seen && tc->cached_bytes > 0;
      tc->ops_seen = tc->ops;
      tc->Unlock();
      if (idle) DrainCacheLocked(tc);
    }
    ReleaseEmptyLeasesLocked(absl::Milliseconds(options_.idle_release_ms));
  }
}

absl::StatusOr<uint64_t> CachingPool::Trim() {
  if (Forked()) return ForkedError();
  WaitDeferred(/*device_rule_only=*/false);
  absl::MutexLock lock(&mu_);
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  for (ThreadCache* tc : caches_) DrainCacheLocked(tc);
  return ReleaseEmptyLeasesLocked(absl::ZeroDuration());
}

PoolStats CachingPool::Stats() {
  PoolStats st;
  absl::MutexLock lock(&mu_);
  // Each daemon the pool has talked to: a restart the library came through
  // counts too.
  st.generation = generation_ + (client_ != nullptr ? client_->restarts() : 0);
  int64_t in_use = in_use_outside_caches_;
  for (ThreadCache* tc : caches_) {
    tc->Lock();
    in_use += tc->in_use;
    st.cached_bytes += tc->cached_bytes;
    tc->Unlock();
  }
  st.in_use_bytes = in_use > 0 ? static_cast<uint64_t>(in_use) : 0;
  for (auto& arena : arenas_) {
    for (Lease* l : arena->leases) {
      ++st.leases;
      st.leased_bytes += l->size;
      st.rows.push_back({l->device, l->size, l->alloc->used_bytes(), l->blocks_out});
    }
  }
  for (auto& [ptr, block] : large_) {
    ++st.large_blocks;
    st.large_bytes += block->buffer.size();
  }
  st.lost_bytes = lost_bytes_;
  absl::MutexLock dl(&deferred_mu_);
  st.deferred_blocks = deferred_count_;
  st.deferred_bytes = deferred_bytes_;
  return st;
}

absl::StatusOr<v1::GetStatsResponse> CachingPool::DaemonStats() {
  if (Forked()) return ForkedError();
  absl::MutexLock lock(&mu_);
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  return client_->GetStats(false);
}

absl::StatusOr<v1::Session> CachingPool::DaemonSession() {
  if (Forked()) return ForkedError();
  absl::MutexLock lock(&mu_);
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  return client_->GetSession();
}

absl::StatusOr<v1::GetUsageResponse> CachingPool::DaemonUsage() {
  if (Forked()) return ForkedError();
  absl::MutexLock lock(&mu_);
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  return client_->GetUsage();
}

absl::StatusOr<v1::GetLedgerResponse> CachingPool::DaemonLedger(
    const v1::GetLedgerRequest& request) {
  if (Forked()) return ForkedError();
  absl::MutexLock lock(&mu_);
  absl::Status s = EnsureConnectedLocked();
  if (!s.ok()) return s;
  return client_->GetLedger(request);
}

absl::StatusOr<std::vector<std::string>> CachingPool::DeviceUuids() {
  absl::StatusOr<v1::GetStatsResponse> st = DaemonStats();
  if (!st.ok()) return st.status();
  std::vector<std::string> out;
  for (const v1::DeviceStats& d : st->devices()) {
    if (d.index() >= out.size()) out.resize(d.index() + 1);
    out[d.index()] = d.uuid();
  }
  return out;
}

}  // namespace client
}  // namespace gpumem
