#include "client/lib/pool/size_class_cache.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/lib/pool/library_error.h"
#include "client/lib/pool/size_classes.h"

namespace gpumem {
namespace client {

using size_classes::ClassOf;
using size_classes::ClassSize;
using size_classes::kGranule;

namespace {
uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}
}  // namespace

SizeClassCache::SizeClassCache(LeaseSource* source, LostBlocks* lost, Options options)
    : source_(source), lost_(lost), options_(std::move(options)) {}

SizeClassCache::~SizeClassCache() {
  absl::MutexLock lock(&mu_);
  for (auto& lease : all_) {
    if (lease->lost.load()) {
      lease->buffer_.Abandon();  // never freed at the daemon
    } else if (!lease->released_) {
      lease->buffer_ = Buffer();  // frees it at the daemon
    }
  }
}

absl::StatusOr<Block> SizeClassCache::Allocate(uint64_t size, const Arena& arena) {
  if (size > options_.max_request || ClassSize(ClassOf(size)) > options_.lease_bytes) {
    return source_->Allocate(size, arena);
  }
  bool no_lease = false;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Block> b = CarveLocked(ClassOf(size), arena, &no_lease);
    if (!no_lease) return b;
  }
  // No room for a whole lease: the request alone may still fit.
  return source_->Allocate(size, arena);
}

absl::StatusOr<Block> SizeClassCache::CarveLocked(uint32_t cls, const Arena& arena,
                                                  bool* no_lease) {
  const uint64_t bytes = ClassSize(cls);
  OffsetAllocator::Block b;
  Lease* lease = nullptr;
  if (arena.index < by_arena_.size()) {
    for (Lease* l : by_arena_[arena.index]) {
      if (l->carver_->Allocate(bytes, 1, &b)) {
        lease = l;
        break;
      }
    }
  }
  if (lease == nullptr) {
    absl::StatusOr<Lease*> fresh = TakeLeaseLocked(bytes, arena);
    if (!fresh.ok()) {
      *no_lease = fresh.status().code() == absl::StatusCode::kResourceExhausted;
      return fresh.status();
    }
    lease = *fresh;
    if (!lease->carver_->Allocate(bytes, 1, &b)) {
      return absl::InternalError("a fresh lease could not hold a cached block");
    }
  }
  ++lease->blocks_out_;
  carved_bytes_ += bytes;
  Block out;
  out.ptr = lease->base + b.offset;
  out.bytes = bytes;
  out.lease = lease;
  out.handle = b.handle;
  out.cls = cls;
  return out;
}

absl::StatusOr<Lease*> SizeClassCache::TakeLeaseLocked(uint64_t first_block, const Arena& arena) {
  const uint64_t align = options_.lease_bytes >= (2u << 20) ? (2u << 20) : PageSize();
  absl::StatusOr<Buffer> buf = source_->TakeLease(
      options_.lease_bytes, arena, align,
      UsageLocked(static_cast<int64_t>(options_.lease_bytes), static_cast<int64_t>(first_block)));
  if (!buf.ok()) {
    if (buf.status().code() == absl::StatusCode::kResourceExhausted) return buf.status();
    return absl::Status(buf.status().code(),
                        absl::StrCat("leasing ", options_.lease_bytes,
                                     " bytes from the daemon: ", buf.status().message()));
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(buf->data());
  absl::StatusOr<BlockShadow> shadow = BlockShadow::Create(buf->size());
  if (!shadow.ok() || base == 0 || base % kGranule) {
    return absl::InternalError(absl::StrCat("lease of ", buf->size(),
                                            " bytes could not be set up (host memory, or a "
                                            "block that is not 256-byte aligned)"));
  }
  auto l =
      std::make_unique<Lease>(buf->id(), base, buf->size(), static_cast<int>(buf->device_index()),
                              buf->device_uuid(), IsDeviceMemory(*buf), &arena, *std::move(shadow));
  l->carver_ = std::make_unique<OffsetAllocator>(l->size);
  l->buffer_ = *std::move(buf);
  Lease* lease = l.get();
  all_.push_back(std::move(l));
  if (by_arena_.size() <= arena.index) by_arena_.resize(arena.index + 1);
  by_arena_[arena.index].push_back(lease);
  PublishLocked();
  return lease;
}

absl::Status SizeClassCache::Free(Block block, const ReuseAfter& after) {
  if (block.lease == nullptr) return source_->Free(std::move(block), after);
  Lease* lease = block.lease;
  absl::MutexLock lock(&mu_);
  if (lease->lost.load()) {
    LostBlockBackLocked(lease);
    return LibraryError(
        GPUMEM_E_LOST,
        absl::StrFormat("%p was lost when the daemon restarted; the pointer is invalid",
                        reinterpret_cast<void*>(block.ptr)));
  }
  carved_bytes_ -= block.bytes;
  ReturnLocked(lease, block);
  return absl::OkStatus();
}

void SizeClassCache::ReturnLocked(Lease* lease, const Block& block) {
  if (lease->released_) return;  // nothing to give back to
  OffsetAllocator::Block b;
  b.offset = block.ptr - lease->base;
  b.size = block.bytes;
  b.handle = block.handle;
  lease->carver_->Free(b);
  if (--lease->blocks_out_ == 0) lease->empty_since_ = absl::Now();
}

uint64_t SizeClassCache::ReleaseEmpty(absl::Duration min_idle) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  uint64_t released = 0;
  for (std::vector<Lease*>& leases : by_arena_) {
    for (size_t i = 0; i < leases.size();) {
      Lease* l = leases[i];
      if (l->blocks_out_ != 0 || now - l->empty_since_ < min_idle) {
        ++i;
        continue;
      }
      l->released_ = true;
      released += l->size;
      source_->GiveBack(std::move(l->buffer_), UsageLocked(-static_cast<int64_t>(l->size), 0));
      // Readers that found the lease just before see zero words (not live).
      l->shadow.Clear();
      l->carver_.reset();
      leases.erase(leases.begin() + i);
    }
  }
  if (released > 0) PublishLocked();
  return released;
}

bool SizeClassCache::MarkLost(const absl::flat_hash_set<uint64_t>& ids) {
  absl::MutexLock lock(&mu_);
  bool any = false;
  for (std::vector<Lease*>& leases : by_arena_) {
    for (auto it = leases.begin(); it != leases.end();) {
      Lease* l = *it;
      if (!ids.contains(l->id)) {
        ++it;
        continue;
      }
      l->lost.store(true);
      lost_bytes_ += l->size;
      lost_leases_.push_back(l);
      it = leases.erase(it);
      any = true;
    }
  }
  if (any) PublishLocked();
  return any;
}

void SizeClassCache::ForgetCached(const std::vector<Block>& blocks) {
  absl::MutexLock lock(&mu_);
  for (const Block& b : blocks) {
    --b.lease->blocks_out_;
    carved_bytes_ -= b.bytes;
  }
  // Only blocks the program holds keep a lost lease mapped.
  for (size_t i = 0; i < lost_leases_.size();) {
    if (lost_leases_[i]->blocks_out_ == 0) {
      AbandonLocked(lost_leases_[i]);
      lost_leases_.erase(lost_leases_.begin() + i);
    } else {
      ++i;
    }
  }
}

bool SizeClassCache::FreeLost(uintptr_t p) {
  absl::MutexLock lock(&mu_);
  for (Lease* l : lost_leases_) {
    if (!l->Contains(p)) continue;
    const uint64_t off = p - l->base;
    if ((off & (kGranule - 1)) == 0 && l->shadow.Take(off).live) LostBlockBackLocked(l);
    return true;
  }
  return false;
}

bool SizeClassCache::InLostLease(uintptr_t p) {
  absl::MutexLock lock(&mu_);
  for (const Lease* l : lost_leases_) {
    if (l->Contains(p)) return true;
  }
  return false;
}

void SizeClassCache::LostBlockBackLocked(Lease* lease) {
  if (--lease->blocks_out_ != 0) return;
  auto it = std::find(lost_leases_.begin(), lost_leases_.end(), lease);
  if (it != lost_leases_.end()) lost_leases_.erase(it);
  AbandonLocked(lease);
}

// A lost lease goes without a word to the daemon (a restarted one may have
// given its id to another block); the mapper keeps its addresses reserved
// (Buffer::Abandon), and LostBlocks remembers them so a stale pointer into
// them answers GPUMEM_E_LOST.
void SizeClassCache::AbandonLocked(Lease* lease) {
  lease->buffer_.Abandon();
  lease->shadow.Clear();
  lost_->Reserve(lease->base, lease->size);
}

void SizeClassCache::PublishLocked() {
  std::vector<Lease*> current;
  for (const std::vector<Lease*>& leases : by_arena_) {
    current.insert(current.end(), leases.begin(), leases.end());
  }
  table_.Publish(std::move(current));
}

v1::UsageReport SizeClassCache::UsageLocked(int64_t leased_delta, int64_t in_use_delta) {
  int64_t leased = leased_delta;
  for (const std::vector<Lease*>& leases : by_arena_) {
    for (const Lease* l : leases) leased += static_cast<int64_t>(l->size);
  }
  const uint64_t parked = options_.parked_bytes ? options_.parked_bytes() : 0;
  int64_t in_use =
      static_cast<int64_t>(carved_bytes_) - static_cast<int64_t>(parked) + in_use_delta;
  leased = std::max<int64_t>(leased, 0);
  in_use = std::clamp<int64_t>(in_use, 0, leased);
  v1::UsageReport usage;
  usage.set_leased_bytes(static_cast<uint64_t>(leased));
  usage.set_in_use_bytes(static_cast<uint64_t>(in_use));
  return usage;
}

SizeClassCache::Figures SizeClassCache::Stats() {
  Figures f;
  absl::MutexLock lock(&mu_);
  for (const std::vector<Lease*>& leases : by_arena_) {
    for (const Lease* l : leases) {
      ++f.leases;
      f.leased_bytes += l->size;
      f.rows.push_back({l->device, l->size, l->carver_->used_bytes(), l->blocks_out_});
    }
  }
  f.carved_bytes = carved_bytes_;
  f.lost_bytes = lost_bytes_;
  return f;
}

}  // namespace client
}  // namespace gpumem
