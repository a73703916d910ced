// Selector resolution into stages (server/placement/resolve.h).
#include "server/placement/resolve.h"

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/placement/fake_carver.h"

namespace gpumem {
namespace placement {
namespace {

using ::gpumem::v1::PlacementRequest;
using ::testing::ElementsAreArray;
using testing::FakeUuid;
using ::testing::HasSubstr;

std::vector<DeviceView> FourDevices() {
  std::vector<DeviceView> devices;
  for (uint32_t i = 0; i < 4; ++i) {
    DeviceView d;
    d.index = i;
    d.uuid = FakeUuid(i);
    devices.push_back(d);
  }
  return devices;
}

PlacementRequest Parse(const std::string& text) {
  PlacementRequest request;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &request))
      << text;
  return request;
}

struct ResolveCase {
  std::string name;
  std::string request;  // PlacementRequest, text format
  std::vector<std::vector<uint32_t>> stages;
  std::vector<uint32_t> excluded;
  PlacementRequest::Policy policy = PlacementRequest::POLICY_LEAST_LOADED;
  int near = -1;
  std::string error;  // substring of an INVALID_ARGUMENT message
};

// Shown by gtest instead of the bytes of the case.
void PrintTo(const ResolveCase& c, std::ostream* os) {
  *os << "\"" << c.name << "\"";
}

class ResolveTest : public ::testing::TestWithParam<ResolveCase> {};

TEST_P(ResolveTest, Resolves) {
  const ResolveCase& c = GetParam();
  absl::StatusOr<ResolvedPlacement> got =
      ResolvePlacement(Parse(c.request), FourDevices());
  if (!c.error.empty()) {
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
    return;
  }
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->stages.size(), c.stages.size());
  for (size_t i = 0; i < c.stages.size(); ++i) {
    EXPECT_THAT(got->stages[i], ElementsAreArray(c.stages[i])) << "stage " << i;
  }
  EXPECT_THAT(got->excluded, ElementsAreArray(c.excluded));
  EXPECT_EQ(got->policy, c.policy);
  if (c.near < 0) {
    EXPECT_FALSE(got->near.has_value());
  } else {
    ASSERT_TRUE(got->near.has_value());
    EXPECT_EQ(*got->near, static_cast<uint32_t>(c.near));
  }
}

const std::string kUuid2 = FakeUuid(2);

// `n` selectors of device 0 ("0", "00", "000", ...): distinct strings, so
// only the size check can refuse them before the duplicate check would.
std::string Repeated(const std::string& field, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    text += field + ": \"" + std::string(static_cast<size_t>(i) + 1, '0') + "\" ";
  }
  return text;
}

INSTANTIATE_TEST_SUITE_P(
    Table, ResolveTest,
    ::testing::Values(
        ResolveCase{"EmptyMeansAll", "", {{0, 1, 2, 3}}, {}},
        ResolveCase{"AllLiteral", R"(devices: "ALL")", {{0, 1, 2, 3}}, {}},
        ResolveCase{"Indices", R"(devices: "2" devices: "0")", {{0, 2}}, {}},
        ResolveCase{"DuplicateRefused",
                    R"(devices: "1" devices: "01")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.devices: \"01\" names device 1 again (\"1\" named it)"},
        ResolveCase{"DuplicateByUuidRefused",
                    "exclude: \"2\" exclude: \"" + kUuid2 + "\"",
                    {},
                    {},
                    {},
                    -1,
                    "placement.exclude: \"" + kUuid2 + "\" names device 2 again"},
        ResolveCase{"AllAndAnotherRefused",
                    R"(fallback { devices: "all" devices: "3" })",
                    {},
                    {},
                    {},
                    -1,
                    "placement.fallback[0]: \"3\" names device 3 again (\"all\" named it)"},
        ResolveCase{"SameDeviceInTwoListsIsFine",
                    R"(devices: "1" fallback { devices: "1" devices: "2" })",
                    {{1}, {2}},
                    {}},
        ResolveCase{"Uuid", "devices: \"" + kUuid2 + "\"", {{2}}, {}},
        ResolveCase{"UuidAnyCase",
                    "devices: \"" + absl::AsciiStrToLower(kUuid2) + "\"",
                    {{2}},
                    {}},
        ResolveCase{"FallbacksInOrderAndDisjoint",
                    R"(devices: "0" fallback { devices: "0" devices: "1" }
                       fallback { devices: "3" } fallback {})",
                    {{0}, {1}, {3}, {2}},
                    {}},
        ResolveCase{"ExcludeAppliesToEveryStage",
                    R"(devices: "0" devices: "1" exclude: "1" exclude: "3"
                       fallback { devices: "all" })",
                    {{0}, {2}},
                    {1, 3}},
        ResolveCase{"ExcludeOutsideStagesNotListed",
                    R"(devices: "0" exclude: "2")",
                    {{0}},
                    {}},
        ResolveCase{"ExcludeAll", R"(exclude: "all")", {{}}, {0, 1, 2, 3}},
        ResolveCase{"Pack",
                    R"(policy: POLICY_PACK)",
                    {{0, 1, 2, 3}},
                    {},
                    PlacementRequest::POLICY_PACK},
        ResolveCase{"NearByUuid",
                    "policy: POLICY_NEAR near: \"" + kUuid2 + "\"",
                    {{0, 1, 2, 3}},
                    {},
                    PlacementRequest::POLICY_NEAR,
                    2},
        ResolveCase{"NearMayBeExcluded",
                    R"(policy: POLICY_NEAR near: "1" exclude: "1")",
                    {{0, 2, 3}},
                    {1},
                    PlacementRequest::POLICY_NEAR,
                    1},
        ResolveCase{"UnknownIndexInDevices",
                    R"(devices: "0" devices: "4")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.devices: no device \"4\"; devices are 0..3"},
        ResolveCase{"UnknownUuidInDevices",
                    R"(devices: "GPU-dead")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.devices: no device \"GPU-dead\""},
        ResolveCase{"UnknownInExclude",
                    R"(exclude: "9")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.exclude: no device \"9\""},
        ResolveCase{"UnknownInSecondFallback",
                    R"(fallback { devices: "1" } fallback { devices: "7" })",
                    {},
                    {},
                    {},
                    -1,
                    "placement.fallback[1]: no device \"7\"; devices are 0..3"},
        ResolveCase{"UnknownUuidInFallback",
                    R"(fallback { devices: "GPU-beef" })",
                    {},
                    {},
                    {},
                    -1,
                    "placement.fallback[0]: no device \"GPU-beef\""},
        ResolveCase{"UnknownNear",
                    R"(policy: POLICY_NEAR near: "5")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.near: no device \"5\""},
        ResolveCase{"UnknownNearUuid",
                    R"(policy: POLICY_NEAR near: "GPU-1")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.near: no device \"GPU-1\""},
        ResolveCase{"NearAll",
                    R"(policy: POLICY_NEAR near: "all")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.near: \"all\" names no single device"},
        ResolveCase{"NearMissing",
                    R"(policy: POLICY_NEAR)",
                    {},
                    {},
                    {},
                    -1,
                    "POLICY_NEAR needs"},
        ResolveCase{"NearWithoutPolicy",
                    R"(near: "0")",
                    {},
                    {},
                    {},
                    -1,
                    "the policy is not POLICY_NEAR"},
        ResolveCase{"UnknownPolicy",
                    R"(policy: 42)",
                    {},
                    {},
                    {},
                    -1,
                    "unknown policy 42"},
        ResolveCase{"EmptySelector",
                    R"(devices: "")",
                    {},
                    {},
                    {},
                    -1,
                    "placement.devices: empty device selector"},
        ResolveCase{"HugeIndex",
                    R"(devices: "99999999999999999999")",
                    {},
                    {},
                    {},
                    -1,
                    "no device \"99999999999999999999\""}),
    [](const ::testing::TestParamInfo<ResolveCase>& info) {
      return info.param.name;
    });

// The size limits (resolve.h): with 4 devices a list may hold 16 selectors.
TEST(ResolveLimitsTest, ListsAreCappedByName) {
  EXPECT_EQ(MaxSelectorsPerList(0), 16u);
  EXPECT_EQ(MaxSelectorsPerList(4), 16u);
  EXPECT_EQ(MaxSelectorsPerList(5), 20u);
  struct Case {
    std::string request;
    std::string error;
  };
  const std::vector<Case> cases = {
      {Repeated("devices", 17),
       "placement.devices: 17 selectors, more than the limit of 16 (max(4 x 4 devices, 16))"},
      {Repeated("exclude", 400),
       "placement.exclude: 400 selectors, more than the limit of 16"},
      {"fallback { devices: \"0\" } fallback { " + Repeated("devices", 17) + "}",
       "placement.fallback[1]: 17 selectors, more than the limit of 16"},
      {"devices: \"GPU-" + std::string(61, 'a') + "\"",
       "placement.devices[0]: a selector of 65 bytes, more than the limit of 64 bytes"},
      {"policy: POLICY_NEAR near: \"" + std::string(65, '0') + "\"",
       "placement.near: a selector of 65 bytes, more than the limit of 64 bytes"},
      {std::string("fallback {} fallback {} fallback {} fallback {} fallback {} "
                   "fallback {} fallback {} fallback {} fallback {}"),
       "placement.fallback: 9 fallback sets, more than the limit of 8"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ResolvedPlacement> got = ResolvePlacement(Parse(c.request), FourDevices());
    ASSERT_FALSE(got.ok()) << c.error;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
  }
  // At the limits, the request is resolved (the 16th selector is a
  // duplicate here, so the size check passed and the duplicate check spoke).
  absl::StatusOr<ResolvedPlacement> at =
      ResolvePlacement(Parse(Repeated("devices", 16)), FourDevices());
  EXPECT_THAT(std::string(at.status().message()), HasSubstr("names device 0 again"));
  const std::string longest = "GPU-" + std::string(60, 'a');  // 64 bytes, no such device
  at = ResolvePlacement(Parse("devices: \"" + longest + "\""), FourDevices());
  EXPECT_THAT(std::string(at.status().message()), HasSubstr("no device \"" + longest));
  at = ResolvePlacement(Parse("fallback {} fallback {} fallback {} fallback {} fallback {} "
                              "fallback {} fallback {} fallback { devices: \"1\" }"),
                        FourDevices());
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->stages.size(), 9u);
}

// The caller's view (visible_devices): devices 1 and 3 of four.
PlacementRequest SeenBy13(const std::string& text) {
  PlacementRequest r = Parse(text);
  r.add_visible_devices(absl::AsciiStrToLower(FakeUuid(3)));  // case does not matter
  r.add_visible_devices(FakeUuid(1));
  r.add_visible_devices("GPU-00000000-0000-0000-0000-00000000beef");  // not the daemon's
  return r;
}

TEST(ResolveVisibleTest, EmptyAndAllMeanTheVisibleDevices) {
  for (const std::string& text :
       {std::string(""), std::string(R"(devices: "all")"), std::string(R"(devices: "ALL")")}) {
    absl::StatusOr<ResolvedPlacement> got = ResolvePlacement(SeenBy13(text), FourDevices());
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    ASSERT_EQ(got->stages.size(), 1u);
    EXPECT_THAT(got->stages[0], ElementsAreArray({1u, 3u})) << text;
  }
  absl::StatusOr<ResolvedPlacement> got =
      ResolvePlacement(SeenBy13(R"(devices: "3" fallback {} exclude: "1")"), FourDevices());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->stages.size(), 2u);
  EXPECT_THAT(got->stages[0], ElementsAreArray({3u}));
  EXPECT_TRUE(got->stages[1].empty());  // 1 excluded, 0 and 2 unseen
  EXPECT_THAT(got->excluded, ElementsAreArray({1u}));
  // exclude and near may name a device the caller cannot see.
  got = ResolvePlacement(SeenBy13(R"(exclude: "0" policy: POLICY_NEAR near: "2")"),
                         FourDevices());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->stages[0], ElementsAreArray({1u, 3u}));
  EXPECT_EQ(got->near, 2u);
}

TEST(ResolveVisibleTest, NamingAnUnseenDeviceIsRefusedByName) {
  struct Case {
    std::string request;
    std::string error;
  };
  const std::vector<Case> cases = {
      {R"(devices: "1" devices: "2")",
       "placement.devices: \"2\" is device 2 (" + FakeUuid(2) +
           "), which the calling process cannot see; of gpumemd's devices it sees 1 (" +
           FakeUuid(1) + "), 3 (" + FakeUuid(3) + ")"},
      {"devices: \"" + FakeUuid(0) + "\"", "\" is device 0 ("},
      {R"(devices: "3" fallback { devices: "all" } fallback { devices: "0" })",
       "placement.fallback[1]: \"0\" is device 0"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ResolvedPlacement> got = ResolvePlacement(SeenBy13(c.request), FourDevices());
    ASSERT_FALSE(got.ok()) << c.request;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
  }
  // An unknown selector is still INVALID_ARGUMENT, before the view is read.
  absl::StatusOr<ResolvedPlacement> got =
      ResolvePlacement(SeenBy13(R"(devices: "0" devices: "9")"), FourDevices());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
}

TEST(ResolveVisibleTest, AViewOfNoneOfTheDaemonsDevicesChangesNothing) {
  PlacementRequest r = Parse(R"(devices: "0" devices: "2")");
  r.add_visible_devices("GPU-00000000-0000-0000-0000-00000000beef");
  absl::StatusOr<ResolvedPlacement> got = ResolvePlacement(r, FourDevices());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->stages[0], ElementsAreArray({0u, 2u}));
}

TEST(ResolveVisibleTest, TheViewIsBounded) {
  PlacementRequest r;
  for (int i = 0; i < 257; ++i) r.add_visible_devices(FakeUuid(1));
  absl::StatusOr<ResolvedPlacement> got = ResolvePlacement(r, FourDevices());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("placement.visible_devices: 257 UUIDs, more than the limit of 256"));
  r.Clear();
  r.add_visible_devices(std::string(65, 'G'));
  got = ResolvePlacement(r, FourDevices());
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("placement.visible_devices[0]: 65 bytes, more than the limit of 64"));
}

TEST(ResolveNoDevicesTest, SaysSo) {
  absl::StatusOr<ResolvedPlacement> got =
      ResolvePlacement(Parse(R"(devices: "0")"), {});
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("no device \"0\"; the daemon has no devices"));
}

}  // namespace
}  // namespace placement
}  // namespace gpumem
