// OffsetAllocator: an O(1) sub-allocator of offsets inside one slab.
//
// WHAT IT IS FOR
//   The SlabPool owns big device slabs (64 MiB .. hundreds of GiB) and hands
//   out pieces of them. This class does the bookkeeping for one slab: it
//   manages the integer range [0, capacity) and never touches the managed
//   memory itself (all metadata lives in ordinary host memory owned by this
//   object). It is single-threaded; the SlabPool serialises calls under its
//   own mutex.
//
// WHAT IT GUARANTEES
//   * Allocate(size, alignment) returns a block [offset, offset + size) with
//     offset % alignment == 0 that lies inside [0, capacity) and overlaps no
//     other live block. The block holds exactly `size` bytes: any slack in
//     front of it (alignment padding) or behind it is split off and stays a
//     free range, so used_bytes() + free_bytes() == capacity() always.
//   * Allocate returns false ONLY if no free range can hold `size` bytes at
//     the requested alignment (checked exactly, see "Search" below). Invalid
//     arguments (size 0, alignment not a power of two) also return false.
//   * Free returns the block's bytes and immediately coalesces them with free
//     neighbours, so two free ranges are never adjacent.
//   * Allocate and Free do O(1) work (a bounded number of bit scans and list
//     link updates) except in the exact-fit fallback described below, which
//     runs only when the O(1) searches found nothing. When the node pool is
//     warm (a previous peak in the number of ranges was at least as high)
//     neither call allocates host memory.
//   * 64-bit sizes and offsets throughout; capacity may be any value up to
//     2^64 - 1.
//
// HOW
//   (Code: Allocate, Free and the helpers they are made of are inline, in
//   offset_allocator_inl.h, so callers compile them in place; the cold paths
//   are in offset_allocator.cc.)
//   Every range of the slab, free or live, is a Node in one array (nodes_),
//   addressed by 32-bit index. Nodes form a doubly linked list in address
//   order (prev_phys/next_phys, starting at phys_head_, the range at offset
//   0), which makes coalescing O(1). Node slots that are not in use sit on a
//   singly linked list of spare slots, so steady-state churn reuses slots; the
//   array only grows (by 1/8, amortised O(1), so at most ~11% of it is slack)
//   when a new peak of ranges is reached; a slot going back to the spare list
//   only gets its spare mark and link written. A live block's handle is its
//   node index. One byte per node slot (neighbours_free_) says, for a live
//   block, whether the range before it and the range after it are free, so
//   Free decides how to coalesce from a byte it can read by handle, before
//   the block's node arrives from memory, and never touches a live
//   neighbour whose links do not change. Keeping the flags costs a byte
//   write for each live neighbour of a range that changes state; most of
//   them are next to a link write to that neighbour's node anyway
//   (measured: S 43.0 -> 41.8 ns per pair, L 36.5 -> 35.9, against a bitmap
//   of free slots read after the node).
//
//   Free ranges are binned TLSF-style: a size's bin is a "float" with
//   kMantissaBits mantissa bits (sizes below 2^kMantissaBits get one bin per
//   size), so within a power-of-two band there are 2^kMantissaBits bins and a
//   bin's sizes differ by at most 1/2^kMantissaBits relative. Each bin is a
//   doubly linked list threaded through the nodes (prev_free/next_free). A
//   64-bit bitmap per band says which of its bins are non-empty, and one
//   64-bit summary says which bands may have a non-empty bin, so "first
//   non-empty bin at or above b" is two count-trailing-zeros.
//
//   The band summary is updated lazily: a band's bit is set when a range is
//   linked into the band (only if it is not set already) and cleared by the
//   search that finds the band's bitmap empty, never when a bin empties.
//   So the summary is a superset, and a search may skip a few stale bands
//   (at most 64, each cleared once, so O(1) and amortised to nothing). Why:
//   every Allocate and Free used to rewrite the summary with a value that
//   depends on a node just loaded from memory, and the next call's search
//   reads the summary, so consecutive calls waited on each other's cache
//   misses; S went 43.8 -> 43.0 ns per pair, L 38.0 -> 36.5 (allocator_bench,
//   median of 7 interleaved runs, together with the stale head back links
//   below). Making the per-band bitmaps lazy the same way was
//   measured too and is much slower (S +9 ns, L +15 ns): bins empty often,
//   and a search that lands on an empty bin pays a misprediction.
//
//   Bins are 1/64 of their power of two wide (kMantissaBits = 6, so one band
//   is exactly one 64-bit bitmap word): a good fit (step 2) is at most ~1.6%
//   larger than the request, which is what keeps utilisation near best fit
//   without looking at more than one range (measured: allocator_bench).
//
//   Search, for Allocate(size, alignment):
//     1. Own-bin probe, off by default (own_bin_probes() == 0): look at up to
//        own_bin_probes() ranges of size's own bin (the bin containing
//        `size`; its ranges may be a bit smaller or a bit larger than `size`)
//        and take the first that fits. With 5 mantissa bits a one-range
//        probe was worth its cost; with 6 the good fit alone gets the same
//        utilisation on the S and L traces and a better one on L, ~1 ns per
//        pair faster.
//     2. Good fit: the first non-empty bin whose lower bound is >= size (size
//        rounded up to the next bin). Its head range is >= size; take it if
//        it also fits the alignment. One read of the size's band bitmap
//        (shifted so that bit 0 is size's own bin) serves the search within
//        the band.
//     3. If alignment > 1: the first non-empty bin whose lower bound is
//        >= size + alignment - 1; any range there fits whatever its offset.
//     4. Exact fallback (only if 1-3 found nothing): walk every free range in
//        every non-empty bin from size's own bin up to (not including) the
//        bin of step 3 (step 2 if alignment == 1), testing each range
//        exactly. These are the only bins that can hold a fitting range that
//        steps 2-3 could miss. Cost: O(number of free ranges in those bins);
//        for alignment 1 that is one bin, and it is only paid when the slab
//        is nearly full or fragmented for this request (often right before a
//        refusal, which then is proven correct).
//   Once a range is chosen the block is carved from its front. Fast path (no
//   alignment padding): the block gets a new node in front of the free node,
//   which keeps the tail and stays linked in its bin unless the tail's size
//   falls into another bin (an exact fit turns the free node itself into the
//   block). With padding, the padding stays a free range in the old node and
//   the tail behind the block becomes a new free range. Free likewise lets a
//   free neighbour absorb the block and re-bins it only if its bin changed.
//   Re-binning a range that stays free only relinks it in the bin lists (the
//   free-range count and neighbour flags are untouched).
//   A bin's head has no meaningful back link (prev_free): "is i the head?"
//   is answered by bin_head_, so taking the head, the common case of
//   Allocate, writes no other node (the new head keeps a stale back link).
//   Every write to a node that is not otherwise touched is a likely cache
//   miss, and on this hot path those cost more than the arithmetic.
//   In the bin-list updates, whether a bin becomes empty (or was empty) is
//   decided without a branch: it is a coin flip on random workloads, and a
//   mispredicted branch there cost more than computing both outcomes. A link
//   write meant for an absent neighbour goes to scratch_, and the bitmaps
//   are updated with masks computed from "did the bin become empty". (Other
//   data-dependent branches stay: "is this range its bin's head?" predicts
//   well, and Free's "is the previous / next range free?" as a select
//   serialises the neighbour loads behind it; both measured slower as
//   selects.)
//
// INVARIANTS (checked by Validate())
//   I1 Address list: starting at phys_head_ (offset 0) the prev_phys/next_phys
//      list visits ranges of size > 0 that tile [0, capacity) exactly, with
//      consistent back links.
//   I2 Coalescing: no two address-adjacent ranges are both free.
//   I3 Bins: every free range is in exactly the bin BinIndex(size) (doubly
//      linked: every member but the head has a consistent back link; a
//      head's back link is unspecified and never read), bins hold only free
//      ranges, and the number of ranges in bins equals the number of free
//      ranges in I1.
//   I4 Bitmaps: a bin's bit is set iff the bin is non-empty; a band's bit is
//      set if the band has a non-empty bin (it may also be set for an empty
//      band, see above) and never for a band past the capacity; a live
//      block's neighbour flags say exactly whether the ranges before and
//      after it are free.
//   I5 Counters: used_bytes/live_blocks/free_ranges equal the sums over the
//      address list, and so does free_bytes (not stored: it is capacity -
//      used_bytes, since a block holds exactly its asked size).
//   I6 Node pool: every slot of nodes_ is either on the address list or on
//      the spare list, and never both.
//
// Metadata: sizeof(Node) == 32 bytes per range (live or free) plus 1 byte per
// node slot, the node array's growth slack (<= 1/8 of the slots in use at the
// last growth), and fixed per-slab tables: the bin heads (4 bytes per bin,
// 2^kMantissaBits bins per power of two up to the capacity: 7.25 KiB for a
// 4 GiB slab) and one 64-bit bitmap per power of two.
#ifndef GPUMEMD_SERVER_POOL_OFFSET_ALLOCATOR_H_
#define GPUMEMD_SERVER_POOL_OFFSET_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/pool/mapped_buffer.h"

namespace gpumem {

class OffsetAllocator {
 public:
  // A live block. `handle` is opaque and identifies the block for O(1) Free.
  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;    // the size that was asked for
    uint32_t handle = 0;
  };

  static constexpr int kMantissaBits = 6;
  static constexpr uint32_t kBinsPerBand = 1u << kMantissaBits;
  static_assert(kMantissaBits >= 1 && kMantissaBits <= 6,
                "a band's bins must fit one 64-bit bitmap word");
  static constexpr int kDefaultOwnBinProbes = 4;

  explicit OffsetAllocator(uint64_t capacity);
  OffsetAllocator(const OffsetAllocator&) = delete;
  OffsetAllocator& operator=(const OffsetAllocator&) = delete;
  ~OffsetAllocator();

  // size >= 1; alignment a power of two >= 1. Returns false when no free
  // range can hold it (never while one exists).
  bool Allocate(uint64_t size, uint64_t alignment, Block* out);
  // `block` must be a live block returned by Allocate (checked; a mismatch
  // aborts the process, since it means the caller corrupted its state).
  void Free(const Block& block);

  uint64_t capacity() const { return capacity_; }
  uint64_t used_bytes() const { return used_bytes_; }  // sum of asked sizes
  // capacity - live bytes (blocks hold exactly their asked size)
  uint64_t free_bytes() const { return capacity_ - used_bytes_; }
  uint64_t largest_free() const;   // largest free range (0 if none)
  uint64_t live_blocks() const { return live_blocks_; }

  // Extra accessors (tests, benchmarks, SlabPool statistics).
  uint64_t free_ranges() const { return free_ranges_; }
  // Free ranges as (offset, size) in address order. O(ranges).
  std::vector<std::pair<uint64_t, uint64_t>> FreeRangeList() const;
  // Host bytes held: node array capacity, bin tables and the object itself.
  uint64_t metadata_bytes() const;
  // Host bytes of nodes currently describing a range (live or free).
  uint64_t nodes_in_use_bytes() const {
    return (live_blocks_ + free_ranges_) * sizeof(Node);
  }

  // Tuning: how many ranges of the request's own bin step 1 of the search
  // looks at (0, the default, disables it). More = closer to best fit,
  // slower; with 64 bins per power of two it buys little (see the header).
  void set_own_bin_probes(int n) { own_bin_probes_ = n < 0 ? 0 : n; }
  int own_bin_probes() const { return own_bin_probes_; }

  // Checks every invariant; returns INTERNAL describing the first broken one.
  absl::Status Validate() const;

  // Bin mapping, public for tests. BinIndex is monotonic in size;
  // BinLowerBound(BinIndex(s)) <= s < BinLowerBound(BinIndex(s) + 1).
  // Branch-free: with sh = floor(log2(size | 2^M)) - M (M = kMantissaBits),
  // size >> sh is in [2^M, 2^(M+1)) (leading one + mantissa) for sizes >= 2^M
  // and is the size itself below that (sh == 0); bin = (sh << M) + (size >>
  // sh) is then band sh + 1 / mantissa, or `size` for small sizes.
  static uint32_t BinIndex(uint64_t size) {
    const int sh = (63 - __builtin_clzll(size | kBinsPerBand)) - kMantissaBits;
    return (static_cast<uint32_t>(sh) << kMantissaBits) +
           static_cast<uint32_t>(size >> sh);
  }
  static uint64_t BinLowerBound(uint32_t bin) {
    const uint32_t band = bin >> kMantissaBits;
    const uint32_t sh = band - (band != 0);
    return static_cast<uint64_t>(bin - (sh << kMantissaBits)) << sh;
  }

 private:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;    // no node / no bin
  static constexpr uint32_t kUsed = 0xFFFFFFFEu;    // prev_free of a live node
  static constexpr uint32_t kSpare = 0xFFFFFFFDu;   // prev_free of a spare slot
  static constexpr uint32_t kMaxNodes = 0xFFFFFFF0u;
  static constexpr uint32_t kBinMask = (1u << kMantissaBits) - 1;
  static constexpr uint32_t kInitialSlots = 128;  // one 4 KiB page of nodes

  struct Node {
    uint64_t offset;
    uint64_t size;
    uint32_t prev_phys;
    uint32_t next_phys;
    // Free node: bin list links (next_free kNone at the tail; a head's
    // prev_free is stale, but never kUsed/kSpare). Live node: prev_free ==
    // kUsed. Spare slot: prev_free == kSpare, next_free = next spare slot;
    // its other fields are stale (a reused slot gets all of them rewritten).
    uint32_t prev_free;
    uint32_t next_free;
  };
  static_assert(sizeof(Node) == 32, "Node must stay 32 bytes");

  static bool IsFree(const Node& n) {
    return n.prev_free != kUsed && n.prev_free != kSpare;
  }
  // Neighbour flags of a live block.
  static constexpr uint8_t kPrevIsFree = 1, kNextIsFree = 2;
  // A byte that is not a character type: a store through uint8_t* may alias
  // anything, which made the compiler reload the vectors' data pointers
  // and node fields after every flag update (measured: S 42.0 -> 41.0 ns
  // per pair with this type).
  enum class Flags : uint8_t {};
  static void SetFlag(Flags* f, uint8_t bit) { *f = Flags(static_cast<uint8_t>(*f) | bit); }
  static void ClearFlag(Flags* f, uint8_t bit) { *f = Flags(static_cast<uint8_t>(*f) & ~bit); }

  [[noreturn]] __attribute__((noinline, cold)) static void FreeFailed(
      const char* what, const Block& block);
  // Slot i of the node storage (i < num_slots_).
  Node& node(uint32_t i) const { return nodes_[i]; }
  Flags& slot_flags(uint32_t i) const { return neighbours_free_[i]; }
  uint32_t* PrevFreeOrScratch(uint32_t i);
  Flags* NeighbourFlags(uint32_t i);
  uint32_t NewNode();
  uint32_t SplitAfter(uint32_t i, uint64_t keep);
  uint32_t GrowNodes();
  void ReleaseNode(uint32_t i);
  void Link(uint32_t i, uint32_t bin);
  void SetBinHead(uint32_t bin, uint32_t next);
  void Unlink(uint32_t i, uint32_t bin);
  void UnlinkHead(uint32_t i, uint32_t bin);
  template <bool kHead>
  void UnlinkAny(uint32_t i, uint32_t bin);
  void InsertFree(uint32_t i, uint32_t bin);
  template <bool kHead>
  void RemoveFree(uint32_t i, uint32_t bin);
  template <bool kHead>
  void Rebin(uint32_t i, uint32_t old_bin);
  uint32_t FindBinAtOrAbove(uint32_t bin);
  uint32_t FirstBinAboveBand(uint32_t band);
  bool Fits(const Node& n, uint64_t size, uint64_t alignment) const;
  template <bool kHead>
  void Take(uint32_t i, uint32_t bin, uint64_t size, uint64_t alignment,
            Block* out);
  uint32_t BestOfFirst(uint32_t bin, int probes, uint64_t size,
                       uint64_t alignment) const;
  bool AllocateSlow(uint64_t size, uint64_t alignment, uint32_t own_bin,
                    uint32_t up_bin, Block* out);

  // Counters that one call updates together are kept apart (with read-mostly
  // fields in between): adjacent ones invite GCC's SLP vectoriser to pack two
  // scalar increments into a slower SSE load/add/shuffle/store sequence.
  // Branch-free link updates: scratch_ absorbs the write meant for a
  // neighbour that does not exist.
  uint32_t scratch_ = 0;
  uint64_t used_bytes_ = 0;
  uint64_t capacity_;
  uint64_t live_blocks_ = 0;
  uint32_t num_bands_ = 0;           // bands that can hold sizes <= capacity
  uint32_t spare_head_ = kNone;      // first spare node slot
  uint64_t free_ranges_ = 0;
  int own_bin_probes_ = kDefaultOwnBinProbes;
  uint32_t phys_head_ = kNone;       // the range at offset 0
  uint64_t band_bitmap_ = 0;         // bit f: band f has a non-empty bin
  std::vector<uint64_t> bin_bitmap_;  // per band: bit s: bin non-empty
  std::vector<uint32_t> bin_head_;    // per bin: first free node or kNone
  // Node storage: slot i is nodes_[i], its neighbour flags (meaningful for
  // live blocks: kPrevIsFree / kNextIsFree say whether the range before /
  // after it is free) neighbours_free_[i]. Both arrays live in MappedBuffers
  // (mremap: growing them copies nothing) sized for slot_capacity_ slots;
  // slots [0, num_slots_) have been handed out (spare or in use), the rest
  // have never been written (their pages are not resident). The pointers are
  // cached here: they change only in GrowNodes.
  Node* nodes_ = nullptr;
  Flags* neighbours_free_ = nullptr;
  uint32_t num_slots_ = 0;
  uint32_t slot_capacity_ = 0;
  MappedBuffer node_buffer_;
  MappedBuffer flag_buffer_;
  // flags_scratch_ absorbs updates for a neighbour that does not exist.
  Flags flags_scratch_{};
};

}  // namespace gpumem

#include "server/pool/offset_allocator_inl.h"  // IWYU pragma: export

#endif  // GPUMEMD_SERVER_POOL_OFFSET_ALLOCATOR_H_
