// Inline definitions of OffsetAllocator's hot path: Allocate (steps 1 and 2
// of the search), Free and the bin-list, node-pool and neighbour-flag
// helpers they are made of. Included at the end of offset_allocator.h and
// nowhere else, so that callers (the SlabPool, the benchmark) compile the
// fast paths in place, without a call per operation. The cold paths (node storage growth,
// splitting for alignment padding, the exact fallback, statistics,
// Validate) stay out of line in offset_allocator.cc. The guarantees, the
// search (Allocate) and the invariants (Validate) are in offset_allocator.h.
#ifndef GPUMEMD_COMMON_ALLOC_OFFSET_ALLOCATOR_INL_H_
#define GPUMEMD_COMMON_ALLOC_OFFSET_ALLOCATOR_INL_H_

#include <cstddef>
#include <cstdint>

// The hot-path helpers are forced inline into Allocate/Free, and those into
// their callers.
#define GPUMEM_POOL_INLINE __attribute__((always_inline)) inline

namespace gpumem {
namespace pool_internal {

// Branch-free "address of node i's field, or a fallback when i == kNone":
// one cmp + cmov on x86-64. Used where i == kNone is a data-dependent coin
// flip (is a bin empty? does it have a next range?) that a branch would
// mispredict about half the time; GCC turns a plain ternary back into a
// branch there. The address is computed on integers and only used when
// i != kNone, so no out-of-range pointer is ever formed.
template <class T>
GPUMEM_POOL_INLINE T* AddrUnlessNone(uint32_t i, uintptr_t addr, T* fallback) {
#if defined(__x86_64__)
  asm("cmpl $-1, %k2\n\tcmove %1, %0" : "+r"(addr) : "r"(fallback), "r"(i) : "cc");
  return reinterpret_cast<T*>(addr);
#else
  return i != 0xFFFFFFFFu ? reinterpret_cast<T*>(addr) : fallback;
#endif
}

// Padding needed to move `offset` up to a multiple of `alignment` (a power of
// two); computed without overflow.
GPUMEM_POOL_INLINE uint64_t AlignPad(uint64_t offset, uint64_t alignment) {
  return (0 - offset) & (alignment - 1);
}

}  // namespace pool_internal

GPUMEM_POOL_INLINE uint32_t OffsetAllocator::NewNode() {
  const uint32_t i = spare_head_;
  if (__builtin_expect(i == kNone, 0)) return GrowNodes();
  spare_head_ = node(i).next_free;
  return i;
}

GPUMEM_POOL_INLINE void OffsetAllocator::ReleaseNode(uint32_t i) {
  // Only the spare marking: every field is rewritten when the slot is reused.
  Node& n = node(i);
  n.prev_free = kSpare;
  n.next_free = spare_head_;
  spare_head_ = i;
}

// &node(i).prev_free, or &scratch_ when i == kNone, without a branch. The
// address is computed on integers, so no out-of-range pointer is formed.
GPUMEM_POOL_INLINE uint32_t* OffsetAllocator::PrevFreeOrScratch(uint32_t i) {
  static_assert(kNone == 0xFFFFFFFFu, "AddrUnlessNone tests for all ones");
  return pool_internal::AddrUnlessNone(
      i,
      reinterpret_cast<uintptr_t>(nodes_) + uintptr_t{i} * sizeof(Node) +
          offsetof(Node, prev_free),
      &scratch_);
}

// &slot_flags(i), or &flags_scratch_ when i == kNone (a flag update for a
// neighbour that does not exist), without a branch.
GPUMEM_POOL_INLINE OffsetAllocator::Flags* OffsetAllocator::NeighbourFlags(uint32_t i) {
  return pool_internal::AddrUnlessNone(
      i, reinterpret_cast<uintptr_t>(neighbours_free_) + i, &flags_scratch_);
}

// Link/Unlink move a free range into / out of a bin's list and keep the bin
// bitmaps in step; InsertFree/RemoveFree also maintain free_ranges_. Rebin
// (a free range that stays free) needs only the former.
GPUMEM_POOL_INLINE void OffsetAllocator::Link(uint32_t i, uint32_t bin) {
  const uint32_t head = bin_head_[bin];
  node(i).prev_free = kNone;
  node(i).next_free = head;
  *PrevFreeOrScratch(head) = i;
  const uint32_t band = bin >> kMantissaBits;
  bin_bitmap_[band] |= uint64_t{1} << (bin & kBinMask);
  // Written only when it changes (rarely: bits are cleared lazily), so the
  // next call's search does not wait for this one.
  if (__builtin_expect(((band_bitmap_ >> band) & 1) == 0, 0)) {
    band_bitmap_ |= uint64_t{1} << band;
  }
  bin_head_[bin] = i;
}

// The head of `bin` becomes `next` (kNone: the bin is now empty, and its
// bitmap bit is cleared with a mask, not a branch). The band summary is left
// as it is: a stale band bit is cleared by the next search that meets it.
GPUMEM_POOL_INLINE void OffsetAllocator::SetBinHead(uint32_t bin, uint32_t next) {
  bin_head_[bin] = next;
  const uint32_t band = bin >> kMantissaBits;
  const uint64_t bits = bin_bitmap_[band] &
      ~(uint64_t{next == kNone} << (bin & kBinMask));
  bin_bitmap_[band] = bits;
}

GPUMEM_POOL_INLINE void OffsetAllocator::Unlink(uint32_t i, uint32_t bin) {
  const uint32_t prev = node(i).prev_free, next = node(i).next_free;
  if (bin_head_[bin] != i) {
    node(prev).next_free = next;
    *PrevFreeOrScratch(next) = prev;
  } else {
    // The next range becomes the head; its back link is left as it is.
    SetBinHead(bin, next);
  }
}

// Unlink for a range known to be its bin's head. Touches no other node: the
// new head's back link is left stale (a head's prev_free is never read).
GPUMEM_POOL_INLINE void OffsetAllocator::UnlinkHead(uint32_t i, uint32_t bin) {
  SetBinHead(bin, node(i).next_free);
}

template <bool kHead>
GPUMEM_POOL_INLINE void OffsetAllocator::UnlinkAny(uint32_t i, uint32_t bin) {
  if (kHead) {
    UnlinkHead(i, bin);
  } else {
    Unlink(i, bin);
  }
}

GPUMEM_POOL_INLINE void OffsetAllocator::InsertFree(uint32_t i, uint32_t bin) {
  Link(i, bin);
  ++free_ranges_;
}

// kHead: i is known to be its bin's head.
template <bool kHead>
GPUMEM_POOL_INLINE void OffsetAllocator::RemoveFree(uint32_t i, uint32_t bin) {
  UnlinkAny<kHead>(i, bin);
  --free_ranges_;
}

// Free range i changed size from one whose bin was old_bin (as that bin's
// head if kHead): move it to the bin of its new size, unless that is the
// same bin (then nothing to do).
template <bool kHead>
GPUMEM_POOL_INLINE void OffsetAllocator::Rebin(uint32_t i, uint32_t old_bin) {
  const uint32_t bin = BinIndex(node(i).size);
  if (bin == old_bin) return;
  UnlinkAny<kHead>(i, old_bin);
  Link(i, bin);
}

// The first non-empty bin in a band above `band` (< 63), or kNone. Bands
// beyond num_bands_ never have their summary bit set; a band whose bit is
// stale (its bins all emptied since) is cleared and skipped.
GPUMEM_POOL_INLINE uint32_t OffsetAllocator::FirstBinAboveBand(uint32_t band) {
  for (uint64_t above = band_bitmap_ & (~uint64_t{0} << (band + 1)); above != 0;
       above &= above - 1) {
    const uint32_t b = static_cast<uint32_t>(__builtin_ctzll(above));
    const uint64_t w = bin_bitmap_[b];
    if (__builtin_expect(w != 0, 1)) {
      return (b << kMantissaBits) | static_cast<uint32_t>(__builtin_ctzll(w));
    }
    band_bitmap_ &= ~(uint64_t{1} << b);
  }
  return kNone;
}

GPUMEM_POOL_INLINE bool OffsetAllocator::Fits(const Node& n, uint64_t size,
                                              uint64_t alignment) const {
  const uint64_t pad = pool_internal::AlignPad(n.offset, alignment);
  return pad <= n.size && size <= n.size - pad;
}

// Carves [aligned offset, +size) out of free range i, which sits in `bin`
// (as the bin's head if kHead).
template <bool kHead>
GPUMEM_POOL_INLINE void OffsetAllocator::Take(uint32_t i, uint32_t bin,
                                              uint64_t size, uint64_t alignment,
                                              Block* out) {
  uint32_t u;
  const uint64_t pad = pool_internal::AlignPad(node(i).offset, alignment);
  if (__builtin_expect(pad == 0, 1)) {
    if (node(i).size == size) {
      // Exact fit: the free node becomes the block; its neighbours (live:
      // free ranges are never adjacent) now have a live neighbour there.
      RemoveFree<kHead>(i, bin);
      u = i;
      slot_flags(u) = Flags(0);
      ClearFlag(NeighbourFlags(node(u).prev_phys), kNextIsFree);
      ClearFlag(NeighbourFlags(node(u).next_phys), kPrevIsFree);
    } else {
      // The block goes to a new node in front of i; i keeps the tail and
      // stays linked in its bin unless the tail's size falls in another bin.
      u = NewNode();
      Node& f = node(i);
      Node& b = node(u);
      b.offset = f.offset;
      b.size = size;
      b.prev_phys = f.prev_phys;
      b.next_phys = i;
      slot_flags(u) = Flags(kNextIsFree);  // the range before f is live
      if (f.prev_phys != kNone) {
        node(f.prev_phys).next_phys = u;
        ClearFlag(&slot_flags(f.prev_phys), kNextIsFree);
      } else {
        phys_head_ = u;
      }
      f.prev_phys = u;
      f.offset += size;
      f.size -= size;
      Rebin<kHead>(i, bin);
    }
  } else {
    // Head padding stays free in node i; the block moves to a new node u
    // and whatever is left behind it to another new node.
    u = SplitAfter(i, pad);
    Rebin<kHead>(i, bin);
    if (node(u).size > size) {
      const uint32_t t = SplitAfter(u, size);
      InsertFree(t, BinIndex(node(t).size));
      slot_flags(u) = Flags(kPrevIsFree | kNextIsFree);
    } else {
      // The live range behind now follows the block, not free range i.
      slot_flags(u) = Flags(kPrevIsFree);
      ClearFlag(NeighbourFlags(node(u).next_phys), kPrevIsFree);
    }
  }
  Node& b = node(u);
  b.prev_free = kUsed;
  b.next_free = kNone;
  used_bytes_ += size;
  ++live_blocks_;
  out->offset = b.offset;
  out->size = size;
  out->handle = u;
}

// Of at most `probes` ranges of `bin`, starting at its head, the one that
// fits (size, alignment) and is smallest, the lowest in the slab among equal
// sizes; kNone if none of them fits. kProbes > 0: `probes` is known to be
// kProbes, and the loop is unrolled (no trip counter, one exit test per
// probe).
template <int kProbes>
GPUMEM_POOL_INLINE uint32_t OffsetAllocator::BestOfFirstN(uint32_t bin, int probes,
                                                          uint64_t size,
                                                          uint64_t alignment) const {
  uint32_t best = kNone;
  uint64_t best_size = ~uint64_t{0}, best_offset = ~uint64_t{0};
  uint32_t i = bin_head_[bin];
#pragma GCC unroll 8
  for (int k = kProbes > 0 ? kProbes : probes; k > 0 && i != kNone; --k) {
    const Node& n = node(i);
    if (Fits(n, size, alignment) &&
        (n.size < best_size || (n.size == best_size && n.offset < best_offset))) {
      best = i;
      best_size = n.size;
      best_offset = n.offset;
    }
    i = n.next_free;
  }
  return best;
}

GPUMEM_POOL_INLINE uint32_t OffsetAllocator::BestOfFirst(uint32_t bin, int probes,
                                                         uint64_t size,
                                                         uint64_t alignment) const {
  if (__builtin_expect(probes == kDefaultOwnBinProbes, 1)) {
    return BestOfFirstN<kDefaultOwnBinProbes>(bin, probes, size, alignment);
  }
  return BestOfFirstN<0>(bin, probes, size, alignment);
}

GPUMEM_POOL_INLINE bool OffsetAllocator::Allocate(uint64_t size,
                                                  uint64_t alignment,
                                                  Block* out) {
  // size == 0 wraps to 2^64 - 1 and fails the first test.
  if (__builtin_expect(size - 1 >= capacity_ - used_bytes_ ||
                           (alignment & (alignment - 1)) != 0 || alignment == 0,
                       0)) {
    return false;
  }
  // BinIndex(size), keeping its shift: size's own bin starts exactly at
  // `size` iff no bit below the shift is set.
  const int sh = (63 - __builtin_clzll(size | kBinsPerBand)) - kMantissaBits;
  const uint32_t own_bin =
      (static_cast<uint32_t>(sh) << kMantissaBits) + static_cast<uint32_t>(size >> sh);
  const uint32_t up = (size & ((uint64_t{1} << sh) - 1)) != 0;
  const int probes = own_bin_probes_;
  // 1. Own bin: the best of its first `probes` ranges.
  uint32_t bin = own_bin;
  uint32_t i = kNone;
  if (__builtin_expect(probes != 0, 1)) i = BestOfFirst(own_bin, probes, size, alignment);
  if (i == kNone) {
    // 2. Good fit: the first non-empty bin above the own bin (or, without
    // probing, at or above size rounded up to the next bin boundary, up_bin
    // = own_bin + up): every range there holds `size` bytes. The band
    // bitmap shifted so that bit 0 is own_bin, then past the bins to skip.
    const uint32_t band = own_bin >> kMantissaBits;  // < num_bands_: size <= capacity
    const uint32_t skip = probes != 0 ? 1 : up;
    const uint64_t rest = (bin_bitmap_[band] >> (own_bin & kBinMask)) >> skip;
    if (rest != 0) {
      bin = own_bin + skip + static_cast<uint32_t>(__builtin_ctzll(rest));
    } else {
      // band <= 58 (sizes < 2^64).
      bin = FirstBinAboveBand(band);
      if (__builtin_expect(bin == kNone, 0)) {
        return AllocateSlow(size, alignment, own_bin, own_bin + up, out);
      }
    }
    if (__builtin_expect(probes == 0, 0)) {
      i = bin_head_[bin];
      if (__builtin_expect(!Fits(node(i), size, alignment), 0)) {
        return AllocateSlow(size, alignment, own_bin, own_bin + up, out);
      }
      Take<true>(i, bin, size, alignment, out);
      return true;
    }
    i = BestOfFirst(bin, probes, size, alignment);
    if (__builtin_expect(i == kNone, 0)) {
      return AllocateSlow(size, alignment, own_bin, own_bin + up, out);
    }
  }
  // One Take for both steps (forced inline here and in the slow path).
  Take<false>(i, bin, size, alignment, out);
  return true;
}

GPUMEM_POOL_INLINE void OffsetAllocator::Free(const Block& block) {
  const uint32_t u = block.handle;
  if (__builtin_expect(u >= num_slots_, 0)) {
    FreeFailed("bad handle", block);
  }
  Node& cur = node(u);
  if (__builtin_expect(cur.prev_free != kUsed, 0)) {
    FreeFailed("block not live", block);
  }
  if (__builtin_expect(cur.offset != block.offset || cur.size != block.size, 0)) {
    FreeFailed("offset/size do not match handle", block);
  }
  used_bytes_ -= block.size;
  --live_blocks_;

  // The neighbours' state comes from the block's own flags, read by handle:
  // it does not wait for the node, and a live neighbour that needs no link
  // update is never touched.
  const uint32_t p = cur.prev_phys, nx = cur.next_phys;
  const uint8_t flags = static_cast<uint8_t>(slot_flags(u));
  const bool prev_free = (flags & kPrevIsFree) != 0;
  const bool next_free = (flags & kNextIsFree) != 0;
  if (prev_free) {
    // p absorbs the block (and the next range if that is free too) and
    // stays in its bin unless its size moves to another bin.
    Node& prev = node(p);
    const uint32_t old_bin = BinIndex(prev.size);
    uint32_t after = nx;
    prev.size += cur.size;
    if (next_free) {
      Node& next = node(nx);
      RemoveFree<false>(nx, BinIndex(next.size));
      prev.size += next.size;
      after = next.next_phys;
      ReleaseNode(nx);
    }
    prev.next_phys = after;
    if (after != kNone) {
      node(after).prev_phys = p;
      SetFlag(&slot_flags(after), kPrevIsFree);
    }
    ReleaseNode(u);
    Rebin<false>(p, old_bin);
  } else if (next_free) {
    // The next range grows downwards over the block.
    Node& next = node(nx);
    const uint32_t old_bin = BinIndex(next.size);
    next.offset = cur.offset;
    next.size += cur.size;
    next.prev_phys = p;
    if (p != kNone) {
      node(p).next_phys = nx;
      SetFlag(&slot_flags(p), kNextIsFree);
    } else {
      phys_head_ = nx;
    }
    ReleaseNode(u);
    Rebin<false>(nx, old_bin);
  } else {
    InsertFree(u, BinIndex(cur.size));
    SetFlag(NeighbourFlags(p), kNextIsFree);
    SetFlag(NeighbourFlags(nx), kPrevIsFree);
  }
}

}  // namespace gpumem

#undef GPUMEM_POOL_INLINE

#endif  // GPUMEMD_COMMON_ALLOC_OFFSET_ALLOCATOR_INL_H_
