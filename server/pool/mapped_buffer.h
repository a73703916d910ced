// MappedBuffer: a resizable run of host memory that never copies its
// contents when it grows. It is an anonymous private mapping grown with
// mremap(2): the kernel moves page table entries (and, when the address
// range behind it is free, does not even move those), so growing costs a
// system call and O(pages) page-table work, never a copy of the bytes.
// Pages are faulted in when first written, not when the buffer grows, so a
// large buffer that is mostly unused costs address space, not memory.
//
// Guarantees: after Resize(n) the first min(old, n) bytes keep their
// contents (new bytes read as zero); data() may change on Resize and on
// nothing else. Sizes are rounded up to whole pages. Failure to map aborts
// the process (the caller cannot continue without its metadata).
// OffsetAllocator keeps its node array and neighbour flags in two of these.
#ifndef GPUMEMD_SERVER_POOL_MAPPED_BUFFER_H_
#define GPUMEMD_SERVER_POOL_MAPPED_BUFFER_H_

#include <cstddef>

namespace gpumem {

class MappedBuffer {
 public:
  MappedBuffer() = default;
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  ~MappedBuffer();

  // Grows (or shrinks) the buffer to at least `bytes`, rounded up to pages.
  void Resize(size_t bytes);

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  static size_t PageSize();
  static size_t RoundUpToPage(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_MAPPED_BUFFER_H_
