// Lease: one block of lease_bytes the pool took from the daemon, carved
// into class-sized blocks by SizeClassCache, which owns it and alone
// touches its carving state.
//
// Invariants: id, base, size, device, uuid, on_device and arena never change;
// `shadow` says which of its addresses start a live block; `lost` is set
// once, when a daemon restart lost the lease, and then the lease is never
// carved or cached again. A Lease is kept (unused) until its pool goes, even
// after it was given back, because a lock-free reader may still hold it.
#ifndef GPUMEMD_CLIENT_LIB_POOL_LEASE_H_
#define GPUMEMD_CLIENT_LIB_POOL_LEASE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/lib/cpp/client.h"
#include "client/lib/pool/arena.h"
#include "client/lib/pool/block_shadow.h"
#include "common/alloc/offset_allocator.h"

namespace gpumem {
namespace client {

class Lease {
 public:
  Lease(uint64_t id, uintptr_t base, uint64_t size, int device, std::string uuid, bool on_device,
        const Arena* arena, BlockShadow shadow)
      : id(id),
        base(base),
        size(size),
        device(device),
        uuid(std::move(uuid)),
        on_device(on_device),
        arena(arena),
        shadow(std::move(shadow)) {}
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  bool Contains(uintptr_t p) const { return p - base < size; }

  // Constant after construction.
  const uint64_t id;  // the daemon's allocation id
  const uintptr_t base;
  const uint64_t size;
  const int device;        // the daemon's index
  const std::string uuid;  // the device's
  // Device memory (a CUDA handle kind): its frees are stream-ordered.
  const bool on_device;
  const Arena* const arena;

  BlockShadow shadow;
  std::atomic<bool> lost{false};

 private:
  friend class SizeClassCache;
  // Guarded by the owning SizeClassCache's mutex.
  Buffer buffer_;
  std::unique_ptr<OffsetAllocator> carver_;
  uint64_t blocks_out_ = 0;  // carved and not returned: live, cached or deferred
  absl::Time empty_since_;
  bool released_ = false;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_LEASE_H_
