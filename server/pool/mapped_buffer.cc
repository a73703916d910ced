// MappedBuffer: mmap, mremap and munmap (see mapped_buffer.h).
#include "server/pool/mapped_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpumem {

size_t MappedBuffer::PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t MappedBuffer::RoundUpToPage(size_t bytes) {
  const size_t page = PageSize();
  return (bytes + page - 1) / page * page;
}

MappedBuffer::~MappedBuffer() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

void MappedBuffer::Resize(size_t bytes) {
  bytes = RoundUpToPage(bytes == 0 ? 1 : bytes);
  if (bytes == bytes_) return;
  void* p;
  if (data_ == nullptr) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  } else {
    p = mremap(data_, bytes_, bytes, MREMAP_MAYMOVE);
  }
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "MappedBuffer: cannot map %zu bytes of host memory: %s\n",
                 bytes, std::strerror(errno));
    std::abort();
  }
  data_ = p;
  bytes_ = bytes;
}

}  // namespace gpumem
