// Argument checks and shard layout (server/placement/shard_plan.h).
#include "server/placement/shard_plan.h"

#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace placement {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

struct PlanCase {
  std::string name;
  std::string request;  // AllocateRequest, text format
  size_t max_shards;
  bool sharded;
  std::vector<uint64_t> sizes;
  uint64_t alignment;
  std::string error;  // substring of an INVALID_ARGUMENT message
};

// Shown by gtest instead of the bytes of the case.
void PrintTo(const PlanCase& c, std::ostream* os) {
  *os << "\"" << c.name << "\"";
}

class PlanShardsTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanShardsTest, Plans) {
  const PlanCase& c = GetParam();
  gpumem::v1::AllocateRequest request;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(c.request, &request));
  absl::StatusOr<ShardPlan> got = PlanShards(request, 256, c.max_shards);
  if (!c.error.empty()) {
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
    return;
  }
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->sharded, c.sharded);
  EXPECT_THAT(got->sizes, ElementsAreArray(c.sizes));
  EXPECT_EQ(got->alignment, c.alignment);
  uint64_t total = 0;
  for (uint64_t s : got->sizes) total += s;
  EXPECT_EQ(got->total_bytes, total);
}

INSTANTIATE_TEST_SUITE_P(
    Table, PlanShardsTest,
    ::testing::Values(
        PlanCase{"Single", "size_bytes: 1000", 4, false, {1000}, 256, ""},
        PlanCase{"DefaultAlignment",
                 "size_bytes: 1 alignment: 0",
                 4,
                 false,
                 {1},
                 256,
                 ""},
        PlanCase{"ExplicitAlignment",
                 "size_bytes: 1 alignment: 4096",
                 4,
                 false,
                 {1},
                 4096,
                 ""},
        PlanCase{
            "AlignmentOne", "size_bytes: 1 alignment: 1", 4, false, {1}, 1, ""},
        PlanCase{"EqualSplit",
                 "size_bytes: 1200 shard_count: 3",
                 4,
                 true,
                 {400, 400, 400},
                 256,
                 ""},
        PlanCase{"RemainderOnLast",
                 "size_bytes: 1003 shard_count: 4",
                 4,
                 true,
                 {250, 250, 250, 253},
                 256,
                 ""},
        PlanCase{
            "OneShard", "size_bytes: 7 shard_count: 1", 4, true, {7}, 256, ""},
        PlanCase{"ExplicitSizes",
                 "shard_sizes: [5, 1, 9]",
                 4,
                 true,
                 {5, 1, 9},
                 256,
                 ""},
        PlanCase{"ExplicitWithMatchingCountAndTotal",
                 "size_bytes: 15 shard_count: 3 shard_sizes: [5, 1, 9]",
                 4,
                 true,
                 {5, 1, 9},
                 256,
                 ""},
        PlanCase{"SizeZero",
                 "size_bytes: 0",
                 4,
                 false,
                 {},
                 0,
                 "size_bytes must be > 0"},
        PlanCase{"SizeZeroSharded",
                 "shard_count: 2",
                 4,
                 false,
                 {},
                 0,
                 "size_bytes must be > 0"},
        PlanCase{"AlignmentNotPowerOfTwo",
                 "size_bytes: 1 alignment: 384",
                 4,
                 false,
                 {},
                 0,
                 "alignment 384 is not a power of two"},
        PlanCase{"TooManyShards",
                 "size_bytes: 100 shard_count: 5",
                 4,
                 false,
                 {},
                 0,
                 "5 shards need 5 distinct devices; the placement allows 4"},
        PlanCase{"HugeShardCount",
                 "size_bytes: 100 shard_count: 4000000000",
                 4,
                 false,
                 {},
                 0,
                 "4000000000 shards need"},
        PlanCase{"TooManyExplicitShards",
                 "shard_sizes: [1, 1, 1]",
                 2,
                 false,
                 {},
                 0,
                 "3 shards need 3 distinct devices; the placement allows 2"},
        PlanCase{"ShardsSmallerThanAByte",
                 "size_bytes: 2 shard_count: 3",
                 4,
                 false,
                 {},
                 0,
                 "cannot be split into 3 shards"},
        PlanCase{"ZeroShardSize",
                 "shard_sizes: [4, 0]",
                 4,
                 false,
                 {},
                 0,
                 "shard_sizes[1] is 0"},
        PlanCase{"CountDisagrees",
                 "shard_count: 3 shard_sizes: [4, 4]",
                 4,
                 false,
                 {},
                 0,
                 "shard_count 3 disagrees with the 2 entries"},
        PlanCase{"TotalDisagrees",
                 "size_bytes: 9 shard_sizes: [4, 4]",
                 4,
                 false,
                 {},
                 0,
                 "size_bytes 9 disagrees with the sum of shard_sizes, 8"},
        PlanCase{"SumOverflows",
                 "shard_sizes: [18446744073709551615, 1]",
                 4,
                 false,
                 {},
                 0,
                 "past 2^64"}),
    [](const ::testing::TestParamInfo<PlanCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace placement
}  // namespace gpumem
