// OffsetAllocator: the bookkeeping of one slab. It hands out ranges of the
// integer interval [0, capacity) and never touches the memory they name
// (its metadata is host memory it owns). Single-threaded: SlabPool
// serialises calls under its own mutex.
//
// Guarantees: a block is [offset, offset + size) at its alignment, inside
// the slab, overlapping no live block, holding exactly `size` bytes (so
// used_bytes() + free_bytes() == capacity()); Allocate refuses only when no
// free range can hold the request; Free coalesces at once; Free is O(1) and
// Allocate O(1) but for an exact fallback that runs only when the fast
// search found nothing; no call copies node storage or, in steady churn,
// touches new memory; placement is close to exact best fit. 64-bit sizes
// and offsets, fewer than 2^32 ranges. How it searches: at Allocate; its
// invariants: at Validate.
#ifndef GPUMEMD_COMMON_ALLOC_OFFSET_ALLOCATOR_H_
#define GPUMEMD_COMMON_ALLOC_OFFSET_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/alloc/node_storage.h"
#include "common/alloc/page_populator.h"

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
  static constexpr int kDefaultOwnBinProbes = 3;
  // Address space reserved for node storage: a slot per possible range (a
  // range holds >= 1 byte, so at most `capacity` of them), at most this many
  // (128 MiB of nodes, 4 MiB of flags); storage grows past it by mremap.
  static constexpr uint32_t kReservedSlotsCap = 1u << 22;
  // Node pages are faulted in ahead of use, up to this many bytes at once.
  static constexpr uint64_t kPopulateBatchBytes = NodeStorage::kBatchBytes;

  // `reserve_slots`: address space reserved for node storage, in ranges (0:
  // the default, one per possible range up to kReservedSlotsCap); node
  // storage grows in place up to it and by mremap past it. `populator`
  // (may be null, must outlive the allocator): the thread that faults node
  // pages in ahead of use; null: the calling thread does, kPopulateBatchBytes
  // at a time. Node storage (NodeStorage) grows in place in address space
  // reserved up front, never copying (past kReservedSlotsCap by mremap:
  // page tables move, bytes do not), so no call stalls on a copy.
  explicit OffsetAllocator(uint64_t capacity, uint64_t reserve_slots = 0,
                           PagePopulator* populator = nullptr);
  OffsetAllocator(const OffsetAllocator&) = delete;
  OffsetAllocator& operator=(const OffsetAllocator&) = delete;
  ~OffsetAllocator();

  // size >= 1; alignment a power of two >= 1. Returns false when no free
  // range can hold it (never while one exists); also false for size 0 or an
  // alignment that is not a power of two.
  //
  // The search. Every range, free or live, is a 32-byte Node in one array
  // addressed by 32-bit index (a live block's handle), linked in address
  // order for O(1) coalescing. Free ranges sit in size bins: a size's bin is
  // a "float" with 6 mantissa bits, so each power of two has 64 bins (one
  // 64-bit bitmap word per band) and a bin's sizes differ by < 1/64. A
  // summary word says which bands may have a non-empty bin: "first
  // non-empty bin above b" is two count-trailing-zeros. With K =
  // own_bin_probes() (at most 2 * K ranges looked at, plus a few bit scans):
  //   1. Own bin (the bin holding `size`; its ranges may be smaller or
  //      larger): of its first K ranges, take the smallest that fits,
  //      lowest address among equal sizes.
  //   2. Good fit: the first non-empty bin above the own bin. No free range
  //      lies between `size` and that bin's sizes except in the own bin, so
  //      any range there is within a bin (< 1/64) of best fit when step 1
  //      found nothing. Of its first K ranges, take the smallest that fits
  //      the alignment, lowest address among equal sizes.
  //   3. Exact fallback, only if 1-2 found nothing: if alignment > 1, the
  //      head of the first non-empty bin whose ranges fit at any offset
  //      (>= size + alignment - 1); failing that (or if alignment == 1),
  //      walk every range of every bin from the own bin up to that bin,
  //      testing each exactly. These are the only bins where steps 1-2 can
  //      miss a fitting range, so a refusal is proven correct.
  // The block is carved from the front of the chosen range; the rest stays
  // free (re-binned only if its bin changes). K = 0 skips step 1 and takes
  // the head of the first non-empty bin at or above `size` rounded up to a
  // bin boundary.
  bool Allocate(uint64_t size, uint64_t alignment, Block* out);
  // `block` must be a live block returned by Allocate (checked; a mismatch
  // aborts the process, since it means the caller corrupted its state).
  void Free(const Block& block);
  // Takes exactly [offset, offset + size), if it lies inside one free range:
  // how a block that an earlier owner of the slab handed out is taken again
  // (a restart restoring its allocations). False, changing nothing, when
  // the range overlaps a live block, leaves the slab or is empty. O(1) per
  // block when blocks are restored in increasing offset order (a cursor
  // remembers where the last one ended), O(ranges) otherwise.
  bool AllocateAt(uint64_t offset, uint64_t size, Block* out);

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
  // Host bytes held: resident node storage (pages of the slots ever handed
  // out), bin tables and the object itself. That is 33 bytes per range
  // (node + neighbour-flag byte), resident only for slots ever handed out
  // (the peak number of ranges) and those populated ahead of them (<
  // kPopulateBatchBytes; with a populator a quarter of those handed out, a
  // page to 1 MiB, at most twice that), plus 4 bytes per bin and 8 per power
  // of two. Address space: 33 bytes per possible range, at most 132 MiB,
  // reserved inaccessible (no memory, no commit charge) until used.
  uint64_t metadata_bytes() const;
  // Host bytes of nodes currently describing a range (live or free).
  uint64_t nodes_in_use_bytes() const {
    return (live_blocks_ + free_ranges_) * sizeof(Node);
  }

  // Tuning: K, how many ranges of a bin steps 1 and 2 of the search look at
  // (default kDefaultOwnBinProbes; 0: the head of the good-fit bin only, see
  // Allocate). More = closer to best fit, slower.
  void set_own_bin_probes(int n) { own_bin_probes_ = n < 0 ? 0 : n; }
  int own_bin_probes() const { return own_bin_probes_; }

  // How often the cold paths ran (kept by the cold paths only, never by the
  // hot path). All but storage's background_* are work done in the calling
  // thread, something a slow call can be blamed on: allocator_bench reads
  // them around every timed Allocate.
  struct ColdPathCounts {
    NodeStorage::Counts storage;     // node storage growth and populating
    uint64_t exact_searches = 0;     // step 3 (exact fallback) runs
    uint64_t exact_ranges = 0;       // ranges step 3 tested
  };
  ColdPathCounts cold_path_counts() const;

  // Checks every invariant; returns INTERNAL describing the first broken one:
  //   I1 Address list: from phys_head_ (offset 0) the ranges tile [0,
  //      capacity) exactly, sizes > 0, consistent back links.
  //   I2 Coalescing: no two address-adjacent ranges are both free.
  //   I3 Bins: every free range is in exactly bin BinIndex(size), doubly
  //      linked (a head's back link is unspecified and never read); bins hold
  //      only free ranges, as many as I1 counts.
  //   I4 Bitmaps: a bin's bit is set iff the bin is non-empty; a band's bit is
  //      set if the band has a non-empty bin (may be stale-set, cleared by the
  //      next search that meets it), never past the capacity; a live block's
  //      neighbour flags say exactly whether its neighbours are free.
  //   I5 Counters: used_bytes/live_blocks/free_ranges equal the sums over I1.
  //   I6 Node pool: every slot handed out is on the address list or on the
  //      spare list, never both.
  //   I7 Node storage: slots handed out <= slots usable, slots populated <=
  //      slots usable, which fit the two mappings; each mapping's usable part
  //      lies within its reservation, and the cached addresses are current
  //      (NodeStorage::Check).
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
  // anything, which makes the compiler reload the vectors' data pointers
  // and node fields after every flag update.
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
  template <int kProbes>
  uint32_t BestOfFirstN(uint32_t bin, int probes, uint64_t size,
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
  // after it is free) neighbours_free_[i]. Both arrays are storage_'s;
  // slots [0, num_slots_) have been handed out (spare or in use), and
  // storage_->Prepare is asked again when num_slots_ reaches next_check_.
  // The pointers are cached here: they change only in Prepare, and only
  // past the reservation.
  Node* nodes_ = nullptr;
  Flags* neighbours_free_ = nullptr;
  uint32_t num_slots_ = 0;
  uint32_t next_check_ = 0;
  std::shared_ptr<NodeStorage> storage_;
  // flags_scratch_ absorbs updates for a neighbour that does not exist.
  Flags flags_scratch_{};
  uint64_t exact_searches_ = 0;
  uint64_t exact_ranges_ = 0;
  uint32_t restore_cursor_ = kNone;  // AllocateAt: where to start looking
};

}  // namespace gpumem

#include "common/alloc/offset_allocator_inl.h"  // IWYU pragma: export

#endif  // GPUMEMD_COMMON_ALLOC_OFFSET_ALLOCATOR_H_
