// The whole placement decision against a fake pool (server/placement/placer.h).
//
// Every table case is also checked for the guarantees that hold whatever
// the case: placement only touches devices it may (strictness), a failed
// call leaves the pool exactly as before, and a successful one adds exactly
// the returned blocks, on distinct devices.
#include "server/placement/placer.h"

#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/placement/refusal.h"
#include "tests/placement/fake_carver.h"

namespace gpumem {
namespace placement {
namespace {

using ::gpumem::v1::AllocateRequest;
using ::gpumem::v1::DeviceRefusal;
using ::gpumem::v1::PlacementRefusal;
using testing::FakeCarver;
using testing::FakeDeviceSpec;
using testing::FakeUuid;
using ::testing::HasSubstr;
using testing::kGiB;
using testing::Pairs;
using testing::Used;

// n GiB, as text for a text-format request.
std::string G(uint64_t n) { return absl::StrCat(n * kGiB); }

// Four 16 GiB devices with `used` GiB in use (no fragmentation).
std::vector<FakeDeviceSpec> FourUsed(std::vector<uint64_t> used) {
  std::vector<FakeDeviceSpec> specs;
  for (uint64_t u : used) specs.push_back(Used(16 * kGiB, u * kGiB));
  return specs;
}

// 16 GiB with 6 GiB pinned so that 10 GiB are free in two 5 GiB ranges.
FakeDeviceSpec Fragmented() {
  FakeDeviceSpec spec;
  spec.total = 16 * kGiB;
  spec.pinned = {{5 * kGiB, 1 * kGiB}, {11 * kGiB, 5 * kGiB}};
  return spec;
}

struct PlaceCase {
  std::string name;
  std::vector<FakeDeviceSpec> devices;
  std::string request;  // AllocateRequest, text format
  absl::StatusCode code = absl::StatusCode::kOk;
  // OK: the device of each block, in shard order.
  std::vector<uint32_t> want_devices;
  // Devices placement may call TryCarve on.
  std::vector<uint32_t> may_try;
  // RESOURCE_EXHAUSTED: the refusal list, by device index.
  std::vector<std::pair<uint32_t, DeviceRefusal::Reason>> want_refusals;
  // Substrings of the status message.
  std::vector<std::string> message_has;
};

// Shown by gtest instead of the bytes of the case.
void PrintTo(const PlaceCase& c, std::ostream* os) {
  *os << "\"" << c.name << "\"";
}

class PlacerTest : public ::testing::TestWithParam<PlaceCase> {};

TEST_P(PlacerTest, Places) {
  const PlaceCase& c = GetParam();
  AllocateRequest request;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(c.request, &request))
      << c.request;
  FakeCarver carver(c.devices);
  const std::vector<FakeCarver::Device> before = carver.devices();
  Placer placer(&carver);

  PlacementResult result = placer.Allocate(request, carver.Snapshot(Pairs));

  EXPECT_EQ(result.status.code(), c.code) << result.status;
  for (const std::string& part : c.message_has) {
    EXPECT_THAT(std::string(result.status.message()), HasSubstr(part));
  }
  // Strict: nothing outside the named, non-excluded devices is touched.
  const std::set<uint32_t> may(c.may_try.begin(), c.may_try.end());
  for (uint32_t d : carver.tried()) {
    EXPECT_TRUE(may.count(d)) << "placement tried device " << d;
  }
  EXPECT_FALSE(carver.released_unknown());

  if (!result.ok()) {
    // All or nothing: the pool is exactly as before.
    EXPECT_TRUE(carver.devices() == before) << "the pool changed";
    EXPECT_TRUE(result.blocks.empty());
  } else {
    EXPECT_EQ(carver.releases(), 0);
    ASSERT_EQ(result.blocks.size(), c.want_devices.size());
    std::vector<FakeCarver::Device> expected = before;
    std::set<uint32_t> used_devices;
    for (size_t i = 0; i < result.blocks.size(); ++i) {
      const CarvedBlock& b = result.blocks[i];
      EXPECT_EQ(b.device, c.want_devices[i]) << "shard " << i;
      EXPECT_TRUE(used_devices.insert(b.device).second)
          << "two shards on device " << b.device;
      expected[b.device].live[b.offset] = b.size_bytes;
      expected[b.device].charged += b.size_bytes;
    }
    EXPECT_TRUE(carver.devices() == expected)
        << "the pool holds other blocks than those returned";
  }

  if (c.code == absl::StatusCode::kResourceExhausted) {
    ASSERT_TRUE(result.refusal.has_value());
    std::vector<std::pair<uint32_t, DeviceRefusal::Reason>> got;
    for (const DeviceRefusal& d : result.refusal->devices()) {
      got.emplace_back(d.device_index(), d.reason());
      EXPECT_EQ(d.device_uuid(), FakeUuid(d.device_index()));
    }
    EXPECT_EQ(got, c.want_refusals);
    // The status carries the same detail, and says the same in words.
    std::optional<PlacementRefusal> carried = RefusalFromStatus(result.status);
    ASSERT_TRUE(carried.has_value());
    EXPECT_EQ(carried->SerializeAsString(),
              result.refusal->SerializeAsString());
    EXPECT_EQ(result.status.message(), DescribeRefusal(*result.refusal));
  } else {
    EXPECT_FALSE(result.refusal.has_value());
  }
}

const std::vector<uint32_t> kAll = {0, 1, 2, 3};
const std::vector<uint32_t> kNone = {};
constexpr auto kCapacity = DeviceRefusal::REASON_CAPACITY;
constexpr auto kFragmentation = DeviceRefusal::REASON_FRAGMENTATION;
constexpr auto kQuota = DeviceRefusal::REASON_QUOTA;
constexpr auto kExcluded = DeviceRefusal::REASON_EXCLUDED;
constexpr auto kHoldsShard = DeviceRefusal::REASON_HOLDS_SHARD;
constexpr auto kOk = absl::StatusCode::kOk;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kExhausted = absl::StatusCode::kResourceExhausted;

std::vector<FakeDeviceSpec> WithQuota() {
  std::vector<FakeDeviceSpec> specs = FourUsed({0, 0, 0, 0});
  specs[0].quota = 1 * kGiB;
  return specs;
}

std::vector<FakeDeviceSpec> WithBroken(uint32_t index) {
  std::vector<FakeDeviceSpec> specs = FourUsed({0, 4, 8, 12});
  specs[index].broken = true;
  return specs;
}

std::vector<FakeDeviceSpec> CapacityFragmentation() {
  std::vector<FakeDeviceSpec> specs = FourUsed({14, 0, 0, 0});
  specs[1] = Fragmented();
  return specs;
}

INSTANTIATE_TEST_SUITE_P(
    Single, PlacerTest,
    ::testing::Values(
        PlaceCase{"NamedDeviceGetsTheBlock",
                  FourUsed({0, 0, 0, 0}),
                  "size_bytes: " + G(1) + R"( placement { devices: "2" })",
                  kOk,
                  {2},
                  {2}},
        PlaceCase{"NamedByUuid",
                  FourUsed({0, 0, 0, 0}),
                  "size_bytes: " + G(1) + " placement { devices: \"" +
                      FakeUuid(3) + "\" }",
                  kOk,
                  {3},
                  {3}},
        PlaceCase{"NoPlacementIsLeastLoaded",
                  FourUsed({4, 1, 6, 2}),
                  "size_bytes: " + G(1),
                  kOk,
                  {1},
                  kAll},
        PlaceCase{"LeastLoadedWins",
                  FourUsed({4, 1, 6, 2}),
                  "size_bytes: " + G(1) +
                      R"( placement { policy: POLICY_LEAST_LOADED })",
                  kOk,
                  {1},
                  kAll},
        PlaceCase{
            "LeastLoadedAmongNamed",
            FourUsed({4, 1, 6, 2}),
            "size_bytes: " + G(1) +
                R"( placement { devices: "0" devices: "2" devices: "3" })",
            kOk,
            {3},
            {0, 2, 3}},
        PlaceCase{
            "PackPicksMostUsed",
            FourUsed({4, 1, 6, 2}),
            "size_bytes: " + G(1) + R"( placement { policy: POLICY_PACK })",
            kOk,
            {2},
            kAll},
        PlaceCase{
            "PackMovesOnWhenMostUsedIsFull",
            FourUsed({4, 1, 16, 2}),
            "size_bytes: " + G(1) + R"( placement { policy: POLICY_PACK })",
            kOk,
            {0},
            kAll},
        PlaceCase{"NearPicksNvLinkNeighbourOverHost",
                  FourUsed({0, 10, 0, 0}),
                  "size_bytes: " + G(1) +
                      R"( placement { policy: POLICY_NEAR near: "0"
                                      devices: "1" devices: "2" devices: "3" })",
                  kOk,
                  {1},
                  {1, 2, 3}},
        PlaceCase{"NearPrefersItself",
                  FourUsed({0, 0, 12, 0}),
                  "size_bytes: " + G(1) +
                      R"( placement { policy: POLICY_NEAR near: "2" })",
                  kOk,
                  {2},
                  kAll},
        PlaceCase{"NearFallsToHostWhenNeighbourFull",
                  FourUsed({0, 16, 0, 8}),
                  "size_bytes: " + G(1) +
                      R"( placement { policy: POLICY_NEAR near: "0"
                                      exclude: "0" })",
                  kOk,
                  {2},
                  {1, 2, 3}},
        PlaceCase{"FullPreferredSetFallsBackInOrder",
                  FourUsed({16, 16, 0, 8}),
                  "size_bytes: " + G(1) +
                      R"( placement { devices: "0"
                                      fallback { devices: "1" }
                                      fallback { devices: "3" }
                                      fallback { devices: "2" } })",
                  kOk,
                  {3},
                  {0, 1, 3}},
        PlaceCase{"PreferredSetServesBeforeFreerFallback",
                  FourUsed({12, 0, 0, 0}),
                  "size_bytes: " + G(1) +
                      R"( placement { devices: "0" fallback {} })",
                  kOk,
                  {0},
                  {0}},
        PlaceCase{"EmptyFallbackMeansAll",
                  FourUsed({16, 8, 4, 12}),
                  "size_bytes: " + G(1) +
                      R"( placement { devices: "0" fallback {} })",
                  kOk,
                  {2},
                  kAll},
        PlaceCase{
            "StrictNeverLeaksOutsideNamedSets",
            FourUsed({16, 16, 0, 0}),
            "size_bytes: " + G(1) +
                R"( placement { devices: "0" fallback { devices: "1" } })",
            kExhausted,
            {},
            {0, 1},
            {{0, kCapacity}, {1, kCapacity}},
            {"cannot place 1.00 GiB: device 0 ", "device 1 "}},
        PlaceCase{"ExcludeAppliesToFallbacks",
                  FourUsed({16, 0, 8, 4}),
                  "size_bytes: " + G(1) +
                      R"( placement { devices: "0" exclude: "1"
                                      fallback { devices: "all" } })",
                  kOk,
                  {3},
                  {0, 2, 3}},
        PlaceCase{"ExcludedNamedDeviceIsReported",
                  FourUsed({16, 0, 0, 0}),
                  "size_bytes: " + G(1) +
                      R"( placement { devices: "0" devices: "1" exclude: "1"
                                      exclude: "3" })",
                  kExhausted,
                  {},
                  {0},
                  {{0, kCapacity}, {1, kExcluded}},
                  {"device 1 (" + FakeUuid(1) + "): excluded"}},
        PlaceCase{
            "ExcludeAll",
            FourUsed({0, 0, 0, 0}),
            "size_bytes: " + G(1) + R"( placement { exclude: "all" })",
            kExhausted,
            {},
            kNone,
            {{0, kExcluded}, {1, kExcluded}, {2, kExcluded}, {3, kExcluded}}},
        PlaceCase{"CapacityFragmentationExcluded",
                  CapacityFragmentation(),
                  "size_bytes: " + G(8) +
                      R"( placement { devices: "0" devices: "1" devices: "2"
                                      exclude: "2" })",
                  kExhausted,
                  {},
                  {0, 1},
                  {{0, kCapacity}, {1, kFragmentation}, {2, kExcluded}},
                  {"cannot place 8.00 GiB: device 0 (" + FakeUuid(0) +
                   "): capacity, 2.00 GiB free; device 1 (" + FakeUuid(1) +
                   "): fragmentation, largest free range 5.00 GiB of 10.00 GiB "
                   "free; device 2 (" +
                   FakeUuid(2) + "): excluded"}},
        PlaceCase{"FragmentedDeviceServesWhatFits",
                  CapacityFragmentation(),
                  "size_bytes: " + G(5) + R"( placement { devices: "1" })",
                  kOk,
                  {1},
                  {1}},
        PlaceCase{"QuotaRefusal",
                  WithQuota(),
                  "size_bytes: " + G(2) + R"( placement { devices: "0" })",
                  kExhausted,
                  {},
                  {0},
                  {{0, kQuota}},
                  {": quota (quota leaves 1073741824 bytes)"}},
        PlaceCase{
            "QuotaFallsBack",
            WithQuota(),
            "size_bytes: " + G(2) +
                R"( placement { devices: "0" fallback { devices: "3" } })",
            kOk,
            {3},
            {0, 3}},
        PlaceCase{"CarverErrorStops",
                  WithBroken(0),
                  "size_bytes: " + G(1),
                  absl::StatusCode::kInternal,
                  {},
                  {0},
                  {},
                  {"device is broken"}},
        PlaceCase{"SizeZero",
                  FourUsed({0, 0, 0, 0}),
                  "size_bytes: 0",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"size_bytes must be > 0"}},
        PlaceCase{"AlignmentNotPowerOfTwo",
                  FourUsed({0, 0, 0, 0}),
                  "size_bytes: 64 alignment: 3",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"alignment 3 is not a power of two"}},
        PlaceCase{"UnknownDevice",
                  FourUsed({0, 0, 0, 0}),
                  R"(size_bytes: 64 placement { devices: "4" })",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"placement.devices: no device \"4\"; devices are 0..3"}},
        PlaceCase{"UnknownUuid",
                  FourUsed({0, 0, 0, 0}),
                  R"(size_bytes: 64 placement { devices: "GPU-0bad" })",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"placement.devices: no device \"GPU-0bad\""}},
        PlaceCase{"UnknownExclude",
                  FourUsed({0, 0, 0, 0}),
                  R"(size_bytes: 64 placement { exclude: "GPU-0bad" })",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"placement.exclude: no device \"GPU-0bad\""}},
        PlaceCase{"UnknownFallback",
                  FourUsed({0, 0, 0, 0}),
                  R"(size_bytes: 64 placement { fallback { devices: "1" }
                                                fallback { devices: "7" } })",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"placement.fallback[1]: no device \"7\"; devices are 0..3"}},
        PlaceCase{
            "UnknownNear",
            FourUsed({0, 0, 0, 0}),
            R"(size_bytes: 64 placement { policy: POLICY_NEAR near: "8" })",
            kInvalid,
            {},
            kNone,
            {},
            {"placement.near: no device \"8\""}}),
    [](const ::testing::TestParamInfo<PlaceCase>& info) {
      return info.param.name;
    });

INSTANTIATE_TEST_SUITE_P(
    Sharded, PlacerTest,
    ::testing::Values(
        PlaceCase{"EqualSplitOnDistinctDevices",
                  FourUsed({0, 0, 0, 0}),
                  "size_bytes: " + G(8) + " shard_count: 4",
                  kOk,
                  {0, 1, 2, 3},
                  kAll},
        PlaceCase{"EqualSplitLeastLoadedFirst",
                  FourUsed({8, 2, 4, 0}),
                  "size_bytes: " + G(2) + " shard_count: 2",
                  kOk,
                  {3, 1},
                  kAll},
        PlaceCase{"ExplicitSizesLargestOnMostFree",
                  FourUsed({0, 8, 12, 14}),
                  "shard_sizes: [" + G(1) + ", " + G(6) + ", " + G(3) + "]",
                  kOk,
                  {2, 0, 1},
                  kAll},
        PlaceCase{"LargestFirstFindsTheFit",
                  FourUsed({6, 14, 16, 16}),
                  "shard_sizes: [" + G(1) + ", " + G(8) + "]",
                  kOk,
                  {1, 0},
                  kAll},
        PlaceCase{"PackShards",
                  FourUsed({4, 1, 6, 2}),
                  "size_bytes: " + G(2) +
                      R"( shard_count: 2 placement { policy: POLICY_PACK })",
                  kOk,
                  {2, 0},
                  kAll},
        PlaceCase{"ShardsUseFallbacksInOrder",
                  FourUsed({0, 8, 4, 0}),
                  "size_bytes: " + G(2) +
                      R"( shard_count: 2 placement { devices: "1"
                                                     fallback { devices: "2" }
                                                     fallback { devices: "3" } })",
                  kOk,
                  {1, 2},
                  {1, 2}},
        PlaceCase{
            "ShardsRespectExclude",
            FourUsed({0, 0, 8, 8}),
            "size_bytes: " + G(2) +
                R"( shard_count: 2 placement { exclude: "0" exclude: "1" })",
            kOk,
            {2, 3},
            {2, 3}},
        PlaceCase{"LastShardDoesNotFitNothingKept",
                  FourUsed({8, 8, 14, 14}),
                  "shard_sizes: [" + G(4) + ", " + G(4) + ", " + G(4) + "]",
                  kExhausted,
                  {},
                  kAll,
                  {{0, kHoldsShard},
                   {1, kHoldsShard},
                   {2, kCapacity},
                   {3, kCapacity}},
                  {"cannot place shard 2 (4.00 GiB) of 3 shards totalling "
                   "12.00 GiB; no shard was kept: device 0 (" +
                   FakeUuid(0) + "): holds shard 0; device 1 (" + FakeUuid(1) +
                   "): holds shard 1; device 2 (" + FakeUuid(2) +
                   "): capacity, 2.00 GiB free"}},
        // 6 GiB free on each named device: shards 0 and 1 would fit, the
        // last one, 6 GiB + 2 bytes with the remainder, fits nowhere.
        PlaceCase{"EqualSplitRemainderDoesNotFit",
                  FourUsed({10, 10, 10, 0}),
                  "size_bytes: " + absl::StrCat(18 * kGiB + 2) +
                      R"( shard_count: 3 placement { devices: "0" devices: "1"
                                                     devices: "2" })",
                  kExhausted,
                  {},
                  {0, 1, 2},
                  {{0, kCapacity}, {1, kCapacity}, {2, kCapacity}},
                  {"cannot place shard 2 (6.00 GiB) of 3 shards totalling "
                   "18.00 GiB"}},
        PlaceCase{"EqualSplitSecondShardDoesNotFit",
                  FourUsed({11, 11, 0, 0}),
                  "size_bytes: " + G(18) +
                      R"( shard_count: 3 placement { devices: "0" devices: "1"
                                                     devices: "2" })",
                  kExhausted,
                  {},
                  {0, 1, 2},
                  {{0, kCapacity}, {1, kCapacity}, {2, kHoldsShard}},
                  {"cannot place shard 1 (6.00 GiB) of 3 shards",
                   "device 2 (" + FakeUuid(2) + "): holds shard 0"}},
        PlaceCase{
            "StrictShardsDoNotLeak",
            FourUsed({0, 15, 0, 0}),
            "size_bytes: " + G(4) +
                R"( shard_count: 2 placement { devices: "0" devices: "1" })",
            kExhausted,
            {},
            {0, 1},
            {{0, kHoldsShard}, {1, kCapacity}}},
        PlaceCase{"ShardExcludedReported",
                  FourUsed({0, 15, 0, 0}),
                  "size_bytes: " + G(4) +
                      R"( shard_count: 2 placement { devices: "0" devices: "1"
                                                     devices: "2" exclude: "2" })",
                  kExhausted,
                  {},
                  {0, 1},
                  {{0, kHoldsShard}, {1, kCapacity}, {2, kExcluded}}},
        PlaceCase{"CarverErrorReleasesShards",
                  WithBroken(1),
                  "size_bytes: " + G(3) + " shard_count: 3",
                  absl::StatusCode::kInternal,
                  {},
                  {0, 1},
                  {},
                  {"device is broken"}},
        PlaceCase{
            "ShardCountAboveAllowedDevices",
            FourUsed({0, 0, 0, 0}),
            "size_bytes: " + G(3) +
                R"( shard_count: 3 placement { devices: "0" devices: "1" })",
            kInvalid,
            {},
            kNone,
            {},
            {"3 shards need 3 distinct devices; the placement allows 2"}},
        PlaceCase{"ShardCountAboveDevicesAfterExclude",
                  FourUsed({0, 0, 0, 0}),
                  "size_bytes: " + G(4) +
                      R"( shard_count: 4 placement { exclude: "3" })",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"the placement allows 3"}},
        PlaceCase{"ExplicitShardsAboveDevices",
                  FourUsed({0, 0, 0, 0}),
                  "shard_sizes: [1, 1, 1, 1, 1]",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"5 shards need 5 distinct devices; the placement allows 4"}},
        PlaceCase{"ConflictingShardForms",
                  FourUsed({0, 0, 0, 0}),
                  "shard_count: 2 shard_sizes: [1, 1, 1]",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"shard_count 2 disagrees with the 3 entries"}},
        PlaceCase{"ZeroShard",
                  FourUsed({0, 0, 0, 0}),
                  "shard_sizes: [1, 0]",
                  kInvalid,
                  {},
                  kNone,
                  {},
                  {"shard_sizes[1] is 0"}}),
    [](const ::testing::TestParamInfo<PlaceCase>& info) {
      return info.param.name;
    });

// A sharded failure after several shards were carved: the fake's whole state
// (live blocks, charges) is compared with a copy taken before, and a second
// request that fits still gets the space the failed one held.
TEST(PlacerAllOrNothingTest, PoolIsExactlyAsBefore) {
  FakeCarver carver(FourUsed({1, 3, 5, 15}));
  const std::vector<FakeCarver::Device> before = carver.devices();
  Placer placer(&carver);
  AllocateRequest request;
  request.set_size_bytes(16 * kGiB);
  request.set_shard_count(4);  // 4 GiB each; device 3 has 1 GiB free

  PlacementResult result = placer.Allocate(request, carver.Snapshot(Pairs));
  ASSERT_EQ(result.status.code(), absl::StatusCode::kResourceExhausted)
      << result.status;
  EXPECT_EQ(carver.releases(), 3);
  EXPECT_TRUE(carver.devices() == before);

  request.set_shard_count(3);
  request.set_size_bytes(12 * kGiB);
  result = placer.Allocate(request, carver.Snapshot(Pairs));
  ASSERT_TRUE(result.ok()) << result.status;
  ASSERT_EQ(result.blocks.size(), 3u);
  EXPECT_EQ(result.blocks[0].device, 0u);
  EXPECT_EQ(result.blocks[1].device, 1u);
  EXPECT_EQ(result.blocks[2].device, 2u);
}

TEST(PlacerTest, EqualSplitSizesAndAlignment) {
  FakeCarver carver(FourUsed({0, 0, 0, 0}));
  Placer placer(&carver, PlacerOptions{4096});
  AllocateRequest request;
  request.set_size_bytes(10 * kGiB + 3);
  request.set_shard_count(3);
  PlacementResult result = placer.Allocate(request, carver.Snapshot());
  ASSERT_TRUE(result.ok()) << result.status;
  ASSERT_EQ(result.blocks.size(), 3u);
  const uint64_t base = (10 * kGiB + 3) / 3;
  EXPECT_EQ(result.blocks[0].size_bytes, base);
  EXPECT_EQ(result.blocks[1].size_bytes, base);
  EXPECT_EQ(result.blocks[2].size_bytes, base + (10 * kGiB + 3) % 3);

  // Blocks carved after an odd-sized one honour the default alignment.
  request.Clear();
  request.set_size_bytes(100);
  request.mutable_placement()->add_devices("0");
  result = placer.Allocate(request, carver.Snapshot());
  ASSERT_TRUE(result.ok()) << result.status;
  EXPECT_EQ(result.blocks[0].offset % 4096, 0u);
  EXPECT_GT(result.blocks[0].offset, 0u);
}

TEST(PlacerTest, NoDevicesAtAll) {
  FakeCarver carver({});
  Placer placer(&carver);
  AllocateRequest request;
  request.set_size_bytes(1);
  PlacementResult result = placer.Allocate(request, carver.Snapshot());
  EXPECT_EQ(result.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(result.status.message(), "cannot place 1 B: no device to try");
}

}  // namespace
}  // namespace placement
}  // namespace gpumem
