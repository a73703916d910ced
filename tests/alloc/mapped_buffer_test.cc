// MappedBuffer: growth within the reservation keeps the address and the
// contents, growth past it keeps the contents, shrinking and growing again
// reads zeros, and Populate faults pages in without changing them.
#include "common/alloc/mapped_buffer.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace gpumem {
namespace {

void Fill(const MappedBuffer& b, size_t from, size_t to, uint8_t seed) {
  uint8_t* p = static_cast<uint8_t*>(b.data());
  for (size_t i = from; i < to; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
}
bool Holds(const MappedBuffer& b, size_t from, size_t to, uint8_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(b.data());
  for (size_t i = from; i < to; ++i) {
    if (p[i] != static_cast<uint8_t>(seed + i * 7)) return false;
  }
  return true;
}
bool Zero(const MappedBuffer& b, size_t from, size_t to) {
  const uint8_t* p = static_cast<const uint8_t*>(b.data());
  for (size_t i = from; i < to; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST(MappedBuffer, GrowsInPlaceWithinTheReservation) {
  const size_t page = MappedBuffer::PageSize();
  MappedBuffer b;
  b.Reserve(64 * page);
  EXPECT_EQ(b.reserved(), 64 * page);
  EXPECT_EQ(b.bytes(), 0u);
  b.Resize(1);
  EXPECT_EQ(b.bytes(), page);
  void* const at = b.data();
  Fill(b, 0, page, 3);
  for (size_t pages = 2; pages <= 64; pages *= 2) {
    b.Resize(pages * page);
    EXPECT_EQ(b.data(), at);
    EXPECT_EQ(b.bytes(), pages * page);
    EXPECT_EQ(b.reserved(), 64 * page);
    EXPECT_TRUE(Holds(b, 0, page, 3));
    EXPECT_TRUE(Zero(b, page, pages * page));
  }
}

TEST(MappedBuffer, GrowsPastTheReservation) {
  const size_t page = MappedBuffer::PageSize();
  MappedBuffer b;
  b.Reserve(4 * page);
  b.Resize(3 * page);
  Fill(b, 0, 3 * page, 11);
  b.Resize(1000 * page);
  EXPECT_EQ(b.bytes(), 1000 * page);
  EXPECT_EQ(b.reserved(), 1000 * page);
  EXPECT_TRUE(Holds(b, 0, 3 * page, 11));
  EXPECT_TRUE(Zero(b, 3 * page, 1000 * page));
  Fill(b, 0, 1000 * page, 12);
  b.Resize(4000 * page);
  EXPECT_TRUE(Holds(b, 0, 1000 * page, 12));
}

TEST(MappedBuffer, WithoutReservation) {
  const size_t page = MappedBuffer::PageSize();
  MappedBuffer b;
  b.Resize(5000);
  EXPECT_EQ(b.bytes(), MappedBuffer::RoundUpToPage(5000));
  EXPECT_EQ(b.reserved(), b.bytes());
  Fill(b, 0, 5000, 5);
  b.Resize(64 * page);
  EXPECT_TRUE(Holds(b, 0, 5000, 5));
}

TEST(MappedBuffer, ShrinkThenGrowReadsZeros) {
  const size_t page = MappedBuffer::PageSize();
  MappedBuffer b;
  b.Reserve(16 * page);
  b.Resize(8 * page);
  Fill(b, 0, 8 * page, 9);
  b.Resize(2 * page);
  EXPECT_EQ(b.bytes(), 2 * page);
  b.Resize(8 * page);
  EXPECT_TRUE(Holds(b, 0, 2 * page, 9));
  EXPECT_TRUE(Zero(b, 2 * page, 8 * page));
}

TEST(MappedBuffer, PopulateKeepsContentsAndClipsToTheUsablePart) {
  const size_t page = MappedBuffer::PageSize();
  MappedBuffer b;
  b.Reserve(32 * page);
  b.Resize(8 * page);
  Fill(b, 0, page + 100, 21);
  EXPECT_EQ(b.Populate(0, 4 * page), 4u);
  EXPECT_EQ(b.Populate(page + 1, 2 * page), 3u);  // partial pages count whole
  EXPECT_EQ(b.Populate(6 * page, 100 * page), 2u);  // clipped to bytes()
  EXPECT_EQ(b.Populate(8 * page, page), 0u);
  EXPECT_TRUE(Holds(b, 0, page + 100, 21));
  EXPECT_TRUE(Zero(b, page + 100, 8 * page));
}

}  // namespace
}  // namespace gpumem
