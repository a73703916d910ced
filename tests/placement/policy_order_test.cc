// Ordering of devices within stages by policy
// (server/placement/policy_order.h).
#include "server/placement/policy_order.h"

#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/placement/fake_carver.h"

namespace gpumem {
namespace placement {
namespace {

using ::gpumem::v1::PlacementRequest;
using ::testing::ElementsAreArray;
using testing::kGiB;
using testing::Pairs;

// Free and used bytes per device, in GiB; total is their sum.
DeviceSnapshot Loads(const std::vector<std::pair<int, int>>& used_free) {
  DeviceSnapshot snapshot;
  for (uint32_t i = 0; i < used_free.size(); ++i) {
    DeviceView d;
    d.index = i;
    d.used_bytes = used_free[i].first * kGiB;
    d.free_bytes = used_free[i].second * kGiB;
    d.total_bytes = d.used_bytes + d.free_bytes;
    d.largest_free_bytes = d.free_bytes;
    snapshot.devices.push_back(d);
  }
  snapshot.peer = Pairs;
  return snapshot;
}

struct OrderCase {
  std::string name;
  std::vector<std::pair<int, int>> used_free;  // GiB per device
  std::vector<uint32_t> stage;
  PlacementRequest::Policy policy;
  int near;
  std::vector<uint32_t> want;
};

// Shown by gtest instead of the bytes of the case.
void PrintTo(const OrderCase& c, std::ostream* os) {
  *os << "\"" << c.name << "\"";
}

class OrderStageTest : public ::testing::TestWithParam<OrderCase> {};

TEST_P(OrderStageTest, Orders) {
  const OrderCase& c = GetParam();
  std::optional<uint32_t> near;
  if (c.near >= 0) near = c.near;
  EXPECT_THAT(OrderStage(c.stage, c.policy, near, Loads(c.used_free)),
              ElementsAreArray(c.want));
}

INSTANTIATE_TEST_SUITE_P(
    Table, OrderStageTest,
    ::testing::Values(OrderCase{"LeastLoadedMostFreeFirst",
                                {{4, 4}, {1, 7}, {6, 2}, {0, 8}},
                                {0, 1, 2, 3},
                                PlacementRequest::POLICY_LEAST_LOADED,
                                -1,
                                {3, 1, 0, 2}},
                      OrderCase{"UnspecifiedIsLeastLoaded",
                                {{4, 4}, {1, 7}, {6, 2}, {0, 8}},
                                {0, 1, 2, 3},
                                PlacementRequest::POLICY_UNSPECIFIED,
                                -1,
                                {3, 1, 0, 2}},
                      OrderCase{"LeastLoadedTieLowerIndex",
                                {{2, 6}, {2, 6}, {0, 8}, {2, 6}},
                                {3, 1, 0, 2},
                                PlacementRequest::POLICY_LEAST_LOADED,
                                -1,
                                {2, 0, 1, 3}},
                      // Free, not used, decides: device 1 is bigger.
                      OrderCase{"LeastLoadedByFreeBytes",
                                {{2, 6}, {4, 20}},
                                {0, 1},
                                PlacementRequest::POLICY_LEAST_LOADED,
                                -1,
                                {1, 0}},
                      OrderCase{"PackMostUsedFirst",
                                {{4, 4}, {1, 7}, {6, 2}, {0, 8}},
                                {0, 1, 2, 3},
                                PlacementRequest::POLICY_PACK,
                                -1,
                                {2, 0, 1, 3}},
                      OrderCase{"PackTieLowerIndex",
                                {{3, 5}, {5, 3}, {3, 5}, {5, 3}},
                                {0, 1, 2, 3},
                                PlacementRequest::POLICY_PACK,
                                -1,
                                {1, 3, 0, 2}},
                      OrderCase{"NearSelfThenNvLinkThenHost",
                                {{0, 8}, {0, 8}, {0, 8}, {0, 8}},
                                {0, 1, 2, 3},
                                PlacementRequest::POLICY_NEAR,
                                2,
                                {2, 3, 0, 1}},
                      OrderCase{"NearNvLinkBeatsFreerHost",
                                {{0, 8}, {6, 2}, {0, 16}, {0, 16}},
                                {1, 2, 3},
                                PlacementRequest::POLICY_NEAR,
                                0,
                                {1, 2, 3}},
                      OrderCase{"NearTiesLeastLoaded",
                                {{0, 8}, {6, 2}, {0, 4}, {0, 16}},
                                {2, 3},
                                PlacementRequest::POLICY_NEAR,
                                0,
                                {3, 2}},
                      OrderCase{"NearDeviceOutsideStage",
                                {{0, 8}, {0, 1}, {0, 8}, {0, 9}},
                                {3, 2, 1},
                                PlacementRequest::POLICY_NEAR,
                                0,
                                {1, 3, 2}},
                      OrderCase{"SubsetOnly",
                                {{4, 4}, {1, 7}, {6, 2}, {0, 8}},
                                {2, 0},
                                PlacementRequest::POLICY_LEAST_LOADED,
                                -1,
                                {0, 2}}),
    [](const ::testing::TestParamInfo<OrderCase>& info) {
      return info.param.name;
    });

TEST(OrderStageTest, NearWithoutPeerMatrixIsHostForOthers) {
  DeviceSnapshot snapshot = Loads({{0, 8}, {0, 2}, {0, 9}});
  snapshot.peer = nullptr;
  EXPECT_THAT(OrderStage({0, 1, 2}, PlacementRequest::POLICY_NEAR, 1, snapshot),
              ElementsAreArray({1u, 2u, 0u}));
}

TEST(OrderStageTest, NearPutsPcieBetweenNvLinkAndHost) {
  // From device 0: 1 over NVLink, 2 direct over PCIe, 3 through the host;
  // the freer devices come later when they are farther.
  DeviceSnapshot snapshot = Loads({{0, 8}, {6, 1}, {2, 5}, {0, 9}});
  snapshot.peer = [](uint32_t a, uint32_t b) {
    if (a == b) return PeerDistance::kSelf;
    const uint32_t other = a == 0 ? b : a;
    return other == 1 ? PeerDistance::kNvLink
                      : other == 2 ? PeerDistance::kPcie : PeerDistance::kHost;
  };
  EXPECT_THAT(OrderStage({3, 2, 1, 0}, PlacementRequest::POLICY_NEAR, 0, snapshot),
              ElementsAreArray({0u, 1u, 2u, 3u}));
}

TEST(CandidateOrderTest, StagesKeepTheirOrder) {
  ResolvedPlacement placement;
  placement.stages = {{0, 1}, {}, {2, 3}};
  placement.policy = PlacementRequest::POLICY_LEAST_LOADED;
  // Device 3 has the most room but is in the last stage.
  DeviceSnapshot snapshot = Loads({{4, 4}, {1, 7}, {6, 2}, {0, 80}});
  EXPECT_THAT(CandidateOrder(placement, snapshot),
              ElementsAreArray({1u, 0u, 3u, 2u}));
}

TEST(CandidateOrderTest, NoDeviceTwice) {
  ResolvedPlacement placement;
  placement.stages = {{0, 1}, {1, 2}};  // hand-built, not disjoint
  DeviceSnapshot snapshot = Loads({{0, 1}, {0, 2}, {0, 3}});
  EXPECT_THAT(CandidateOrder(placement, snapshot),
              ElementsAreArray({1u, 0u, 2u}));
}

}  // namespace
}  // namespace placement
}  // namespace gpumem
