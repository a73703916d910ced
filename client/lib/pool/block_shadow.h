// BlockShadow: which addresses of a lease start a block the program holds,
// so a pointer handed back is checked, never followed. One atomic word per
// 256-byte granule (size_classes::kGranule): the first granule of a live
// block holds kLive with the block's allocator handle and size class, that
// of a freed block kFreed, every other word 0.
//
// Invariants: Take() turns a live word into kFreed in one atomic exchange,
// so of two threads freeing one block exactly one sees it live; the words
// are reserved up front and only touched where blocks start
// (MAP_NORESERVE), and Clear() drops them so a late reader sees 0 (not
// live). Offsets are granule-aligned and inside the lease (callers check).
#ifndef GPUMEMD_CLIENT_LIB_POOL_BLOCK_SHADOW_H_
#define GPUMEMD_CLIENT_LIB_POOL_BLOCK_SHADOW_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "client/lib/pool/size_classes.h"

namespace gpumem {
namespace client {

class BlockShadow {
 public:
  struct Word {
    bool live = false;
    uint32_t handle = 0;
    uint32_t cls = 0;
  };

  // The words of a lease of `bytes` bytes (host memory, or why not).
  static absl::StatusOr<BlockShadow> Create(uint64_t bytes);
  BlockShadow() = default;
  BlockShadow(BlockShadow&& other) noexcept;
  BlockShadow& operator=(BlockShadow&& other) noexcept;
  BlockShadow(const BlockShadow&) = delete;
  BlockShadow& operator=(const BlockShadow&) = delete;
  ~BlockShadow();

  void MarkLive(uint64_t offset, uint32_t handle, uint32_t cls) {
    At(offset).store(kLive | (static_cast<uint64_t>(cls) << 32) | handle,
                     std::memory_order_release);
  }
  // Marks the block at `offset` freed; what the word held before.
  Word Take(uint64_t offset) {
    return Decode(At(offset).exchange(kFreed, std::memory_order_acq_rel));
  }
  bool IsLive(uint64_t offset) const {
    return (At(offset).load(std::memory_order_acquire) & kLive) != 0;
  }
  // Every word back to 0 (the lease is gone).
  void Clear();

 private:
  static constexpr uint64_t kLive = 1ull << 63;
  static constexpr uint64_t kFreed = 1ull << 62;
  static Word Decode(uint64_t w) {
    return {(w & kLive) != 0, static_cast<uint32_t>(w), static_cast<uint32_t>(w >> 32) & 0xFFFFu};
  }
  std::atomic<uint64_t>& At(uint64_t offset) const {
    return words_[offset >> size_classes::kGranuleShift];
  }

  std::atomic<uint64_t>* words_ = nullptr;
  uint64_t map_bytes_ = 0;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_BLOCK_SHADOW_H_
