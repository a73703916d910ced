// Size classes of the client's caching pool: what a request is rounded up to.
//
// Invariants: every class size is a multiple of kGranule (256 bytes, CUDA's
// allocation alignment), ClassSize(ClassOf(s)) >= s, and a class wastes at
// most 1/8 of its size: up to 2 KiB classes are 256 bytes apart, above that
// every power of two is split into 8 classes. ClassOf is branch-light and
// O(1); classes are numbered densely from 0 so they index arrays.
#ifndef GPUMEMD_CLIENT_LIB_POOL_SIZE_CLASSES_H_
#define GPUMEMD_CLIENT_LIB_POOL_SIZE_CLASSES_H_

#include <cstdint>

namespace gpumem {
namespace client {
namespace size_classes {

inline constexpr uint64_t kGranule = 256;
inline constexpr int kGranuleShift = 8;

// s >= 1 and s <= 2^62.
inline uint32_t ClassOf(uint64_t s) {
  if (s <= 8 * kGranule) return static_cast<uint32_t>((s - 1) >> kGranuleShift);
  const int lg = 63 - __builtin_clzll(s - 1);  // >= 11
  return static_cast<uint32_t>(8 + (lg - 11) * 8 + ((s - 1) >> (lg - 3)) - 8);
}

inline uint64_t ClassSize(uint32_t c) {
  if (c < 8) return static_cast<uint64_t>(c + 1) << kGranuleShift;
  const int lg = 11 + static_cast<int>((c - 8) / 8);
  return static_cast<uint64_t>((c - 8) % 8 + 9) << (lg - 3);
}

}  // namespace size_classes
}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_SIZE_CLASSES_H_
