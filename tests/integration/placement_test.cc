// Placement through the real daemon: the rules of server/placement/ as a
// client sees them over gRPC, on 4 simulated GPUs of 1 GiB with NVLink
// between 0-1 and 2-3.
#include <set>

#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_client_test.h"

namespace gpumem {
using client::Buffer;
using client::PlacementRefusalOf;
namespace {

using testing::DaemonClientTest;

constexpr uint64_t kMiB = uint64_t{1} << 20;

class PlacementTest : public DaemonClientTest {
 protected:
  PlacementTest()
      : DaemonClientTest({"--sim_devices=4x1GiB", "--slab_size=64MiB",
                          "--sim_topology=nvlink:0-1,2-3"}) {}

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DaemonClientTest::SetUp());
    auto stats = client_->GetStats();
    ASSERT_TRUE(stats.ok());
    for (const auto& d : stats->devices()) uuids_.push_back(d.uuid());
  }

  absl::StatusOr<v1::AllocateResponse> Alloc(uint64_t size, const v1::PlacementRequest& p,
                                             uint32_t shards = 0) {
    v1::AllocateRequest req;
    req.set_size_bytes(size);
    *req.mutable_placement() = p;
    req.set_shard_count(shards);
    return client_->AllocateRaw(req);
  }
  uint32_t DeviceOf(uint64_t size, const v1::PlacementRequest& p) {
    auto r = Alloc(size, p);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->allocations(0).device_index() : 999;
  }
  static v1::PlacementRequest On(std::initializer_list<const char*> devices) {
    v1::PlacementRequest p;
    for (const char* d : devices) p.add_devices(d);
    return p;
  }

  std::vector<std::string> uuids_;
};

TEST_F(PlacementTest, ANamedDeviceGetsTheBlockByIndexOrUuid) {
  EXPECT_EQ(DeviceOf(kMiB, On({"2"})), 2u);
  v1::PlacementRequest by_uuid;
  by_uuid.add_devices(uuids_[3]);
  EXPECT_EQ(DeviceOf(kMiB, by_uuid), 3u);
}

TEST_F(PlacementTest, LeastLoadedWinsByDefaultAndPackFillsTheFullest) {
  ASSERT_TRUE(Alloc(300 * kMiB, On({"0"})).ok());
  ASSERT_TRUE(Alloc(200 * kMiB, On({"1"})).ok());
  ASSERT_TRUE(Alloc(100 * kMiB, On({"2"})).ok());
  EXPECT_EQ(DeviceOf(kMiB, {}), 3u);               // the empty one
  EXPECT_EQ(DeviceOf(kMiB, On({"0", "1", "2"})), 2u);
  v1::PlacementRequest pack = On({"1", "2"});
  pack.set_policy(v1::PlacementRequest::POLICY_PACK);
  EXPECT_EQ(DeviceOf(kMiB, pack), 1u);
}

TEST_F(PlacementTest, NearPrefersTheNvlinkNeighbour) {
  v1::PlacementRequest near = On({"0", "1", "3"});
  near.set_policy(v1::PlacementRequest::POLICY_NEAR);
  near.set_near("2");
  EXPECT_EQ(DeviceOf(kMiB, near), 3u);
  near.set_near("0");
  EXPECT_EQ(DeviceOf(kMiB, near), 0u);  // itself is nearest
}

TEST_F(PlacementTest, AFullPreferredSetFallsBackInOrderAndStrictNeverLeaks) {
  ASSERT_TRUE(Alloc(900 * kMiB, On({"0"})).ok());
  ASSERT_TRUE(Alloc(900 * kMiB, On({"1"})).ok());
  v1::PlacementRequest p = On({"0"});
  p.add_fallback()->add_devices("1");
  p.add_fallback()->add_devices("3");
  p.add_fallback()->add_devices("2");
  EXPECT_EQ(DeviceOf(200 * kMiB, p), 3u);
  // Strict: nothing outside the named sets, even with 2 and 3 nearly empty.
  auto r = Alloc(200 * kMiB, On({"0", "1"}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(UsedPerDevice()[2], 0u);
  // The refusal says per device why, in words and in the error details.
  EXPECT_NE(r.status().message().find("device 0"), absl::string_view::npos);
  EXPECT_NE(r.status().message().find("capacity"), absl::string_view::npos);
  std::optional<v1::PlacementRefusal> refusal = PlacementRefusalOf(r.status());
  ASSERT_TRUE(refusal.has_value());
  ASSERT_EQ(refusal->devices_size(), 2);
  EXPECT_EQ(refusal->devices(0).reason(), v1::DeviceRefusal::REASON_CAPACITY);
  EXPECT_EQ(refusal->devices(1).device_index(), 1u);
}

TEST_F(PlacementTest, ExcludeAppliesToFallbacksAndIsReported) {
  v1::PlacementRequest p = On({"0"});
  p.add_exclude("0");
  p.add_fallback();  // every device, minus the excluded ones
  p.add_exclude(uuids_[1]);
  uint32_t d = DeviceOf(kMiB, p);
  EXPECT_TRUE(d == 2 || d == 3) << d;

  v1::PlacementRequest only_excluded = On({"1"});
  only_excluded.add_exclude("1");
  auto r = Alloc(kMiB, only_excluded);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  auto refusal = PlacementRefusalOf(r.status());
  ASSERT_TRUE(refusal.has_value());
  ASSERT_EQ(refusal->devices_size(), 1);
  EXPECT_EQ(refusal->devices(0).reason(), v1::DeviceRefusal::REASON_EXCLUDED);
}

TEST_F(PlacementTest, UnknownDevicesInAnyFieldAreInvalidArgumentNamingThem) {
  v1::PlacementRequest p;
  p.add_exclude("GPU-00000000-0000-0000-0000-000000000000");
  auto r = Alloc(kMiB, p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("GPU-00000000"), absl::string_view::npos);
  v1::PlacementRequest f;
  f.add_fallback()->add_devices("4");
  r = Alloc(kMiB, f);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("fallback"), absl::string_view::npos);
}

TEST_F(PlacementTest, ShardsLandOnDistinctDevicesAllOrNothing) {
  auto r = Alloc(400 * kMiB, {}, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->allocations_size(), 4);
  std::set<uint32_t> devices;
  for (const auto& a : r->allocations()) {
    devices.insert(a.device_index());
    EXPECT_EQ(a.size_bytes(), 100 * kMiB);
  }
  EXPECT_EQ(devices.size(), 4u);

  ASSERT_TRUE(Alloc(800 * kMiB, On({"3"})).ok());
  const std::vector<uint64_t> before = UsedPerDevice();
  // 4 x 200 MiB: the shard meant for device 3 cannot fit; nothing is kept.
  auto fail = Alloc(800 * kMiB, {}, 4);
  ASSERT_EQ(fail.status().code(), absl::StatusCode::kResourceExhausted) << fail.status();
  EXPECT_EQ(UsedPerDevice(), before);
  auto refusal = PlacementRefusalOf(fail.status());
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->shard_count(), 4u);
}

TEST_F(PlacementTest, TheClientLibraryMapsEveryShard) {
  auto shards = client_->AllocateSharded(8 * kMiB, 2, On({"1", "2"}));
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 2u);
  EXPECT_NE((*shards)[0].device_index(), (*shards)[1].device_index());
  for (Buffer& b : *shards) {
    static_cast<char*>(b.data())[b.size() - 1] = 1;
  }
  shards->clear();
  EXPECT_EQ(UsedPerDevice(), std::vector<uint64_t>(4, 0));
}

}  // namespace
}  // namespace gpumem
