#include "client/lib/pool/block_shadow.h"

#include <sys/mman.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {

absl::StatusOr<BlockShadow> BlockShadow::Create(uint64_t bytes) {
  BlockShadow s;
  s.map_bytes_ = (bytes >> size_classes::kGranuleShift) * sizeof(uint64_t);
  void* words = mmap(nullptr, s.map_bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (words == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no host memory for the block table of a ", bytes, "-byte lease"));
  }
  s.words_ = static_cast<std::atomic<uint64_t>*>(words);
  return s;
}

BlockShadow::BlockShadow(BlockShadow&& other) noexcept
    : words_(std::exchange(other.words_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)) {}

BlockShadow& BlockShadow::operator=(BlockShadow&& other) noexcept {
  if (this != &other) {
    if (words_ != nullptr) munmap(words_, map_bytes_);
    words_ = std::exchange(other.words_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
  }
  return *this;
}

BlockShadow::~BlockShadow() {
  if (words_ != nullptr) munmap(words_, map_bytes_);
}

void BlockShadow::Clear() {
  if (words_ != nullptr) madvise(words_, map_bytes_, MADV_DONTNEED);
}

}  // namespace client
}  // namespace gpumem
