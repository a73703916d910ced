// Parsing of the CLI placement flags (common/placement_set.h).
#include "common/placement_set.h"

#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace {

using ::gpumem::v1::PlacementRequest;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

struct ListCase {
  std::string text;
  std::vector<std::string> want;  // when OK
  std::string error;              // substring, when INVALID_ARGUMENT
};

// Shown by gtest instead of the bytes of the case.
void PrintTo(const ListCase& c, std::ostream* os) {
  *os << "\"" << c.text << "\"";
}

class ParseDeviceListTest : public ::testing::TestWithParam<ListCase> {};

TEST_P(ParseDeviceListTest, Parses) {
  const ListCase& c = GetParam();
  absl::StatusOr<std::vector<std::string>> got = ParseDeviceList(c.text);
  if (c.error.empty()) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(*got, ElementsAreArray(c.want));
  } else {
    ASSERT_FALSE(got.ok()) << "parsed \"" << c.text << "\"";
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseDeviceListTest,
    ::testing::Values(
        ListCase{"0", {"0"}, ""}, ListCase{"0,1", {"0", "1"}, ""},
        ListCase{" 0 , 1 ", {"0", "1"}, ""},
        ListCase{"3,1,3", {"3", "1", "3"}, ""}, ListCase{"all", {"all"}, ""},
        ListCase{"ALL", {"ALL"}, ""},
        ListCase{"GPU-5f1c2b3a-0000-1111-2222-333344445555",
                 {"GPU-5f1c2b3a-0000-1111-2222-333344445555"},
                 ""},
        ListCase{"0,GPU-abc", {"0", "GPU-abc"}, ""},
        ListCase{"gpu-ABC", {"gpu-ABC"}, ""},
        ListCase{"MIG-12ab-34", {"MIG-12ab-34"}, ""},
        ListCase{"4294967295", {"4294967295"}, ""},
        ListCase{"", {}, "empty device list"},
        ListCase{"  ", {}, "empty device list"},
        ListCase{"0,,1", {}, "item 2 is empty"},
        ListCase{"0,", {}, "item 2 is empty"},
        ListCase{",0", {}, "item 1 is empty"},
        ListCase{"x", {}, "\"x\" is not a device selector"},
        ListCase{"0,gpu0", {}, "item 2: \"gpu0\" is not a device selector"},
        ListCase{"-1", {}, "\"-1\" is not a device selector"},
        ListCase{"+1", {}, "\"+1\" is not a device selector"},
        ListCase{"1.5", {}, "\"1.5\" is not a device selector"},
        ListCase{"4294967296", {}, "\"4294967296\" is out of range"},
        ListCase{"GPU-", {}, "nothing after"},
        ListCase{"GPU-xyz", {}, "\"GPU-xyz\" may hold only hex digits"},
        ListCase{"0,GPU-12 34", {}, "item 2"}));

struct PolicyCase {
  std::string text;
  PlacementRequest::Policy want;
  std::string near;
  std::string error;
};

// Shown by gtest instead of the bytes of the case.
void PrintTo(const PolicyCase& c, std::ostream* os) {
  *os << "\"" << c.text << "\"";
}

class ParsePolicyTest : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(ParsePolicyTest, Parses) {
  const PolicyCase& c = GetParam();
  absl::StatusOr<PolicySpec> got = ParsePolicy(c.text);
  if (c.error.empty()) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->policy, c.want);
    EXPECT_EQ(got->near, c.near);
  } else {
    ASSERT_FALSE(got.ok()) << "parsed \"" << c.text << "\"";
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParsePolicyTest,
    ::testing::Values(
        PolicyCase{"", PlacementRequest::POLICY_UNSPECIFIED, "", ""},
        PolicyCase{"least-loaded", PlacementRequest::POLICY_LEAST_LOADED, "",
                   ""},
        PolicyCase{"least_loaded", PlacementRequest::POLICY_LEAST_LOADED, "",
                   ""},
        PolicyCase{"Least-Loaded", PlacementRequest::POLICY_LEAST_LOADED, "",
                   ""},
        PolicyCase{"pack", PlacementRequest::POLICY_PACK, "", ""},
        PolicyCase{"PACK", PlacementRequest::POLICY_PACK, "", ""},
        PolicyCase{"near:0", PlacementRequest::POLICY_NEAR, "0", ""},
        PolicyCase{"NEAR: 2", PlacementRequest::POLICY_NEAR, "2", ""},
        PolicyCase{"near:GPU-5f1c", PlacementRequest::POLICY_NEAR, "GPU-5f1c",
                   ""},
        PolicyCase{"near", {}, "", "needs a device"},
        PolicyCase{"near:", {}, "", "needs a device"},
        PolicyCase{"near:all", {}, "", "not \"all\""},
        PolicyCase{"near:x", {}, "", "\"x\" is not a device selector"},
        PolicyCase{"near:0,1", {}, "", "not a device selector"},
        PolicyCase{"nearest", {}, "", "unknown policy \"nearest\""},
        PolicyCase{"fast", {}, "", "unknown policy \"fast\""}));

TEST(BuildPlacementRequestTest, AllFlags) {
  PlacementFlags flags;
  flags.gpus = "0,1";
  flags.exclude = "2";
  flags.fallback = {"3,GPU-abc", "all"};
  flags.policy = "near:1";
  absl::StatusOr<PlacementRequest> got = BuildPlacementRequest(flags);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->devices(), ElementsAre("0", "1"));
  EXPECT_THAT(got->exclude(), ElementsAre("2"));
  ASSERT_EQ(got->fallback_size(), 2);
  EXPECT_THAT(got->fallback(0).devices(), ElementsAre("3", "GPU-abc"));
  EXPECT_THAT(got->fallback(1).devices(), ElementsAre("all"));
  EXPECT_EQ(got->policy(), PlacementRequest::POLICY_NEAR);
  EXPECT_EQ(got->near(), "1");
}

TEST(BuildPlacementRequestTest, NoFlagsIsTheDefault) {
  absl::StatusOr<PlacementRequest> got = BuildPlacementRequest({});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->SerializeAsString(), PlacementRequest().SerializeAsString());
}

TEST(BuildPlacementRequestTest, ErrorsNameTheFlag) {
  struct Case {
    PlacementFlags flags;
    std::string error;
  };
  std::vector<Case> cases;
  cases.push_back(
      {{"0,,1", "", {}, ""}, "--gpus: device list \"0,,1\": item 2"});
  cases.push_back({{"", "x", {}, ""}, "--exclude: "});
  cases.push_back({{"", "", {"0", "1,y"}, ""}, "--fallback[1]: "});
  cases.push_back(
      {{"", "", {"0", ""}, ""}, "--fallback[1]: empty device list"});
  cases.push_back({{"", "", {}, "spread"}, "--policy: unknown policy"});
  for (const Case& c : cases) {
    absl::StatusOr<PlacementRequest> got = BuildPlacementRequest(c.flags);
    ASSERT_FALSE(got.ok()) << c.error;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.error));
  }
}

}  // namespace
}  // namespace gpumem
