// MappedBuffer: a resizable run of host memory that never copies its
// contents when it grows, and that can fault its pages in ahead of use.
// OffsetAllocator keeps its node array and neighbour flags in two of these.
//
// Invariants: after Resize(n) the first min(old, n) bytes keep their
// contents (new bytes read as zero); bytes() <= reserved(); data() changes
// only when Resize goes past reserved(). Sizes are rounded up to whole
// pages. Failure to map aborts the process (the caller cannot continue
// without its metadata); a failed Populate only means faults later.
#ifndef GPUMEMD_COMMON_ALLOC_MAPPED_BUFFER_H_
#define GPUMEMD_COMMON_ALLOC_MAPPED_BUFFER_H_

#include <cstddef>

namespace gpumem {

class MappedBuffer {
 public:
  MappedBuffer() = default;
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  ~MappedBuffer();

  // Reserves address space for the buffer to grow into without moving,
  // inaccessible (PROT_NONE: neither memory nor commit charge). Only on a
  // buffer that holds nothing yet (otherwise a no-op).
  void Reserve(size_t bytes);
  // Grows (or shrinks) the usable part to `bytes`, rounded up to pages.
  // Within the reservation in place (mprotect: data() does not move, no page
  // table is touched); beyond it (or without one) by mremap(2): the kernel
  // moves page table entries (and, when the address range behind it is
  // free, not even those), never the bytes.
  void Resize(size_t bytes);
  // Faults in the pages of [offset, offset + len) (clipped to bytes()) for
  // writing, in one batch (MADV_POPULATE_WRITE; where the kernel lacks it,
  // by touching each page), so that a caller can pay for many fresh pages in
  // one place instead of one page fault at a time. Returns the number of
  // pages it asked the kernel for.
  size_t Populate(size_t offset, size_t len);
  // The same on [addr, addr + len) of any writable mapping, page aligned
  // outward; safe while other threads write there (it changes no byte).
  static size_t PopulateRange(void* addr, size_t len);

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }        // usable
  size_t reserved() const { return reserved_; }  // address space held

  static size_t PageSize();
  static size_t RoundUpToPage(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t reserved_ = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_ALLOC_MAPPED_BUFFER_H_
