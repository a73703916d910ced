// MappedBuffer: mmap, mprotect, mremap, madvise and munmap (see
// mapped_buffer.h).
#include "common/alloc/mapped_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace gpumem {
namespace {

[[noreturn]] void MapFailed(const char* what, size_t bytes) {
  std::fprintf(stderr, "MappedBuffer: cannot %s %zu bytes of host memory: %s\n",
               what, bytes, std::strerror(errno));
  std::abort();
}

}  // namespace

size_t MappedBuffer::PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t MappedBuffer::RoundUpToPage(size_t bytes) {
  const size_t page = PageSize();
  return (bytes + page - 1) / page * page;
}

MappedBuffer::~MappedBuffer() {
  if (data_ != nullptr) munmap(data_, reserved_);
}

void MappedBuffer::Reserve(size_t bytes) {
  if (data_ != nullptr || bytes == 0) return;
  bytes = RoundUpToPage(bytes);
  void* p = mmap(nullptr, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) MapFailed("reserve", bytes);
  data_ = p;
  reserved_ = bytes;
}

void MappedBuffer::Resize(size_t bytes) {
  bytes = RoundUpToPage(bytes == 0 ? 1 : bytes);
  if (bytes == bytes_) return;
  char* const base = static_cast<char*>(data_);
  if (data_ != nullptr && bytes <= reserved_) {
    if (bytes > bytes_) {
      if (mprotect(base + bytes_, bytes - bytes_, PROT_READ | PROT_WRITE) != 0) {
        MapFailed("commit", bytes);
      }
    } else {
      // Back to reserved: dropped pages read as zero when made usable again.
      madvise(base + bytes, bytes_ - bytes, MADV_DONTNEED);
      mprotect(base + bytes, bytes_ - bytes, PROT_NONE);
    }
    bytes_ = bytes;
    return;
  }
  void* p;
  if (data_ == nullptr) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  } else {
    // Past the reservation: give back its inaccessible tail (mremap moves
    // one mapping, and the tail is another), then grow the usable part.
    if (reserved_ > bytes_) munmap(base + bytes_, reserved_ - bytes_);
    p = bytes_ == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                    : mremap(data_, bytes_, bytes, MREMAP_MAYMOVE);
  }
  if (p == MAP_FAILED) MapFailed("map", bytes);
  data_ = p;
  bytes_ = reserved_ = bytes;
}

size_t MappedBuffer::Populate(size_t offset, size_t len) {
  const size_t page = PageSize();
  const size_t begin = offset / page * page;
  const size_t end = std::min(bytes_, RoundUpToPage(offset + len));
  if (begin >= end) return 0;
  return PopulateRange(static_cast<char*>(data_) + begin, end - begin);
}

size_t MappedBuffer::PopulateRange(void* addr, size_t len) {
  const size_t page = PageSize();
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t begin = a / page * page;
  const uintptr_t end = (a + len + page - 1) / page * page;
  if (len == 0 || begin >= end) return 0;
  char* const p = reinterpret_cast<char*>(begin);
  if (madvise(p, end - begin, MADV_POPULATE_WRITE) != 0) {
    // An older kernel: write each page with an atomic add of zero, which
    // faults it in for writing and cannot undo another thread's store.
    for (uintptr_t at = 0; at < end - begin; at += page) {
      __atomic_fetch_add(p + at, 0, __ATOMIC_RELAXED);
    }
  }
  return (end - begin) / page;
}

}  // namespace gpumem
