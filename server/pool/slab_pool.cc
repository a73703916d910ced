// Carving order: the tenant's existing shared slabs, oldest first (older
// slabs fill up, younger ones drain and get released); then an empty slab
// of another tenant, scrubbed; then a new slab; then, if capacity sits in
// empty slabs, release them and try a new slab once more.
#include "server/pool/slab_pool.h"

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {
namespace {

// Slab ids are unique for the daemon's lifetime, across devices, so a client
// cache keyed by slab id can never confuse a released slab with a new one.
std::atomic<uint64_t> next_slab_id{1};

}  // namespace

SlabPool::SlabPool(Backend* backend, uint32_t device, PoolOptions options)
    : backend_(backend),
      device_(device),
      options_(options),
      total_bytes_(backend->devices().at(device).total_bytes) {
  options_.granularity = std::max<uint64_t>(
      {options_.granularity, backend->Granularity(device), 1});
  options_.slab_size = std::max(RoundUp(options_.slab_size), options_.granularity);
}

SlabPool::~SlabPool() = default;

uint64_t SlabPool::RoundUp(uint64_t v) const {
  const uint64_t g = options_.granularity;
  if (v > UINT64_MAX - (g - 1)) return UINT64_MAX - (UINT64_MAX % g);
  return (v + g - 1) / g * g;
}

uint64_t SlabPool::Unpooled() const {
  const uint64_t in_slabs = backend_->SlabBytes(device_);
  return in_slabs >= total_bytes_ ? 0 : total_bytes_ - in_slabs;
}

absl::Status SlabPool::Reserve() {
  if (options_.reserve_fraction <= 0) return absl::OkStatus();
  const uint64_t target = static_cast<uint64_t>(
      std::min(1.0, options_.reserve_fraction) * static_cast<double>(total_bytes_));
  uint64_t reserved = 0;
  while (reserved < target) {
    uint64_t bytes = std::min(options_.slab_size, Unpooled());
    bytes -= bytes % options_.granularity;
    if (bytes == 0) break;
    uint64_t id;
    absl::StatusOr<SlabEntry*> e =
        NewSlab(bytes, 0, backend_->handle_kinds().front(), false, &id);
    if (!e.ok()) return e.status();
    (*e)->reserved = true;
    reserved += bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<SlabPool::SlabEntry*> SlabPool::NewSlab(uint64_t bytes,
                                                       uint32_t tenant,
                                                       HandleKind kind,
                                                       bool dedicated,
                                                       uint64_t* id) {
  absl::StatusOr<std::unique_ptr<Slab>> slab = backend_->CreateSlab(device_, bytes, kind);
  if (!slab.ok()) return slab.status();
  *id = next_slab_id.fetch_add(1);
  SlabEntry& e = slabs_[*id];
  e.slab = std::move(*slab);
  e.allocator = std::make_unique<OffsetAllocator>(bytes);
  e.tenant = tenant;
  e.kind = kind;
  e.dedicated = dedicated;
  e.empty_since = absl::Now();
  return &e;
}

absl::StatusOr<PoolBlock> SlabPool::Carve(uint64_t size, uint64_t alignment,
                                          uint32_t tenant, HandleKind kind) {
  if (size == 0) return absl::InvalidArgumentError("size must be > 0");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a power of two"));
  }
  OffsetAllocator::Block b;
  auto take = [&](uint64_t id, SlabEntry& e, bool new_slab) {
    e.empty_since = absl::InfiniteFuture();  // not empty any more
    used_bytes_ += size;
    ++live_blocks_;
    return PoolBlock{id, e.slab->size(), b.offset, size, b.handle, new_slab, e.kind};
  };
  const bool dedicated = size > options_.slab_size;
  if (!dedicated) {
    for (auto& [id, e] : slabs_) {
      if (e.dedicated || e.tenant != tenant || e.kind != kind) continue;
      if (e.allocator->Allocate(size, alignment, &b)) return take(id, e, false);
    }
    // An empty slab of another tenant: scrub it and hand it over.
    for (auto& [id, e] : slabs_) {
      if (e.dedicated || e.tenant == tenant || e.kind != kind ||
          e.allocator->live_blocks() != 0) {
        continue;
      }
      if (e.allocator->capacity() < size) continue;
      absl::Status s = e.slab->Scrub(0, e.slab->size());
      if (!s.ok()) continue;
      e.tenant = tenant;
      if (e.allocator->Allocate(size, alignment, &b)) return take(id, e, false);
    }
  }
  // A new slab: dedicated (exactly big enough) or a standard one, cut down
  // to what is left of the device. A new slab's offset 0 meets any
  // alignment, so the block itself is all it needs to hold.
  const uint64_t need = RoundUp(size);
  absl::Status driver_error;  // the backend's last failure making a slab
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint64_t bytes = dedicated ? need : std::min(options_.slab_size, Unpooled());
    bytes -= dedicated ? 0 : bytes % options_.granularity;
    if (bytes >= need && bytes <= Unpooled()) {
      uint64_t id;
      absl::StatusOr<SlabEntry*> e = NewSlab(bytes, tenant, kind, dedicated, &id);
      if (e.ok()) {
        if ((*e)->allocator->Allocate(size, alignment, &b)) return take(id, **e, true);
        slabs_.erase(id);  // cannot happen for a fresh slab; keep nothing empty
      } else if (e.status().GetPayload(kDriverErrorPayload).has_value()) {
        driver_error = e.status();
      }
    }
    if (attempt == 0) ReleaseEmptySlabs(/*including_reserved=*/true);
  }
  if (!driver_error.ok()) return driver_error;  // the driver's words, not ours
  return Refuse(size, alignment);
}

absl::Status SlabPool::Refuse(uint64_t size, uint64_t alignment) const {
  const uint64_t free = free_bytes();
  if (free < size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device ", device_, ": capacity: ", FormatBytes(free), " free, ",
        FormatBytes(size), " asked"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "device ", device_, ": fragmentation: ", FormatBytes(free),
      " free but the largest range is ", FormatBytes(largest_carvable()), ", ",
      FormatBytes(size), " asked",
      alignment > 1 ? absl::StrCat(" at alignment ", alignment) : ""));
}

void SlabPool::Release(const PoolBlock& block) {
  auto it = slabs_.find(block.slab_id);
  if (it == slabs_.end()) return;
  SlabEntry& e = it->second;
  OffsetAllocator::Block b{block.offset, block.size, block.handle};
  e.allocator->Free(b);
  used_bytes_ -= block.size;
  --live_blocks_;
  if (e.allocator->live_blocks() == 0) {
    if (e.dedicated) {
      slabs_.erase(it);
    } else {
      e.empty_since = absl::Now();
    }
  }
}

void SlabPool::Uncarve(const PoolBlock& block) {
  Release(block);
  if (!block.new_slab) return;
  auto it = slabs_.find(block.slab_id);
  if (it != slabs_.end() && it->second.allocator->live_blocks() == 0) {
    slabs_.erase(it);
  }
}

absl::StatusOr<const SlabPool::SlabEntry*> SlabPool::FindSlab(
    uint64_t slab_id) const {
  auto it = slabs_.find(slab_id);
  if (it == slabs_.end()) {
    return absl::NotFoundError(absl::StrCat("no slab ", slab_id));
  }
  return &it->second;
}

absl::StatusOr<int> SlabPool::ExportSlabFd(uint64_t slab_id) const {
  absl::StatusOr<const SlabEntry*> e = FindSlab(slab_id);
  if (!e.ok()) return e.status();
  return (*e)->slab->ExportFd();
}

absl::StatusOr<std::string> SlabPool::SlabIpcHandle(uint64_t slab_id) const {
  absl::StatusOr<const SlabEntry*> e = FindSlab(slab_id);
  if (!e.ok()) return e.status();
  return (*e)->slab->IpcHandle();
}

absl::StatusOr<uint32_t> SlabPool::SlabTenant(uint64_t slab_id) const {
  absl::StatusOr<const SlabEntry*> e = FindSlab(slab_id);
  if (!e.ok()) return e.status();
  return (*e)->tenant;
}

absl::StatusOr<uint64_t> SlabPool::SlabSize(uint64_t slab_id) const {
  absl::StatusOr<const SlabEntry*> e = FindSlab(slab_id);
  if (!e.ok()) return e.status();
  return (*e)->slab->size();
}

void SlabPool::ReleaseEmptySlabs(bool including_reserved) {
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    const SlabEntry& e = it->second;
    if (e.allocator->live_blocks() == 0 && (including_reserved || !e.reserved)) {
      it = slabs_.erase(it);
    } else {
      ++it;
    }
  }
}

int SlabPool::ReleaseIdleSlabs(absl::Time now) {
  int released = 0;
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    const SlabEntry& e = it->second;
    if (!e.reserved && e.allocator->live_blocks() == 0 &&
        now - e.empty_since >= options_.empty_release_after) {
      it = slabs_.erase(it);
      ++released;
    } else {
      ++it;
    }
  }
  return released;
}

uint64_t SlabPool::free_bytes() const {
  uint64_t free = Unpooled();
  for (const auto& [id, e] : slabs_) free += e.allocator->free_bytes();
  return free;
}

uint64_t SlabPool::largest_carvable() const {
  // A new slab can be as large as the unpooled capacity plus empty slabs.
  uint64_t fresh = Unpooled();
  uint64_t largest = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.allocator->live_blocks() == 0) {
      fresh += e.slab->size();
    } else {
      largest = std::max(largest, e.allocator->largest_free());
    }
  }
  return std::max(largest, fresh - fresh % options_.granularity);
}

double Fragmentation(uint64_t largest_free, uint64_t free_bytes) {
  if (free_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free) / static_cast<double>(free_bytes);
}

PoolStats SlabPool::Stats() const {
  PoolStats s;
  s.total_bytes = total_bytes_;
  s.used_bytes = used_bytes_;
  s.live_blocks = live_blocks_;
  s.unpooled_bytes = Unpooled();
  for (const auto& [id, e] : slabs_) {
    s.pooled_bytes += e.slab->size();
    s.pooled_free_bytes += e.allocator->free_bytes();
    s.largest_pooled_free = std::max(s.largest_pooled_free, e.allocator->largest_free());
    ++s.slab_count;
  }
  s.fragmentation = Fragmentation(s.largest_pooled_free, s.pooled_free_bytes);
  return s;
}

std::vector<SlabStats> SlabPool::Slabs() const {
  std::vector<SlabStats> out;
  for (const auto& [id, e] : slabs_) {
    SlabStats s;
    s.slab_id = id;
    s.tenant = e.tenant;
    s.size = e.slab->size();
    s.used_bytes = e.allocator->used_bytes();
    s.free_bytes = e.allocator->free_bytes();
    s.largest_free = e.allocator->largest_free();
    s.fragmentation = Fragmentation(s.largest_free, s.free_bytes);
    s.live_blocks = e.allocator->live_blocks();
    s.dedicated = e.dedicated;
    s.reserved = e.reserved;
    out.push_back(s);
  }
  return out;
}

absl::Status SlabPool::Validate() const {
  uint64_t used = 0, live = 0, pooled = 0;
  for (const auto& [id, e] : slabs_) {
    absl::Status s = e.allocator->Validate();
    if (!s.ok()) return s;
    if (e.allocator->capacity() != e.slab->size()) {
      return absl::InternalError(absl::StrCat("slab ", id, ": allocator size mismatch"));
    }
    if (e.dedicated && e.allocator->live_blocks() == 0) {
      return absl::InternalError(absl::StrCat("slab ", id, ": empty dedicated slab kept"));
    }
    used += e.allocator->used_bytes();
    live += e.allocator->live_blocks();
    pooled += e.slab->size();
  }
  if (used != used_bytes_ || live != live_blocks_) {
    return absl::InternalError("pool totals disagree with its slabs");
  }
  if (pooled != backend_->SlabBytes(device_) || pooled > total_bytes_) {
    return absl::InternalError("pooled bytes disagree with the backend");
  }
  return absl::OkStatus();
}

}  // namespace gpumem
