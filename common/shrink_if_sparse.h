// ShrinkIfSparse: gives back the capacity a hash map grew to once it is
// mostly empty. Swiss tables (absl::flat_hash_map and _set) keep their
// capacity after erase, so a table one burst grew (a tenant's thousands of
// tiny blocks, a flood of connections) would stay that size for the life of
// the process. Called after an erase: rehashing costs O(size) and happens
// only after the table lost seven eighths of its capacity's worth, so it is
// O(1) per erase over time.
#ifndef GPUMEMD_COMMON_SHRINK_IF_SPARSE_H_
#define GPUMEMD_COMMON_SHRINK_IF_SPARSE_H_

#include <cstddef>

namespace gpumem {

// Tables this small are left alone: their capacity costs nothing worth a
// rehash.
inline constexpr size_t kShrinkMinCapacity = 256;

template <typename Table>
void ShrinkIfSparse(Table& table) {
  if (table.capacity() > kShrinkMinCapacity && table.size() * 8 < table.capacity()) {
    table.rehash(0);  // to the smallest capacity that holds what is left
  }
}

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_SHRINK_IF_SPARSE_H_
