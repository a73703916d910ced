// OffsetAllocator's cold paths: construction, node array growth, splitting
// for alignment padding, the probing and exact-fallback searches, statistics
// and Validate. The hot path (Allocate, Free) is in offset_allocator_inl.h.
#include "common/alloc/offset_allocator.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace gpumem {
namespace {

inline int Log2Floor(uint64_t v) { return 63 - __builtin_clzll(v); }

}  // namespace

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t reserve_slots,
                                 PagePopulator* populator)
    : capacity_(capacity) {
  num_bands_ = capacity == 0 ? 1 : (BinIndex(capacity) >> kMantissaBits) + 1;
  bin_bitmap_.assign(num_bands_, 0);
  bin_head_.assign(static_cast<size_t>(num_bands_) << kMantissaBits, kNone);
  if (capacity == 0) return;
  if (reserve_slots == 0) reserve_slots = std::min<uint64_t>(capacity, kReservedSlotsCap);
  storage_ = NodeStorage::Create(sizeof(Node), sizeof(Flags),
                                 std::min<uint64_t>(reserve_slots, kMaxNodes), populator);
  const uint32_t n = NewNode();
  node(n) = Node{0, capacity, kNone, kNone, kNone, kNone};
  phys_head_ = n;
  InsertFree(n, BinIndex(capacity));
}

OffsetAllocator::~OffsetAllocator() = default;

// Cold: no spare slot. Hands out the next never-used slot, first asking
// the node storage to make it usable (and to keep storage coming ahead of
// it) when num_slots_ reaches the check point the storage gave last time.
__attribute__((noinline)) uint32_t OffsetAllocator::GrowNodes() {
  const uint32_t n = num_slots_;
  if (n >= kMaxNodes) {
    std::fprintf(stderr, "OffsetAllocator: more than %u ranges\n", kMaxNodes);
    std::abort();
  }
  if (n >= next_check_) {
    next_check_ = storage_->Prepare(n);
    nodes_ = static_cast<Node*>(storage_->nodes());
    neighbours_free_ = static_cast<Flags*>(storage_->flags());
  }
  num_slots_ = n + 1;
  Node& slot = node(n);
  slot.prev_free = kSpare;
  slot.next_free = kNone;
  return n;
}

OffsetAllocator::ColdPathCounts OffsetAllocator::cold_path_counts() const {
  ColdPathCounts c;
  if (storage_ != nullptr) c.storage = storage_->counts();
  c.exact_searches = exact_searches_;
  c.exact_ranges = exact_ranges_;
  return c;
}

// Out of line and cold: Free was handed a block this allocator did not give
// out (or gave out and already took back). The caller's state is corrupt.
void OffsetAllocator::FreeFailed(const char* what, const Block& block) {
  std::fprintf(stderr,
               "OffsetAllocator::Free: %s (handle=%u offset=%llu size=%llu)\n",
               what, block.handle, static_cast<unsigned long long>(block.offset),
               static_cast<unsigned long long>(block.size));
  std::abort();
}

// The first non-empty bin at or above `bin`, or kNone. Clears the stale band
// bits it passes (band summary: see OffsetAllocator::Allocate).
uint32_t OffsetAllocator::FindBinAtOrAbove(uint32_t bin) {
  const uint32_t band = bin >> kMantissaBits;
  if (band >= num_bands_) return kNone;
  const uint64_t in_band =
      bin_bitmap_[band] & (~uint64_t{0} << (bin & kBinMask));
  if (in_band != 0) {
    return (band << kMantissaBits) | __builtin_ctzll(in_band);
  }
  if (band + 1 >= 64) return kNone;
  return FirstBinAboveBand(band);
}

// Cuts node i after its first `keep` bytes (0 < keep < size): the rest
// becomes a new node right behind i in address order, returned unlinked
// from any bin.
uint32_t OffsetAllocator::SplitAfter(uint32_t i, uint64_t keep) {
  const uint32_t t = NewNode();
  Node& n = node(i);
  Node& rest = node(t);
  rest.offset = n.offset + keep;
  rest.size = n.size - keep;
  rest.prev_phys = i;
  rest.next_phys = n.next_phys;
  if (n.next_phys != kNone) node(n.next_phys).prev_phys = t;
  n.next_phys = t;
  n.size = keep;
  return t;
}

bool OffsetAllocator::AllocateAt(uint64_t offset, uint64_t size, Block* out) {
  if (size == 0 || offset >= capacity_ || size > capacity_ - offset) return false;
  uint32_t i = phys_head_;
  if (restore_cursor_ != kNone && restore_cursor_ < num_slots_ &&
      IsFree(node(restore_cursor_)) && node(restore_cursor_).offset <= offset) {
    i = restore_cursor_;
  }
  while (i != kNone && node(i).offset + node(i).size <= offset) i = node(i).next_phys;
  if (i == kNone || !IsFree(node(i)) || node(i).offset > offset) return false;
  const uint64_t pad = offset - node(i).offset;
  if (size > node(i).size - pad) return false;
  const uint32_t bin = BinIndex(node(i).size);
  if (pad == 0) {
    Take<false>(i, bin, size, /*alignment=*/1, out);
  } else {
    // As Take's padded case, with the padding given: it stays free in node
    // i, the block goes to a new node u and the rest to another new node.
    const uint32_t u = SplitAfter(i, pad);
    Rebin<false>(i, bin);
    if (node(u).size > size) {
      const uint32_t t = SplitAfter(u, size);
      InsertFree(t, BinIndex(node(t).size));
      slot_flags(u) = Flags(kPrevIsFree | kNextIsFree);
    } else {
      slot_flags(u) = Flags(kPrevIsFree);
      ClearFlag(NeighbourFlags(node(u).next_phys), kPrevIsFree);
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
  restore_cursor_ = node(out->handle).next_phys;  // the free rest, if any
  return true;
}

// Step 3 of the search, the exact fallback (see OffsetAllocator::Allocate).
__attribute__((noinline)) bool OffsetAllocator::AllocateSlow(
    uint64_t size, uint64_t alignment, uint32_t own_bin, uint32_t up_bin,
    Block* out) {
  ++exact_searches_;
  // Alignment-safe fit: any range >= size + alignment - 1 fits.
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

  // Walk every range of the bins that may still hold a fitting range.
  for (bin = FindBinAtOrAbove(own_bin); bin != kNone && bin < limit_bin;
       bin = FindBinAtOrAbove(bin + 1)) {
    for (uint32_t i = bin_head_[bin]; i != kNone; i = node(i).next_free) {
      ++exact_ranges_;
      if (Fits(node(i), size, alignment)) {
        Take<false>(i, bin, size, alignment, out);
        return true;
      }
    }
  }
  return false;
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
  for (uint32_t i = bin_head_[bin]; i != kNone; i = node(i).next_free) {
    if (node(i).size > best) best = node(i).size;
  }
  return best;
}

std::vector<std::pair<uint64_t, uint64_t>> OffsetAllocator::FreeRangeList()
    const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.reserve(free_ranges_);
  if (capacity_ == 0) return out;
  for (uint32_t i = phys_head_; i != kNone; i = node(i).next_phys) {
    if (IsFree(node(i))) out.emplace_back(node(i).offset, node(i).size);
  }
  return out;
}

// Node storage counts the pages populated (slots handed out and the batch
// ahead of them; the rest of the mapping has never been touched and is not
// resident).
uint64_t OffsetAllocator::metadata_bytes() const {
  return sizeof(*this) + (storage_ != nullptr ? storage_->ResidentBytes(num_slots_) : 0) +
         bin_head_.capacity() * sizeof(uint32_t) +
         bin_bitmap_.capacity() * sizeof(uint64_t);
}

absl::Status OffsetAllocator::Validate() const {
  auto fail = [](const std::string& msg) { return absl::InternalError(msg); };
  const size_t nn = num_slots_;
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
  if (node(phys_head_).prev_phys != kNone || node(phys_head_).offset != 0) {
    return fail("I1 address list: first range is not the range at offset 0");
  }
  uint64_t expect_offset = 0;
  uint32_t prev = kNone;
  bool prev_free = false;
  for (uint32_t i = phys_head_; i != kNone; i = node(i).next_phys) {
    if (i >= nn) return fail(absl::StrFormat("I1 address list: index %u out of range", i));
    if (seen[i]) return fail(absl::StrFormat("I1 address list: cycle at node %u", i));
    seen[i] = 1;
    const Node& n = node(i);
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
      const bool pf = n.prev_phys != kNone && IsFree(node(n.prev_phys));
      const bool nf = n.next_phys != kNone && IsFree(node(n.next_phys));
      const uint8_t want = (pf ? kPrevIsFree : 0) | (nf ? kNextIsFree : 0);
      if (static_cast<uint8_t>(slot_flags(i)) != want) {
        return fail(absl::StrFormat(
            "I4 flags: live node %u has neighbour flags %u, neighbours say %u",
            i, static_cast<uint8_t>(slot_flags(i)), want));
      }
    }
    if (is_free && prev_free) {
      return fail(absl::StrFormat(
          "I2 coalescing: free ranges at %u and %u are adjacent",
          node(prev).offset, n.offset));
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
  for (uint32_t i = spare_head_; i != kNone; i = node(i).next_free) {
    if (i >= nn) return fail(absl::StrFormat("I6 node pool: spare index %u out of range", i));
    if (seen[i] == 1) return fail(absl::StrFormat("I6 node pool: slot %u both live and spare", i));
    if (seen[i] == 2) return fail(absl::StrFormat("I6 node pool: cycle in spare list at %u", i));
    if (node(i).prev_free != kSpare) {
      return fail(absl::StrFormat("I6 node pool: spare slot %u not marked spare", i));
    }
    seen[i] = 2;
    ++spare;
  }
  for (size_t i = 0; i < nn; ++i) {
    if (seen[i] == 0) return fail(absl::StrFormat("I6 node pool: slot %u leaked", i));
  }
  // I7: node storage.
  if (absl::Status st = storage_->Check(num_slots_); !st.ok()) return st;
  if (static_cast<void*>(nodes_) != storage_->nodes() ||
      static_cast<void*>(neighbours_free_) != storage_->flags()) {
    return fail("I7 node storage: the allocator's cached addresses are stale");
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
    for (uint32_t i = bin_head_[bin]; i != kNone; i = node(i).next_free) {
      if (i >= nn || seen[i] != 1) {
        return fail(absl::StrFormat("I3 bins: bin %u holds node %u that is not a range", bin, i));
      }
      const Node& n = node(i);
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
