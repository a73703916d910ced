// BestFitBaseline: the textbook best-fit allocator used as a yardstick by
// allocator_bench and as the reference model's algorithmic twin. Free ranges
// live in a std::map (offset -> size) for coalescing, and a std::set of
// (size, offset) for best-fit lookup: O(log n) per operation plus one heap
// node allocation per map/set insertion.
#ifndef GPUMEMD_TESTS_ALLOC_BEST_FIT_BASELINE_H_
#define GPUMEMD_TESTS_ALLOC_BEST_FIT_BASELINE_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <utility>

namespace gpumem {

class BestFitBaseline {
 public:
  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;
  };

  explicit BestFitBaseline(uint64_t capacity) : capacity_(capacity) {
    if (capacity > 0) Insert(0, capacity);
  }

  // Smallest free range that fits (size, alignment); ties by lowest offset.
  bool Allocate(uint64_t size, uint64_t alignment, Block* out) {
    for (auto it = by_size_.lower_bound({size, 0}); it != by_size_.end();
         ++it) {
      const uint64_t off = it->second, len = it->first;
      const uint64_t pad = (0 - off) & (alignment - 1);
      if (pad > len || size > len - pad) continue;
      Erase(off, len);
      if (pad > 0) Insert(off, pad);
      if (len - pad > size) Insert(off + pad + size, len - pad - size);
      out->offset = off + pad;
      out->size = size;
      used_ += size;
      ++live_;
      return true;
    }
    return false;
  }

  void Free(const Block& b) {
    uint64_t off = b.offset, len = b.size;
    used_ -= b.size;
    --live_;
    auto next = by_offset_.lower_bound(off);
    if (next != by_offset_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        Erase(prev->first, prev->second);
      }
    }
    next = by_offset_.lower_bound(b.offset + b.size);
    if (next != by_offset_.end() && next->first == b.offset + b.size) {
      len += next->second;
      Erase(next->first, next->second);
    }
    Insert(off, len);
  }

  uint64_t capacity() const { return capacity_; }
  uint64_t used_bytes() const { return used_; }
  uint64_t live_blocks() const { return live_; }
  uint64_t free_ranges() const { return by_offset_.size(); }
  uint64_t largest_free() const {
    return by_size_.empty() ? 0 : by_size_.rbegin()->first;
  }
  const std::map<uint64_t, uint64_t>& ranges() const { return by_offset_; }

  // Approximate heap bytes: one red-black node (4 words of links/colour plus
  // the value) per map and set entry, excluding malloc's own overhead. Live
  // blocks themselves cost nothing here (the caller keeps offset and size).
  uint64_t metadata_bytes() const {
    constexpr uint64_t kRbHeader = 32;
    return sizeof(*this) +
           by_offset_.size() * (kRbHeader + sizeof(std::pair<uint64_t, uint64_t>)) +
           by_size_.size() * (kRbHeader + sizeof(std::pair<uint64_t, uint64_t>));
  }

 private:
  void Insert(uint64_t off, uint64_t len) {
    by_offset_.emplace(off, len);
    by_size_.emplace(len, off);
  }
  void Erase(uint64_t off, uint64_t len) {
    by_offset_.erase(off);
    by_size_.erase({len, off});
  }

  uint64_t capacity_;
  uint64_t used_ = 0;
  uint64_t live_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;
  std::set<std::pair<uint64_t, uint64_t>> by_size_;
};

}  // namespace gpumem

#endif  // GPUMEMD_TESTS_ALLOC_BEST_FIT_BASELINE_H_
