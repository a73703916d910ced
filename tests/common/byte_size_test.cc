// Byte sizes as users type them, and as the daemon prints them.
#include "common/byte_size.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gpumem {
namespace {

TEST(ParseByteSizeTest, AcceptsWhatUsersType) {
  const std::vector<std::pair<std::string, uint64_t>> cases = {
      {"4096", 4096},
      {"0", 0},
      {"64KiB", 64 << 10},
      {"64K", 64 << 10},
      {"64kb", 64 << 10},
      {"1.5GiB", uint64_t{3} << 29},
      {"2G", uint64_t{2} << 30},
      {"16 MB", uint64_t{16} << 20},
      {" 7b ", 7},
      {"1TiB", uint64_t{1} << 40},
      {"0.5KiB", 512},
      {"1.0001KiB", 1024},  // fractions round down to a whole byte
      {"15EiB", uint64_t{15} << 60},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<uint64_t> got = ParseByteSize(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    EXPECT_EQ(*got, want) << text;
  }
}

TEST(ParseByteSizeTest, RejectsGarbageWithTheTextInTheMessage) {
  for (const char* bad : {"", "GiB", "1.5.5G", "12 parsecs", "-1", "1e9", "0x10",
                          "16EiB", "99999999999999999999", "1 GiBs", "1..G"}) {
    absl::StatusOr<uint64_t> got = ParseByteSize(bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(got.status().message().find(bad), absl::string_view::npos) << bad;
  }
}

TEST(FormatBytesTest, Table) {
  const std::vector<std::pair<uint64_t, std::string>> cases = {
      {0, "0 B"},
      {1023, "1023 B"},
      {1024, "1.00 KiB"},
      {1536, "1.50 KiB"},
      {uint64_t{1} << 20, "1.00 MiB"},
      {uint64_t{8} << 30, "8.00 GiB"},
      {(uint64_t{3} << 40) / 2, "1.50 TiB"},
      {~uint64_t{0}, "16.00 EiB"},
  };
  for (const auto& [bytes, want] : cases) {
    EXPECT_EQ(FormatBytes(bytes), want) << bytes;
  }
}

TEST(ParseDeviceSizesTest, CountsAndLists) {
  auto four = ParseDeviceSizes("4x16GiB");
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(*four, std::vector<uint64_t>(4, uint64_t{16} << 30));
  auto mixed = ParseDeviceSizes("80GiB,80GiB,40GiB");
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(*mixed, (std::vector<uint64_t>{uint64_t{80} << 30, uint64_t{80} << 30,
                                            uint64_t{40} << 30}));
  auto both = ParseDeviceSizes("2x1GiB, 512MiB");
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->size(), 3u);
}

TEST(ParseDeviceSizesTest, Rejects) {
  for (const char* bad : {"", "4x", "x16GiB", "0x16GiB", "65x1GiB", "16GiB,,8GiB",
                          "512KiB", "4x16GiB,banana"}) {
    EXPECT_FALSE(ParseDeviceSizes(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace gpumem
