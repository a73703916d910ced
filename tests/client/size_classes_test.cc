// Size classes of the caching pool: every size maps to the smallest class
// that holds it, classes are 256-byte multiples, and above 2 KiB a class
// wastes at most 1/8 of itself.
#include "client/lib/pool/size_classes.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace gpumem {
namespace size_classes = client::size_classes;
namespace {

using size_classes::ClassOf;
using size_classes::ClassSize;

TEST(SizeClassesTest, SmallestHoldingClassAndBoundedWaste) {
  uint64_t checked = 0;
  for (uint64_t s = 1; s <= (uint64_t{1} << 30); s += (s < 70000 ? 1 : s / 4099 + 1)) {
    const uint32_t c = ClassOf(s);
    const uint64_t size = ClassSize(c);
    ASSERT_GE(size, s) << s;
    ASSERT_EQ(size % 256, 0u) << s;
    if (c > 0) ASSERT_LT(ClassSize(c - 1), s) << s;  // the smallest that holds s
    if (s > 2048) ASSERT_LE((size - s) * 8, size) << s;
    ++checked;
  }
  EXPECT_GT(checked, 70000u);
}

TEST(SizeClassesTest, DenseNumbering) {
  EXPECT_EQ(ClassOf(1), 0u);
  EXPECT_EQ(ClassOf(256), 0u);
  EXPECT_EQ(ClassOf(257), 1u);
  EXPECT_EQ(ClassOf(2048), 7u);
  EXPECT_EQ(ClassOf(2049), 8u);
  EXPECT_EQ(ClassSize(8), 2304u);
  EXPECT_EQ(ClassOf(uint64_t{1} << 20), 79u);  // the last thread-cached class
  for (uint32_t c = 0; c < 200; ++c) EXPECT_EQ(ClassOf(ClassSize(c)), c) << c;
}

}  // namespace
}  // namespace gpumem
