// NodeStorage: the host memory behind an OffsetAllocator's ranges, two
// parallel arrays with one element per slot (a 32-byte node and a flag
// byte), that grow without ever copying or moving what they hold and are
// faulted in before the allocator writes them. The arrays sit in address
// space reserved up front (MappedBuffer; inaccessible, so neither memory nor
// commit charge until made usable); the owner hands out slots 0, 1, 2, ...
// in order and calls Prepare whenever it reaches the last check point.
//
// Invariants: slots [0, n] are readable and writable after Prepare(n)
// returns, at the addresses nodes() / flags() give then; those addresses
// change only in a Prepare that goes past the reservation; contents are
// never copied or lost (new slots read as zero); only the owner writes the
// arrays. Failure to map aborts (MappedBuffer). Prepare, nodes(), flags(),
// the owner's counters and Check belong to the owner (one thread at a time,
// e.g. under SlabPool's lock); the populator's side is synchronised here.
#ifndef GPUMEMD_COMMON_ALLOC_NODE_STORAGE_H_
#define GPUMEMD_COMMON_ALLOC_NODE_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/alloc/mapped_buffer.h"
#include "common/alloc/page_populator.h"

namespace gpumem {

class NodeStorage : public std::enable_shared_from_this<NodeStorage> {
 public:
  // Up to this many bytes of nodes are made usable and faulted in by one
  // synchronous step (and by one madvise of the populator).
  static constexpr uint64_t kBatchBytes = 32 * 1024;
  // Slots a fresh storage is made usable for by its first Prepare: 128
  // 32-byte nodes, one page.
  static constexpr uint32_t kInitialSlots = 128;

  // `node_bytes` / `flag_bytes`: the two arrays' element sizes. Reserves
  // address space for `reserve_slots` slots (at least kInitialSlots).
  // `populator` (may be null: all work in Prepare) must outlive this.
  static std::shared_ptr<NodeStorage> Create(size_t node_bytes, size_t flag_bytes,
                                             uint64_t reserve_slots,
                                             PagePopulator* populator);
  NodeStorage(const NodeStorage&) = delete;
  NodeStorage& operator=(const NodeStorage&) = delete;

  // Makes slot n usable (the owner is about to hand it out; n == the check
  // point the last call returned, or 0 first) and keeps storage coming
  // ahead of it. Returns the next check point, > n.
  //   * Without a PagePopulator, the work is done in the calling thread: it
  //     makes usable and faults in (MADV_POPULATE_WRITE) one batch of up to
  //     kBatchBytes of nodes at a time, so only one new slot in a batch's
  //     worth pays for fresh memory.
  //   * With one (the daemon's SlabPool), Prepare only posts a request: the
  //     populator's thread makes the next stretch usable (mprotect) and
  //     faults it in, ahead of the owner by a quarter of what it has handed
  //     out (AheadBytes: a page to 1 MiB of nodes). The owner never waits for
  //     it and takes no lock for it; posting wakes the populator's thread,
  //     which the posting call pays for (a futex wake, once per stretch). If
  //     the owner outruns it (a slab filling faster than the host backs
  //     pages), Prepare makes the next batch usable itself (one mprotect) and
  //     leaves its pages to fault one at a time (one page fault per 128 new
  //     slots) rather than in a batch. The populator thread only makes
  //     syscalls on the arrays (mprotect, madvise), under mu_ except for the
  //     populate itself, which changes no byte.
  //   * Past the reservation (more than `reserve_slots` slots), the arrays
  //     double by mremap (page tables move, bytes do not), in the calling
  //     thread, after any background work on them has finished; the
  //     populator never works past the reservation.
  uint32_t Prepare(uint32_t n);

  void* nodes() const { return nodes_; }
  void* flags() const { return flags_; }

  // What the owner's thread did itself in Prepare (allocator_bench blames a
  // slow call on these), and what the populator did. Faulting-in is counted
  // by the thread that did it, whichever code path it took.
  struct Counts {
    uint64_t grows = 0;            // arrays made larger by the owner's thread
    uint64_t remaps = 0;           // of those, past the reservation (mremap)
    uint64_t populate_batches = 0;  // batches the owner's thread faulted in
    uint64_t pages_populated = 0;   // pages those batches asked for
    uint64_t requests = 0;          // work posted to the populator
    uint64_t background_batches = 0;  // batches the populator faulted in
    uint64_t background_pages = 0;
  };
  Counts counts() const;

  // Bytes of the arrays resident or about to be: pages of the slots handed
  // out (`handed_out`) or populated, whichever reaches further.
  uint64_t ResidentBytes(uint32_t handed_out) const;

  // I7 of OffsetAllocator: handed_out <= usable slots, populated <= usable,
  // the usable part within each mapping and its reservation, nodes() and
  // flags() current. INTERNAL describing the first broken one.
  absl::Status Check(uint32_t handed_out) const;

  // Tests: blocks until no populator work for this storage is queued or
  // running.
  void WaitForBackground() const;

 private:
  NodeStorage(size_t node_bytes, size_t flag_bytes, uint64_t reserve_slots,
              PagePopulator* populator);
  static uint64_t AheadBytes(uint64_t handed_out_bytes);
  // Makes at least `slots` slots usable (mprotect; past the reservation,
  // mremap after waiting out the populator). True if it remapped.
  bool GrowLocked(uint64_t slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Faults in the pages of slots [from, to) of the arrays at `node_base`
  // and `flag_base`, counting them for the thread that runs it: the
  // populator's (PagePopulator::OnWorkerThread) or else the owner's.
  void PopulateSlots(char* node_base, char* flag_base, uint32_t from, uint32_t to);
  // populated_ = max(populated_, to), from either thread.
  void RaisePopulated(uint32_t to);
  // The populator's task: bring usable and populated slots up to `target`.
  void Background(uint32_t target);

  const size_t node_bytes_, flag_bytes_;
  const uint32_t reserve_slots_;  // slots the reservation holds
  PagePopulator* const populator_;
  // The owner's: cached addresses, the last target requested, its counts.
  void* nodes_ = nullptr;
  void* flags_ = nullptr;
  uint32_t requested_ = 0;
  Counts own_;

  mutable absl::Mutex mu_;
  MappedBuffer node_buffer_ ABSL_GUARDED_BY(mu_);
  MappedBuffer flag_buffer_ ABSL_GUARDED_BY(mu_);
  bool populating_ ABSL_GUARDED_BY(mu_) = false;  // populate running unlocked
  int pending_ ABSL_GUARDED_BY(mu_) = 0;          // tasks posted, not finished
  std::atomic<uint64_t> background_batches_{0};  // written by the populator
  std::atomic<uint64_t> background_pages_{0};
  // Slots usable in both arrays: stored under mu_, read by the owner
  // without it (a slot below it can be written).
  std::atomic<uint32_t> usable_{0};
  // Slots whose pages have been faulted in (ahead of or behind the owner);
  // only raised (RaisePopulated).
  std::atomic<uint32_t> populated_{0};
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_ALLOC_NODE_STORAGE_H_
