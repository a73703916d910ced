// SlabPool's figures, read under the lock: what can be carved (for any
// tenant, or for one tenant within its budget), the pool's, its slabs' and
// its tenants' figures, and Validate, which recomputes every counter from
// the slabs and the export books and checks them against the backend.
#include "server/pool/slab_pool.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {

uint64_t SlabPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t SlabPool::LargestCarvableLocked() const {
  uint64_t largest = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.retained || Releasable(e) || e.slab == nullptr) continue;  // releasable: below
    largest = std::max(largest, e.allocator->largest_free());
  }
  return std::max(largest, FreeBytesLocked());
}

uint64_t SlabPool::largest_carvable() const {
  absl::MutexLock lock(&mu_);
  return LargestCarvableLocked();
}

uint64_t SlabPool::LargestReachable(uint32_t tenant, HandleKind kind) const {
  absl::MutexLock lock(&mu_);
  uint64_t largest = 0;
  for (const auto& [id, e] : slabs_) {
    if (e.retained || Releasable(e) || e.kind != kind) continue;  // releasable: below
    if (e.tenant != tenant && e.tenant != kNoTenant) continue;
    largest = std::max(largest, e.allocator->largest_free());
  }
  return std::max(largest, std::min(BudgetFreeLocked(tenant), FreeBytesLocked()));
}

double Fragmentation(uint64_t largest_free, uint64_t free_bytes) {
  if (free_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free) / static_cast<double>(free_bytes);
}

PoolStats SlabPool::Stats() const {
  PoolStats s;
  absl::MutexLock lock(&mu_);
  s.total_bytes = total_bytes_;
  s.used_bytes = used_bytes_;
  s.live_blocks = live_blocks_;
  s.pooled_bytes = pooled_bytes_;
  s.retained_bytes = retained_bytes_;
  for (const auto& [id, e] : slabs_) {
    if (e.retained) {
      ++s.retained_slab_count;
      continue;
    }
    s.pooled_free_bytes += e.allocator->free_bytes();
    s.largest_pooled_free = std::max(s.largest_pooled_free, e.allocator->largest_free());
    ++s.slab_count;
  }
  s.largest_carvable = LargestCarvableLocked();
  s.fragmentation = Fragmentation(s.largest_pooled_free, s.pooled_free_bytes);
  // What a tenant with nothing here could get: new slabs, out of capacity
  // no slab holds (within what the device itself has room for: on cuda,
  // memory the pool does not see) and of empty slabs nobody holds. Free
  // ranges of another tenant's slabs are that tenant's only.
  s.free_bytes = FreeBytesLocked();
  return s;
}

std::vector<SlabStats> SlabPool::Slabs() const {
  std::vector<SlabStats> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : slabs_) {
    SlabStats s;
    s.slab_id = id;
    s.tenant = e.tenant;
    s.size = e.size;
    s.used_bytes = e.allocator->used_bytes();
    s.free_bytes = e.retained ? 0 : e.allocator->free_bytes();
    s.largest_free = e.retained ? 0 : e.allocator->largest_free();
    s.fragmentation = Fragmentation(s.largest_free, s.free_bytes);
    s.live_blocks = e.allocator->live_blocks();
    s.holders = static_cast<uint32_t>(e.holders.size());
    s.dedicated = e.dedicated;
    s.reserved = e.reserved;
    s.retained = e.retained;
    out.push_back(s);
  }
  return out;
}

absl::flat_hash_map<uint32_t, TenantPoolStats> SlabPool::TenantStats() const {
  absl::MutexLock lock(&mu_);
  return tenants_;
}

uint64_t SlabPool::TenantRetained(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.retained_bytes;
}

absl::flat_hash_map<uint64_t, uint64_t> SlabPool::SessionRetained() const {
  absl::flat_hash_map<uint64_t, uint64_t> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [session, ids] : exports_) {
    for (uint64_t id : ids) {
      auto it = slabs_.find(id);
      if (it != slabs_.end() && it->second.retained) {
        out[session] += it->second.size;
      }
    }
  }
  return out;
}

absl::Status SlabPool::Validate() const {
  absl::MutexLock lock(&mu_);
  uint64_t used = 0, live = 0, pooled = 0, retained = 0, all = 0, awaiting = 0;
  absl::flat_hash_map<uint32_t, TenantPoolStats> tenants;
  for (const auto& [id, e] : slabs_) {
    absl::Status s = e.allocator->Validate();
    if (!s.ok()) return s;
    if (e.allocator->capacity() != e.size) {
      return absl::InternalError(absl::StrCat("slab ", id, ": allocator size mismatch"));
    }
    if (e.dedicated && !e.retained && e.allocator->live_blocks() == 0) {
      return absl::InternalError(absl::StrCat("slab ", id, ": empty dedicated slab kept"));
    }
    if (e.retained && (e.holders.empty() || e.allocator->live_blocks() != 0)) {
      return absl::InternalError(absl::StrCat(
          "slab ", id, ": retained with ", e.holders.size(), " holders and ",
          e.allocator->live_blocks(), " live blocks"));
    }
    if (e.tenant == kNoTenant && (!e.reserved || e.allocator->live_blocks() != 0 ||
                                  !e.holders.empty())) {
      return absl::InternalError(absl::StrCat("slab ", id, ": unowned but in use"));
    }
    for (uint64_t session : e.holders) {
      auto ex = exports_.find(session);
      if (ex == exports_.end() || !ex->second.contains(id)) {
        return absl::InternalError(absl::StrCat(
            "slab ", id, ": holder ", session, " missing from the export books"));
      }
    }
    used += e.allocator->used_bytes();
    live += e.allocator->live_blocks();
    (e.retained ? retained : pooled) += e.size;
    if (e.slab != nullptr) {
      all += e.size;  // what the backend holds; an adopted slab awaiting its handle not
    } else {
      awaiting += e.size;
    }
    if (e.tenant != kNoTenant) {
      TenantPoolStats& t = tenants[e.tenant];
      t.used_bytes += e.allocator->used_bytes();
      t.live_blocks += e.allocator->live_blocks();
      if (e.retained) {
        t.retained_bytes += e.size;
      } else {
        ++t.slab_count;
        t.slab_bytes += e.size;
      }
    }
  }
  for (const auto& [session, ids] : exports_) {
    for (uint64_t id : ids) {
      auto it = slabs_.find(id);
      if (it == slabs_.end() || !it->second.holders.contains(session)) {
        return absl::InternalError(absl::StrCat(
            "session ", session, ": export of slab ", id, " not on the slab"));
      }
    }
  }
  if (used != used_bytes_ || live != live_blocks_ || pooled != pooled_bytes_ ||
      retained != retained_bytes_) {
    return absl::InternalError("pool totals disagree with its slabs");
  }
  for (const auto& [tenant, t] : tenants) {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || it->second.used_bytes != t.used_bytes ||
        it->second.live_blocks != t.live_blocks ||
        it->second.retained_bytes != t.retained_bytes ||
        it->second.slab_count != t.slab_count || it->second.slab_bytes != t.slab_bytes) {
      return absl::InternalError(absl::StrCat("tenant ", tenant, ": figures disagree"));
    }
  }
  if (awaiting != awaiting_bytes_) {
    return absl::InternalError("bytes of slabs awaiting their handle disagree");
  }
  if (creating_bytes_ == 0 && (all != backend_->SlabBytes(device_) || all > total_bytes_)) {
    return absl::InternalError("slab bytes disagree with the backend");
  }
  return absl::OkStatus();
}

}  // namespace gpumem
