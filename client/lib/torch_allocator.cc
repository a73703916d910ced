// PyTorch's pluggable allocator entry points (gpumem.h): one process-wide
// client from the environment, and the process's CUDA ordinals mapped to the
// daemon's devices by UUID. Invariants: a pointer returned for device d is
// always on device d (each ordinal has its own arena); frees are
// stream-ordered, as PyTorch's own allocator: gpumem_torch_free returns at
// once, and the block is reused only once the work queued on `stream`
// before the free has completed (CachingPool::FreeAfterStream).
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/c_handle.h"
#include "client/lib/device_uuids.h"
#include "client/lib/env_config.h"
#include "client/lib/include/gpumem.h"
#include "client/lib/pool/library_error.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/tenant_budget.h"
#include "common/cuda_driver.h"

namespace gpumem {
namespace client {
namespace {

constexpr int kMaxOrdinals = 64;

// What the entry points did on one ordinal (gpumem_torch_memory_stats).
// `reserved_seen` is the reserved figure last learnt: allocated bytes past
// it mean the pool grew, and only then is reserved learnt again in a malloc.
struct OrdinalFigures {
  std::atomic<uint64_t> allocated{0}, allocated_peak{0};
  std::atomic<uint64_t> reserved_seen{0}, reserved_peak{0};
  std::atomic<uint64_t> allocations{0}, frees{0}, refusals{0};
};

// Blocks some other stream than their own used (gpumem_torch_record_stream):
// their free waits for the device's work, not only their stream's. `count`
// lets every free skip the lock while there are none.
struct RecordedBlocks {
  absl::Mutex mu;
  absl::flat_hash_set<uintptr_t> blocks ABSL_GUARDED_BY(mu);
  std::atomic<size_t> count{0};

  void Add(uintptr_t p) {
    absl::MutexLock lock(&mu);
    if (blocks.insert(p).second) count.fetch_add(1, std::memory_order_relaxed);
  }
  bool Take(uintptr_t p) {
    if (count.load(std::memory_order_relaxed) == 0) return false;
    absl::MutexLock lock(&mu);
    if (blocks.erase(p) == 0) return false;
    count.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
};

struct TorchState {
  absl::Mutex mu;
  RecordedBlocks recorded;
  std::atomic<gpumem_client*> client{nullptr};           // set once, under mu
  std::atomic<CachingPool::Arena*> arena[kMaxOrdinals] = {};  // set once each
  std::atomic<int> daemon_index[kMaxOrdinals] = {};  // of each arena's device, set with it
  OrdinalFigures figures[kMaxOrdinals];
};

TorchState& State() {
  static TorchState* s = new TorchState();  // never destroyed: used until exit
  return *s;
}

// Without a CUDA driver: ordinal d from CUDA_VISIBLE_DEVICES' text, or the
// daemon's device d.
absl::StatusOr<std::string> UuidOfOrdinalWithoutDriver(const std::vector<std::string>& uuids,
                                                       int d) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) {
    if (d >= static_cast<int>(uuids.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", d, " does not exist: the daemon has ", uuids.size(), " devices"));
    }
    return uuids[d];
  }
  std::vector<std::string> entries = absl::StrSplit(visible, ',', absl::SkipWhitespace());
  if (d >= static_cast<int>(entries.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", d, " does not exist: CUDA_VISIBLE_DEVICES=\"", visible, "\" lists ",
        entries.size()));
  }
  std::string e(absl::StripAsciiWhitespace(entries[d]));
  int index;
  if (absl::SimpleAtoi(e, &index)) {
    if (index < 0 || index >= static_cast<int>(uuids.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA_VISIBLE_DEVICES entry ", d, " (\"", e, "\") names no daemon device"));
    }
    return uuids[index];
  }
  std::string found;
  for (const std::string& u : uuids) {
    if (absl::StartsWithIgnoreCase(u, e)) {
      if (!found.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CUDA_VISIBLE_DEVICES entry \"", e, "\" matches more than one device"));
      }
      found = u;
    }
  }
  if (found.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA_VISIBLE_DEVICES entry \"", e, "\" matches no daemon device"));
  }
  return found;
}

// The daemon UUID of this process's ordinal `d`: what the CUDA driver calls
// device d in this process (cuDeviceGet(d), after CUDA_VISIBLE_DEVICES,
// CUDA_DEVICE_ORDER and the container's set of GPUs), found by its UUID
// among the daemon's devices ("MIG-..." for a MIG instance). Only without
// any CUDA driver (the sim backend on a machine with no NVIDIA driver) is d
// read from CUDA_VISIBLE_DEVICES' text (an index in the daemon's numbering,
// or a GPU-/MIG- UUID or unique prefix of one) or, without it, taken as the
// daemon's device d.
absl::StatusOr<std::string> UuidOfOrdinal(CachingPool* pool, int d) {
  absl::StatusOr<std::vector<std::string>> uuids = DeviceUuids(pool);
  if (!uuids.ok()) return uuids.status();
  absl::StatusOr<const CudaDriver*> driver = LoadCudaDriver();
  if (!driver.ok()) {
    if (CudaDriverMissing(driver.status())) return UuidOfOrdinalWithoutDriver(*uuids, d);
    return driver.status();
  }
  absl::StatusOr<std::string> mine = CudaDeviceContext::UuidOfOrdinal(**driver, d);
  if (!mine.ok()) return mine.status();
  for (const std::string& u : *uuids) {
    if (SameCudaUuid(u, *mine)) return u;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", d, " of this process (", *mine, ") is not one gpumemd serves (it serves ",
      absl::StrJoin(*uuids, ", "), ")"));
}

// The process-wide client, connected on first use.
absl::StatusOr<CachingPool*> TorchPool() ABSL_EXCLUSIVE_LOCKS_REQUIRED(State().mu) {
  TorchState& st = State();
  if (st.client.load() == nullptr) {
    st.client.store(gpumem_connect(nullptr), std::memory_order_release);
    if (st.client.load() == nullptr) {
      return absl::Status(absl::StatusCode::kUnavailable,
                          absl::StrCat("gpumem_torch_malloc: ", gpumem_last_error_message()));
    }
  }
  return st.client.load()->pool.get();
}

// Ordinal d's arena (placement: its UUID only, plus GPUMEM_PLACEMENT's
// exclude list), made on first use; a failure is reported then and retried
// on the next call.
absl::StatusOr<CachingPool::Arena*> ArenaOfDevice(int d) {
  if (d < 0 || d >= kMaxOrdinals) {
    return absl::InvalidArgumentError(absl::StrCat("device ordinal ", d, " out of range"));
  }
  TorchState& st = State();
  CachingPool::Arena* a = st.arena[d].load(std::memory_order_acquire);
  if (a != nullptr) return a;
  absl::MutexLock lock(&st.mu);
  if ((a = st.arena[d].load()) != nullptr) return a;
  absl::StatusOr<CachingPool*> torch_pool = TorchPool();
  if (!torch_pool.ok()) return torch_pool.status();
  CachingPool* pool = *torch_pool;
  absl::StatusOr<std::string> uuid = UuidOfOrdinal(pool, d);
  if (!uuid.ok()) return uuid.status();
  absl::StatusOr<v1::PlacementRequest> env = PlacementFromEnv();
  if (!env.ok()) return env.status();
  v1::PlacementRequest p;
  p.add_devices(*uuid);
  *p.mutable_exclude() = env->exclude();
  absl::StatusOr<CachingPool::Arena*> arena = pool->ArenaFor(p);
  if (!arena.ok()) return arena.status();
  absl::StatusOr<std::vector<std::string>> uuids = DeviceUuids(pool);
  if (!uuids.ok()) return uuids.status();
  const auto at = std::find(uuids->begin(), uuids->end(), *uuid);
  st.daemon_index[d].store(static_cast<int>(at - uuids->begin()), std::memory_order_relaxed);
  st.arena[d].store(*arena, std::memory_order_release);
  return *arena;
}

void RaiseTo(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t cur = peak.load(std::memory_order_relaxed);
  while (value > cur && !peak.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

// The process-wide client's pool figures (none before its first malloc).
// Takes the pool's locks.
PoolStats TorchPoolStats() {
  gpumem_client* c = State().client.load(std::memory_order_acquire);
  return c != nullptr ? c->pool->Stats() : PoolStats();
}

// Bytes this process holds from the daemon on ordinal d's device (leases
// and whole blocks, idle and deferred ones included), from `pool`; 0 before
// the ordinal's first malloc. Learnt: the peak follows.
uint64_t ReservedOn(int d, const PoolStats& pool) {
  TorchState& st = State();
  if (st.arena[d].load(std::memory_order_acquire) == nullptr) return 0;
  const uint32_t index = static_cast<uint32_t>(st.daemon_index[d].load(std::memory_order_relaxed));
  uint64_t bytes = 0;
  for (const PoolStats::LeaseRow& r : pool.rows) {
    if (r.device == static_cast<int>(index)) bytes += r.bytes;
  }
  auto whole = pool.large_bytes_by_device.find(index);
  if (whole != pool.large_bytes_by_device.end()) bytes += whole->second;
  OrdinalFigures& f = st.figures[d];
  f.reserved_seen.store(bytes, std::memory_order_relaxed);
  RaiseTo(f.reserved_peak, bytes);
  return bytes;
}

bool ValidOrdinal(int d) { return d >= 0 && d < kMaxOrdinals; }

// In a fork() child of a process that used CUDA, what the program must know
// is that it cannot use CUDA at all, not that the client is its parent's.
absl::Status ForkAware(absl::Status s) {
  if (LibraryCodeOf(s) != GPUMEM_E_FORKED) return s;
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok() && !CudaDriverMissing(d.status())) return d.status();
  return s;
}

// What the tenant may still take on this process's ordinal `d`.
absl::StatusOr<MemInfo> TorchMemInfo(int d) {
  if (d < 0 || d >= kMaxOrdinals) {
    return absl::InvalidArgumentError(absl::StrCat("device ordinal ", d, " out of range"));
  }
  CachingPool* pool;
  {
    absl::MutexLock lock(&State().mu);
    absl::StatusOr<CachingPool*> p = TorchPool();
    if (!p.ok()) return p.status();
    pool = *p;
  }
  absl::StatusOr<std::string> uuid = UuidOfOrdinal(pool, d);
  if (!uuid.ok()) return uuid.status();
  absl::StatusOr<std::vector<std::string>> uuids = DeviceUuids(pool);
  if (!uuids.ok()) return uuids.status();
  for (size_t i = 0; i < uuids->size(); ++i) {
    if ((*uuids)[i] == *uuid) return PoolMemInfo(pool, static_cast<uint32_t>(i));
  }
  return absl::NotFoundError(absl::StrCat("device ", *uuid, " is gone from the daemon"));
}

// The calling thread's last refused gpumem_torch_malloc: PyTorch's caching
// allocator may call the library again (freeing its cached segments) between
// the refusal and the exception it raises, which resets the last error.
thread_local std::string last_refusal;

void Refused(OrdinalFigures* f, const absl::Status& s) {
  if (f != nullptr) f->refusals.fetch_add(1, std::memory_order_relaxed);
  last_refusal = std::string(s.message());
  SetError(s);
}

}  // namespace
}  // namespace client
}  // namespace gpumem

extern "C" {

int gpumem_torch_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  absl::StatusOr<gpumem::client::MemInfo> info = gpumem::client::TorchMemInfo(device);
  if (!info.ok()) return gpumem::client::SetError(info.status());
  if (free_bytes != nullptr) *free_bytes = info->free_bytes;
  if (total_bytes != nullptr) *total_bytes = info->total_bytes;
  return gpumem::client::SetOk();
}

void* gpumem_torch_malloc(ssize_t size, int device, void* stream) {
  if (size <= 0) {
    // PyTorch asks for 0 bytes for empty tensors: a null pointer is its answer.
    if (size == 0) {
      gpumem::client::SetOk();
      return nullptr;
    }
    gpumem::client::SetError(absl::InvalidArgumentError("negative size"));
    return nullptr;
  }
  absl::StatusOr<gpumem::client::CachingPool::Arena*> arena = gpumem::client::ArenaOfDevice(device);
  if (!arena.ok()) {
    gpumem::client::Refused(gpumem::client::ValidOrdinal(device)
                                ? &gpumem::client::State().figures[device]
                                : nullptr,
                            gpumem::client::ForkAware(arena.status()));
    return nullptr;
  }
  gpumem::client::OrdinalFigures& f = gpumem::client::State().figures[device];
  absl::StatusOr<void*> p =
      gpumem::client::State().client.load(std::memory_order_acquire)->pool->AllocateOnStream(
          static_cast<uint64_t>(size), *arena, stream);
  if (!p.ok()) {
    gpumem::client::Refused(&f, gpumem::client::ForkAware(p.status()));
    return nullptr;
  }
  f.allocations.fetch_add(1, std::memory_order_relaxed);
  const uint64_t now =
      f.allocated.fetch_add(static_cast<uint64_t>(size), std::memory_order_relaxed) + size;
  gpumem::client::RaiseTo(f.allocated_peak, now);
  if (now > f.reserved_seen.load(std::memory_order_relaxed)) {
    gpumem::client::ReservedOn(device, gpumem::client::TorchPoolStats());
  }
  gpumem::client::SetOk();
  return *p;
}

void gpumem_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  gpumem_client* c = gpumem::client::State().client.load(std::memory_order_acquire);
  if (c == nullptr) {
    if (ptr != nullptr) {
      gpumem::client::SetError(gpumem::client::LibraryError(GPUMEM_E_FOREIGN_POINTER,
                                            "gpumem_torch_free before any gpumem_torch_malloc"));
    }
    return;
  }
  // Sets the last error; PyTorch ignores a free's result.
  absl::StatusOr<gpumem::client::CachingPool*> pool = gpumem::client::PoolOf(c);
  if (!pool.ok()) {
    gpumem::client::SetError(pool.status());
    return;
  }
  // Reused only after the work queued on `stream` before now has run; a
  // block another stream used too, after all the device's work.
  absl::Status s = gpumem::client::State().recorded.Take(reinterpret_cast<uintptr_t>(ptr))
                       ? (*pool)->Free(ptr)
                       : (*pool)->FreeAfterStream(ptr, stream);
  if (s.ok()) {
    if (ptr != nullptr && size > 0 && gpumem::client::ValidOrdinal(device)) {
      gpumem::client::OrdinalFigures& f = gpumem::client::State().figures[device];
      f.frees.fetch_add(1, std::memory_order_relaxed);
      uint64_t cur = f.allocated.load(std::memory_order_relaxed);
      const uint64_t n = static_cast<uint64_t>(size);
      while (!f.allocated.compare_exchange_weak(cur, cur > n ? cur - n : 0,
                                                std::memory_order_relaxed)) {
      }
    }
    gpumem::client::SetOk();
  } else {
    gpumem::client::SetError(s);
  }
}

int gpumem_torch_record_stream(void* ptr, void* stream) {
  (void)stream;  // any stream: the free waits for all of the device's work
  gpumem_client* c = gpumem::client::State().client.load(std::memory_order_acquire);
  if (c == nullptr) {
    return gpumem::client::SetError(gpumem::client::LibraryError(
        GPUMEM_E_FOREIGN_POINTER, "gpumem_torch_record_stream before any gpumem_torch_malloc"));
  }
  absl::StatusOr<gpumem::client::CachingPool*> pool = gpumem::client::PoolOf(c);
  if (!pool.ok()) return gpumem::client::SetError(pool.status());
  // A live block's start, or the pool's error for anything else.
  absl::StatusOr<int> device = (*pool)->DeviceOf(ptr);
  if (!device.ok()) return gpumem::client::SetError(device.status());
  gpumem::client::State().recorded.Add(reinterpret_cast<uintptr_t>(ptr));
  return gpumem::client::SetOk();
}

int gpumem_torch_memory_stats(int device, gpumem_torch_stats* out) {
  if (out == nullptr) return gpumem::client::SetError(absl::InvalidArgumentError("out is NULL"));
  if (!gpumem::client::ValidOrdinal(device)) {
    return gpumem::client::SetError(
        absl::InvalidArgumentError(absl::StrCat("device ordinal ", device, " out of range")));
  }
  gpumem::client::OrdinalFigures& f = gpumem::client::State().figures[device];
  const gpumem::client::PoolStats pool = gpumem::client::TorchPoolStats();
  out->reserved_bytes = gpumem::client::ReservedOn(device, pool);
  out->reserved_bytes_peak = f.reserved_peak.load(std::memory_order_relaxed);
  out->allocated_bytes = f.allocated.load(std::memory_order_relaxed);
  out->allocated_bytes_peak = f.allocated_peak.load(std::memory_order_relaxed);
  out->allocations = f.allocations.load(std::memory_order_relaxed);
  out->frees = f.frees.load(std::memory_order_relaxed);
  out->refusals = f.refusals.load(std::memory_order_relaxed);
  out->graph_held_bytes = pool.graph_held_bytes;
  return gpumem::client::SetOk();
}

int gpumem_torch_reset_peak_memory_stats(int device) {
  if (!gpumem::client::ValidOrdinal(device)) {
    return gpumem::client::SetError(
        absl::InvalidArgumentError(absl::StrCat("device ordinal ", device, " out of range")));
  }
  gpumem::client::OrdinalFigures& f = gpumem::client::State().figures[device];
  f.allocated_peak.store(f.allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
  f.reserved_peak.store(0, std::memory_order_relaxed);
  gpumem::client::ReservedOn(device, gpumem::client::TorchPoolStats());
  return gpumem::client::SetOk();
}

const char* gpumem_torch_last_refusal(void) {
  return gpumem::client::last_refusal.c_str();
}

int gpumem_torch_empty_cache(void) {
  gpumem_client* c = gpumem::client::State().client.load(std::memory_order_acquire);
  if (c == nullptr) return gpumem::client::SetOk();  // nothing allocated yet
  return gpumem_trim(c, nullptr);
}

}  // extern "C"
