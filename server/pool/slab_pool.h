// SlabPool: the memory of one device, as slabs carved into blocks.
//
// The pool asks its backend for slabs (large device allocations that clients
// import whole) and carves blocks out of them with one OffsetAllocator per
// slab. The rules it keeps:
//  - A slab belongs to one tenant at a time. A block is only ever carved from
//    a slab its tenant owns; an empty slab may pass to another tenant, and is
//    scrubbed (zeroed) before it does.
//  - A block larger than the slab size gets a dedicated slab of its own
//    (rounded up to the backend's granularity), released as soon as the
//    block is.
//  - A slab that has been empty for `empty_release_after` is given back to
//    the device by ReleaseIdleSlabs, unless it is part of the reservation
//    made at start. When a new slab cannot be made because capacity sits in
//    empty slabs, those are released at once instead.
//  - Live slab bytes never exceed the device's capacity (the backend refuses).
//
// Not thread-safe: the caller serializes all calls (the daemon holds one lock
// around its pools; see server/service/memory_broker.h).
#ifndef GPUMEMD_SERVER_POOL_SLAB_POOL_H_
#define GPUMEMD_SERVER_POOL_SLAB_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/backend/backend.h"
#include "server/pool/offset_allocator.h"

namespace gpumem {

struct PoolOptions {
  uint64_t slab_size = uint64_t{1} << 30;
  // Slab sizes are rounded up to this (CUDA VMM granularity is 2 MiB).
  uint64_t granularity = uint64_t{2} << 20;
  absl::Duration empty_release_after = absl::Seconds(30);
  // Fraction of the device taken as slabs at start and kept (0 = none).
  double reserve_fraction = 0.0;
};

// A carved block. `handle` is the allocator's, for O(1) release;
// `new_slab` says the carve created the slab (Uncarve then removes it).
struct PoolBlock {
  uint64_t slab_id = 0;
  uint64_t slab_size = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t handle = 0;
  bool new_slab = false;
};

// 1 - largest free range / free bytes (0 when nothing is free).
double Fragmentation(uint64_t largest_free, uint64_t free_bytes);

struct SlabStats {
  uint64_t slab_id = 0;
  uint32_t tenant = 0;
  uint64_t size = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  double fragmentation = 0.0;  // Fragmentation(largest_free, free_bytes)
  uint64_t live_blocks = 0;
  bool dedicated = false;
  bool reserved = false;
};

struct PoolStats {
  uint64_t total_bytes = 0;      // device capacity
  uint64_t pooled_bytes = 0;     // bytes in slabs
  uint64_t used_bytes = 0;       // bytes in live blocks, as asked
  uint64_t pooled_free_bytes = 0;
  uint64_t largest_pooled_free = 0;
  uint64_t unpooled_bytes = 0;   // capacity not yet taken as slabs
  uint64_t live_blocks = 0;
  uint32_t slab_count = 0;
  // 1 - largest_pooled_free / pooled_free_bytes (0 when nothing is free).
  double fragmentation = 0.0;
};

class SlabPool {
 public:
  SlabPool(Backend* backend, uint32_t device, PoolOptions options);
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // Makes the start-time reservation; call once.
  absl::Status Reserve();

  // A block of `size` bytes at `alignment` (power of two) for `tenant`.
  // RESOURCE_EXHAUSTED when the device cannot hold it; the message says
  // whether capacity or fragmentation refused it.
  absl::StatusOr<PoolBlock> Carve(uint64_t size, uint64_t alignment,
                                  uint32_t tenant);
  void Release(const PoolBlock& block);
  // Undoes a Carve that its caller abandons (a sharded request that failed
  // elsewhere): like Release, and a slab the carve created goes back to the
  // device at once, so the pool's slabs are as before the Carve.
  void Uncarve(const PoolBlock& block);

  // A new fd for a slab's handle; NOT_FOUND if the slab is gone.
  absl::StatusOr<int> ExportSlabFd(uint64_t slab_id) const;
  // The tenant owning a slab, or NOT_FOUND.
  absl::StatusOr<uint32_t> SlabTenant(uint64_t slab_id) const;
  // A slab's size in bytes (what an importer maps), or NOT_FOUND.
  absl::StatusOr<uint64_t> SlabSize(uint64_t slab_id) const;

  // Gives back slabs empty since before now - empty_release_after.
  int ReleaseIdleSlabs(absl::Time now);
  // Changes empty_release_after from now on (config reload).
  void set_empty_release_after(absl::Duration d) { options_.empty_release_after = d; }

  // Bytes in live blocks (O(1); Stats() walks every slab).
  uint64_t used_bytes() const { return used_bytes_; }
  // Free bytes a request could get at best: unpooled capacity plus pooled free.
  uint64_t free_bytes() const;
  // The largest block Carve could serve now (pooled range or a new slab).
  uint64_t largest_carvable() const;

  uint32_t device() const { return device_; }
  PoolStats Stats() const;
  std::vector<SlabStats> Slabs() const;
  // Checks each slab's allocator and the pool's totals.
  absl::Status Validate() const;

 private:
  struct SlabEntry {
    std::unique_ptr<Slab> slab;
    std::unique_ptr<OffsetAllocator> allocator;
    uint32_t tenant = 0;
    bool dedicated = false;
    bool reserved = false;
    absl::Time empty_since = absl::InfinitePast();
  };

  // The slab with this id, or NOT_FOUND.
  absl::StatusOr<const SlabEntry*> FindSlab(uint64_t slab_id) const;
  absl::StatusOr<SlabEntry*> NewSlab(uint64_t bytes, uint32_t tenant,
                                     bool dedicated, uint64_t* id);
  absl::Status Refuse(uint64_t size, uint64_t alignment) const;
  void ReleaseEmptySlabs(bool including_reserved);
  uint64_t RoundUp(uint64_t v) const;
  uint64_t Unpooled() const;

  Backend* backend_;
  uint32_t device_;
  PoolOptions options_;
  uint64_t total_bytes_;
  std::map<uint64_t, SlabEntry> slabs_;  // by slab id, oldest first
  uint64_t used_bytes_ = 0;
  uint64_t live_blocks_ = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_SLAB_POOL_H_
