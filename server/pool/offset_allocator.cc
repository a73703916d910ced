#include "server/pool/offset_allocator.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"

// The hot-path helpers are forced inline into Allocate/Free.
#define GPUMEM_POOL_INLINE __attribute__((always_inline)) inline
// GCC's SLP vectoriser packs neighbouring 32-bit node-field stores into
// SSE shuffles on the hot paths, which costs more than it saves there.
#if defined(__GNUC__) && !defined(__clang__)
#define GPUMEM_POOL_NO_SLP __attribute__((optimize("no-tree-slp-vectorize")))
#else
#define GPUMEM_POOL_NO_SLP
#endif

namespace gpumem {
namespace {

[[noreturn]] void Fatal(const char* what, uint32_t handle, uint64_t offset,
                        uint64_t size) {
  std::fprintf(stderr,
               "OffsetAllocator::Free: %s (handle=%u offset=%llu size=%llu)\n",
               what, handle, static_cast<unsigned long long>(offset),
               static_cast<unsigned long long>(size));
  std::abort();
}

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

inline int Log2Floor(uint64_t v) { return 63 - __builtin_clzll(v); }

// Padding needed to move `offset` up to a multiple of `alignment` (a power of
// two); computed without overflow.
inline uint64_t AlignPad(uint64_t offset, uint64_t alignment) {
  return (0 - offset) & (alignment - 1);
}

}  // namespace

OffsetAllocator::OffsetAllocator(uint64_t capacity) : capacity_(capacity) {
  num_bands_ = capacity == 0 ? 1 : (BinIndex(capacity) >> kMantissaBits) + 1;
  bin_bitmap_.assign(num_bands_, 0);
  bin_head_.assign(static_cast<size_t>(num_bands_) << kMantissaBits, kNone);
  if (capacity == 0) return;
  nodes_.reserve(kInitialNodes);
  neighbours_free_.resize(nodes_.capacity(), Flags{});
  const uint32_t n = NewNode();
  nodes_[n] = Node{0, capacity, kNone, kNone, kNone, kNone};
  phys_head_ = n;
  InsertFree(n, BinIndex(capacity));
}

OffsetAllocator::~OffsetAllocator() = default;

// Cold: the node array is full. Grows by 1/8 (amortised O(1), and at most
// 1/9 of the array is slack) instead of std::vector's doubling: the slack
// counts against the <= 64 B per live block budget (it was 1/4 until the
// neighbour flags added a byte per slot).
__attribute__((noinline)) uint32_t OffsetAllocator::GrowNodes() {
  const size_t n = nodes_.size();
  if (n >= kMaxNodes) {
    std::fprintf(stderr, "OffsetAllocator: more than %u ranges\n", kMaxNodes);
    std::abort();
  }
  if (n == nodes_.capacity()) {
    size_t want = n + std::max<size_t>(n / 8, kInitialNodes);
    if (want > kMaxNodes) want = kMaxNodes;
    nodes_.reserve(want);
    neighbours_free_.resize(nodes_.capacity(), Flags{});
  }
  nodes_.push_back(Node{0, 0, kNone, kNone, kSpare, kNone});
  return static_cast<uint32_t>(n);
}

GPUMEM_POOL_INLINE uint32_t OffsetAllocator::NewNode() {
  const uint32_t i = spare_head_;
  if (__builtin_expect(i == kNone, 0)) return GrowNodes();
  spare_head_ = nodes_[i].next_free;
  return i;
}

GPUMEM_POOL_INLINE void OffsetAllocator::ReleaseNode(uint32_t i) {
  // Only the spare marking: every field is rewritten when the slot is reused.
  Node& n = nodes_[i];
  n.prev_free = kSpare;
  n.next_free = spare_head_;
  spare_head_ = i;
}

// &base[i].prev_free, or &scratch_ when i == kNone, without a branch. The
// address is computed on integers, so no out-of-range pointer is formed.
GPUMEM_POOL_INLINE uint32_t* OffsetAllocator::PrevFreeOrScratch(Node* base,
                                                                uint32_t i) {
  static_assert(kNone == 0xFFFFFFFFu, "AddrUnlessNone tests for all ones");
  return AddrUnlessNone(i,
                        reinterpret_cast<uintptr_t>(base) +
                            uintptr_t{i} * sizeof(Node) + offsetof(Node, prev_free),
                        &scratch_);
}

// &neighbours_free_[i], or &flags_scratch_ when i == kNone (a flag update
// for a neighbour that does not exist), without a branch.
GPUMEM_POOL_INLINE OffsetAllocator::Flags* OffsetAllocator::NeighbourFlags(uint32_t i) {
  return AddrUnlessNone(i, reinterpret_cast<uintptr_t>(neighbours_free_.data()) + i,
                        &flags_scratch_);
}

// Link/Unlink move a free range into / out of a bin's list and keep the bin
// bitmaps in step; InsertFree/RemoveFree also maintain free_ranges_. Rebin (a free range that stays free) needs only the
// former.
GPUMEM_POOL_INLINE void OffsetAllocator::Link(uint32_t i, uint32_t bin) {
  Node* const base = nodes_.data();
  const uint32_t head = bin_head_[bin];
  base[i].prev_free = kNone;
  base[i].next_free = head;
  *PrevFreeOrScratch(base, head) = i;
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
  Node* const base = nodes_.data();
  const uint32_t prev = base[i].prev_free, next = base[i].next_free;
  if (bin_head_[bin] != i) {
    base[prev].next_free = next;
    *PrevFreeOrScratch(base, next) = prev;
  } else {
    // The next range becomes the head; its back link is left as it is.
    SetBinHead(bin, next);
  }
}

// Unlink for a range known to be its bin's head. Touches no other node: the
// new head's back link is left stale (a head's prev_free is never read).
GPUMEM_POOL_INLINE void OffsetAllocator::UnlinkHead(uint32_t i, uint32_t bin) {
  SetBinHead(bin, nodes_[i].next_free);
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
  const uint32_t bin = BinIndex(nodes_[i].size);
  if (bin == old_bin) return;
  UnlinkAny<kHead>(i, old_bin);
  Link(i, bin);
}

// The first non-empty bin at or above `bin`, or kNone. Clears the stale band
// bits it passes (band summary: see the header).
GPUMEM_POOL_INLINE uint32_t OffsetAllocator::FindBinAtOrAbove(uint32_t bin) {
  uint32_t band = bin >> kMantissaBits;
  if (band >= num_bands_) return kNone;
  const uint64_t in_band =
      bin_bitmap_[band] & (~uint64_t{0} << (bin & kBinMask));
  if (in_band != 0) {
    return (band << kMantissaBits) | __builtin_ctzll(in_band);
  }
  if (band + 1 >= 64) return kNone;
  uint64_t above = band_bitmap_ & (~uint64_t{0} << (band + 1));
  for (; above != 0; above &= above - 1) {
    band = __builtin_ctzll(above);
    if (bin_bitmap_[band] != 0) {
      return (band << kMantissaBits) | __builtin_ctzll(bin_bitmap_[band]);
    }
    band_bitmap_ &= ~(uint64_t{1} << band);
  }
  return kNone;
}

GPUMEM_POOL_INLINE bool OffsetAllocator::Fits(const Node& n, uint64_t size,
                                              uint64_t alignment) const {
  const uint64_t pad = AlignPad(n.offset, alignment);
  return pad <= n.size && size <= n.size - pad;
}

// Cuts node i after its first `keep` bytes (0 < keep < size): the rest
// becomes a new node right behind i in address order, returned unlinked
// from any bin.
uint32_t OffsetAllocator::SplitAfter(uint32_t i, uint64_t keep) {
  const uint32_t t = NewNode();
  Node* const base = nodes_.data();
  Node& n = base[i];
  Node& rest = base[t];
  rest.offset = n.offset + keep;
  rest.size = n.size - keep;
  rest.prev_phys = i;
  rest.next_phys = n.next_phys;
  if (n.next_phys != kNone) base[n.next_phys].prev_phys = t;
  n.next_phys = t;
  n.size = keep;
  return t;
}

// Carves [aligned offset, +size) out of free range i, which sits in `bin`
// (as the bin's head if kHead).
template <bool kHead>
GPUMEM_POOL_INLINE void OffsetAllocator::Take(uint32_t i, uint32_t bin,
                                              uint64_t size, uint64_t alignment,
                                              Block* out) {
  uint32_t u;
  const uint64_t pad = AlignPad(nodes_[i].offset, alignment);
  if (__builtin_expect(pad == 0, 1)) {
    if (nodes_[i].size == size) {
      // Exact fit: the free node becomes the block; its neighbours (live:
      // free ranges are never adjacent) now have a live neighbour there.
      RemoveFree<kHead>(i, bin);
      u = i;
      neighbours_free_[u] = Flags(0);
      ClearFlag(NeighbourFlags(nodes_[u].prev_phys), kNextIsFree);
      ClearFlag(NeighbourFlags(nodes_[u].next_phys), kPrevIsFree);
    } else {
      // The block goes to a new node in front of i; i keeps the tail and
      // stays linked in its bin unless the tail's size falls in another bin.
      u = NewNode();
      Node* const base = nodes_.data();
      Node& f = base[i];
      Node& b = base[u];
      b.offset = f.offset;
      b.size = size;
      b.prev_phys = f.prev_phys;
      b.next_phys = i;
      neighbours_free_[u] = Flags(kNextIsFree);  // the range before f is live
      if (f.prev_phys != kNone) {
        base[f.prev_phys].next_phys = u;
        ClearFlag(&neighbours_free_[f.prev_phys], kNextIsFree);
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
    if (nodes_[u].size > size) {
      const uint32_t t = SplitAfter(u, size);
      InsertFree(t, BinIndex(nodes_[t].size));
      neighbours_free_[u] = Flags(kPrevIsFree | kNextIsFree);
    } else {
      // The live range behind now follows the block, not free range i.
      neighbours_free_[u] = Flags(kPrevIsFree);
      ClearFlag(NeighbourFlags(nodes_[u].next_phys), kPrevIsFree);
    }
  }
  Node& b = nodes_[u];
  b.prev_free = kUsed;
  b.next_free = kNone;
  used_bytes_ += size;
  ++live_blocks_;
  out->offset = b.offset;
  out->size = size;
  out->handle = u;
}

GPUMEM_POOL_NO_SLP bool OffsetAllocator::Allocate(uint64_t size,
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
  if (__builtin_expect(own_bin_probes_ != 0, 0)) {
    return AllocateProbing(size, alignment, own_bin, out);
  }
  const uint32_t band = own_bin >> kMantissaBits;  // < num_bands_: size <= capacity
  // 2. Good fit: the first non-empty bin at or above size rounded up to the
  // next bin boundary (up_bin = own_bin + up). The band bitmap shifted so
  // that bit 0 is own_bin, then past up_bin.
  const uint32_t up = (size & ((uint64_t{1} << sh) - 1)) != 0;
  const uint64_t rest = (bin_bitmap_[band] >> (own_bin & kBinMask)) >> up;
  uint32_t bin;
  if (rest != 0) {
    bin = own_bin + up + static_cast<uint32_t>(__builtin_ctzll(rest));
  } else {
    // band <= 58 (sizes < 2^64), so the shift is defined; bands beyond
    // num_bands_ never have their bit set. A band whose bit is stale (its
    // bins all emptied since) is cleared and skipped.
    uint64_t above = band_bitmap_ & (~uint64_t{0} << (band + 1));
    uint32_t b;
    uint64_t w;
    for (;;) {
      if (__builtin_expect(above == 0, 0)) {
        return AllocateSlow(size, alignment, own_bin, own_bin + up, out);
      }
      b = static_cast<uint32_t>(__builtin_ctzll(above));
      w = bin_bitmap_[b];
      if (__builtin_expect(w != 0, 1)) break;
      band_bitmap_ &= ~(uint64_t{1} << b);
      above &= above - 1;
    }
    bin = (b << kMantissaBits) | static_cast<uint32_t>(__builtin_ctzll(w));
  }
  const uint32_t i = bin_head_[bin];
  if (__builtin_expect(!Fits(nodes_[i], size, alignment), 0)) {
    return AllocateSlow(size, alignment, own_bin, own_bin + up, out);
  }
  // One call site: Take's code is inlined once.
  Take<true>(i, bin, size, alignment, out);
  return true;
}

// Steps 1 and 2 with an own-bin probe (own_bin_probes() > 0).
__attribute__((noinline)) bool OffsetAllocator::AllocateProbing(
    uint64_t size, uint64_t alignment, uint32_t own_bin, Block* out) {
  uint32_t i = bin_head_[own_bin];
  for (int k = own_bin_probes_; k > 0 && i != kNone; --k) {
    if (Fits(nodes_[i], size, alignment)) {
      Take<false>(i, own_bin, size, alignment, out);
      return true;
    }
    i = nodes_[i].next_free;
  }
  const uint32_t up_bin = own_bin + (BinLowerBound(own_bin) != size);
  const uint32_t bin = FindBinAtOrAbove(up_bin);
  if (bin != kNone && Fits(nodes_[bin_head_[bin]], size, alignment)) {
    Take<true>(bin_head_[bin], bin, size, alignment, out);
    return true;
  }
  return AllocateSlow(size, alignment, own_bin, up_bin, out);
}

// Steps 3 and 4 of the search (see the header).
__attribute__((noinline)) bool OffsetAllocator::AllocateSlow(
    uint64_t size, uint64_t alignment, uint32_t own_bin, uint32_t up_bin,
    Block* out) {
  // 3. Alignment-safe fit: any range >= size + alignment - 1 fits.
  uint32_t limit_bin = up_bin;
  uint32_t bin;
  if (alignment > 1) {
    const uint64_t worst = size + (alignment - 1) < size
                               ? ~uint64_t{0}
                               : size + (alignment - 1);
    const uint32_t worst_bin = BinIndex(worst);
    limit_bin = worst_bin + (BinLowerBound(worst_bin) != worst);
    bin = FindBinAtOrAbove(limit_bin);
    if (bin != kNone) {
      Take<true>(bin_head_[bin], bin, size, alignment, out);
      return true;
    }
  }

  // 4. Exact fallback over the bins that may still hold a fitting range.
  for (bin = FindBinAtOrAbove(own_bin); bin != kNone && bin < limit_bin;
       bin = FindBinAtOrAbove(bin + 1)) {
    for (uint32_t i = bin_head_[bin]; i != kNone; i = nodes_[i].next_free) {
      if (Fits(nodes_[i], size, alignment)) {
        Take<false>(i, bin, size, alignment, out);
        return true;
      }
    }
  }
  return false;
}

GPUMEM_POOL_NO_SLP void OffsetAllocator::Free(const Block& block) {
  const uint32_t u = block.handle;
  if (__builtin_expect(u >= nodes_.size(), 0)) {
    Fatal("bad handle", u, block.offset, block.size);
  }
  Node* const base = nodes_.data();
  Node& cur = base[u];
  if (__builtin_expect(cur.prev_free != kUsed, 0)) {
    Fatal("block not live", u, block.offset, block.size);
  }
  if (__builtin_expect(cur.offset != block.offset || cur.size != block.size, 0)) {
    Fatal("offset/size do not match handle", u, block.offset, block.size);
  }
  used_bytes_ -= block.size;
  --live_blocks_;

  // The neighbours' state comes from the block's own flags, read by handle:
  // it does not wait for the node, and a live neighbour that needs no link
  // update is never touched.
  const uint32_t p = cur.prev_phys, nx = cur.next_phys;
  const uint8_t flags = static_cast<uint8_t>(neighbours_free_[u]);
  const bool prev_free = (flags & kPrevIsFree) != 0;
  const bool next_free = (flags & kNextIsFree) != 0;
  if (prev_free) {
    // p absorbs the block (and the next range if that is free too) and
    // stays in its bin unless its size moves to another bin.
    Node& prev = base[p];
    const uint32_t old_bin = BinIndex(prev.size);
    uint32_t after = nx;
    prev.size += cur.size;
    if (next_free) {
      Node& next = base[nx];
      RemoveFree<false>(nx, BinIndex(next.size));
      prev.size += next.size;
      after = next.next_phys;
      ReleaseNode(nx);
    }
    prev.next_phys = after;
    if (after != kNone) {
      base[after].prev_phys = p;
      SetFlag(&neighbours_free_[after], kPrevIsFree);
    }
    ReleaseNode(u);
    Rebin<false>(p, old_bin);
  } else if (next_free) {
    // The next range grows downwards over the block.
    Node& next = base[nx];
    const uint32_t old_bin = BinIndex(next.size);
    next.offset = cur.offset;
    next.size += cur.size;
    next.prev_phys = p;
    if (p != kNone) {
      base[p].next_phys = nx;
      SetFlag(&neighbours_free_[p], kNextIsFree);
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

uint64_t OffsetAllocator::largest_free() const {
  // Highest band whose bitmap is non-empty (stale band bits are skipped,
  // not cleared: this is a const reader).
  uint64_t bands = band_bitmap_;
  while (bands != 0 && bin_bitmap_[Log2Floor(bands)] == 0) {
    bands &= ~(uint64_t{1} << Log2Floor(bands));
  }
  if (bands == 0) return 0;
  const uint32_t band = Log2Floor(bands);
  const uint32_t bin = (band << kMantissaBits) | Log2Floor(bin_bitmap_[band]);
  uint64_t best = 0;
  for (uint32_t i = bin_head_[bin]; i != kNone; i = nodes_[i].next_free) {
    if (nodes_[i].size > best) best = nodes_[i].size;
  }
  return best;
}

std::vector<std::pair<uint64_t, uint64_t>> OffsetAllocator::FreeRangeList()
    const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.reserve(free_ranges_);
  if (capacity_ == 0) return out;
  for (uint32_t i = phys_head_; i != kNone; i = nodes_[i].next_phys) {
    if (IsFree(nodes_[i])) out.emplace_back(nodes_[i].offset, nodes_[i].size);
  }
  return out;
}

uint64_t OffsetAllocator::metadata_bytes() const {
  return sizeof(*this) + nodes_.capacity() * sizeof(Node) +
         bin_head_.capacity() * sizeof(uint32_t) +
         bin_bitmap_.capacity() * sizeof(uint64_t) +
         neighbours_free_.capacity();
}

absl::Status OffsetAllocator::Validate() const {
  auto fail = [](const std::string& msg) { return absl::InternalError(msg); };
  const size_t nn = nodes_.size();
  // Where each slot was seen: 0 = nowhere, 1 = address list, 2 = spare list.
  std::vector<uint8_t> seen(nn, 0);
  uint64_t free_sum = 0, used_sum = 0, live = 0, free_count = 0;

  if (capacity_ == 0) {
    if (nn != 0 || used_bytes_ != 0 || live_blocks_ != 0 ||
        free_ranges_ != 0) {
      return fail("I5 counters: empty slab with non-zero state");
    }
    return absl::OkStatus();
  }
  // I1, I2: address list.
  if (phys_head_ >= nn) return fail("I1 address list: no first range");
  if (nodes_[phys_head_].prev_phys != kNone || nodes_[phys_head_].offset != 0) {
    return fail("I1 address list: first range is not the range at offset 0");
  }
  uint64_t expect_offset = 0;
  uint32_t prev = kNone;
  bool prev_free = false;
  for (uint32_t i = phys_head_; i != kNone; i = nodes_[i].next_phys) {
    if (i >= nn) return fail(absl::StrFormat("I1 address list: index %u out of range", i));
    if (seen[i]) return fail(absl::StrFormat("I1 address list: cycle at node %u", i));
    seen[i] = 1;
    const Node& n = nodes_[i];
    if (n.prev_free == kSpare) {
      return fail(absl::StrFormat("I6 node pool: spare slot %u on address list", i));
    }
    if (n.prev_phys != prev) {
      return fail(absl::StrFormat("I1 address list: bad back link at node %u", i));
    }
    if (n.offset != expect_offset) {
      return fail(absl::StrFormat(
          "I1 address list: node %u at offset %u, expected %u (gap/overlap)",
          i, n.offset, expect_offset));
    }
    if (n.size == 0) return fail(absl::StrFormat("I1 address list: node %u has size 0", i));
    if (n.size > capacity_ - n.offset) {
      return fail(absl::StrFormat("I1 address list: node %u runs past capacity", i));
    }
    const bool is_free = IsFree(n);
    if (!is_free) {
      const bool pf = n.prev_phys != kNone && IsFree(nodes_[n.prev_phys]);
      const bool nf = n.next_phys != kNone && IsFree(nodes_[n.next_phys]);
      const uint8_t want = (pf ? kPrevIsFree : 0) | (nf ? kNextIsFree : 0);
      if (static_cast<uint8_t>(neighbours_free_[i]) != want) {
        return fail(absl::StrFormat(
            "I4 flags: live node %u has neighbour flags %u, neighbours say %u",
            i, static_cast<uint8_t>(neighbours_free_[i]), want));
      }
    }
    if (is_free && prev_free) {
      return fail(absl::StrFormat(
          "I2 coalescing: free ranges at %u and %u are adjacent",
          nodes_[prev].offset, n.offset));
    }
    if (is_free) {
      free_sum += n.size;
      ++free_count;
    } else {
      used_sum += n.size;
      ++live;
    }
    expect_offset = n.offset + n.size;
    prev = i;
    prev_free = is_free;
  }
  if (expect_offset != capacity_) {
    return fail(absl::StrFormat("I1 address list: ranges end at %u, capacity %u",
                                expect_offset, capacity_));
  }
  // I6: spare list.
  uint64_t spare = 0;
  for (uint32_t i = spare_head_; i != kNone; i = nodes_[i].next_free) {
    if (i >= nn) return fail(absl::StrFormat("I6 node pool: spare index %u out of range", i));
    if (seen[i] == 1) return fail(absl::StrFormat("I6 node pool: slot %u both live and spare", i));
    if (seen[i] == 2) return fail(absl::StrFormat("I6 node pool: cycle in spare list at %u", i));
    if (nodes_[i].prev_free != kSpare) {
      return fail(absl::StrFormat("I6 node pool: spare slot %u not marked spare", i));
    }
    seen[i] = 2;
    ++spare;
  }
  for (size_t i = 0; i < nn; ++i) {
    if (seen[i] == 0) return fail(absl::StrFormat("I6 node pool: slot %u leaked", i));
  }
  // I3, I4: bins and bitmaps.
  uint64_t binned = 0;
  const uint32_t num_bins = num_bands_ << kMantissaBits;
  for (uint32_t band = 0; band < 64; ++band) {
    const bool band_bit = (band_bitmap_ >> band) & 1;
    if (band >= num_bands_) {
      if (band_bit) return fail(absl::StrFormat("I4 bitmaps: band %u beyond capacity set", band));
      continue;
    }
    if (!band_bit && bin_bitmap_[band] != 0) {
      return fail(absl::StrFormat("I4 bitmaps: band %u bit disagrees with its bins", band));
    }
    if constexpr (kBinsPerBand < 64) {
      if ((bin_bitmap_[band] >> kBinsPerBand) != 0) {
        return fail(absl::StrFormat("I4 bitmaps: band %u has bits past its bins", band));
      }
    }
  }
  for (uint32_t bin = 0; bin < num_bins; ++bin) {
    const bool bit = (bin_bitmap_[bin >> kMantissaBits] >> (bin & kBinMask)) & 1;
    if (bit != (bin_head_[bin] != kNone)) {
      return fail(absl::StrFormat("I4 bitmaps: bin %u bit disagrees with its list", bin));
    }
    uint32_t back = kNone;
    for (uint32_t i = bin_head_[bin]; i != kNone; i = nodes_[i].next_free) {
      if (i >= nn || seen[i] != 1) {
        return fail(absl::StrFormat("I3 bins: bin %u holds node %u that is not a range", bin, i));
      }
      const Node& n = nodes_[i];
      if (!IsFree(n)) return fail(absl::StrFormat("I3 bins: bin %u holds live node %u", bin, i));
      if (back != kNone && n.prev_free != back) {
        return fail(absl::StrFormat("I3 bins: bad back link at node %u in bin %u", i, bin));
      }
      if (BinIndex(n.size) != bin) {
        return fail(absl::StrFormat("I3 bins: node %u of size %u in bin %u, belongs in %u",
                                    i, n.size, bin, BinIndex(n.size)));
      }
      if (++binned > free_count) {
        return fail("I3 bins: more binned ranges than free ranges (cycle?)");
      }
      back = i;
    }
  }
  if (binned != free_count) {
    return fail(absl::StrFormat("I3 bins: %u ranges binned, %u free ranges", binned,
                                free_count));
  }
  // I5: counters.
  if (free_sum != free_bytes()) {
    return fail(absl::StrFormat("I5 counters: free_bytes %u, ranges sum to %u",
                                free_bytes(), free_sum));
  }
  if (used_sum != used_bytes_) {
    return fail(absl::StrFormat("I5 counters: used_bytes %u, blocks sum to %u",
                                used_bytes_, used_sum));
  }
  if (live != live_blocks_) {
    return fail(absl::StrFormat("I5 counters: live_blocks %u, counted %u", live_blocks_, live));
  }
  if (free_count != free_ranges_) {
    return fail(absl::StrFormat("I5 counters: free_ranges %u, counted %u", free_ranges_,
                                free_count));
  }
  (void)spare;
  return absl::OkStatus();
}

}  // namespace gpumem
