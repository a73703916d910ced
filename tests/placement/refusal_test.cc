// Refusal text and payload (server/placement/refusal.h).
#include "server/placement/refusal.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gpumem {
namespace placement {
namespace {

using ::gpumem::v1::DeviceRefusal;
using ::gpumem::v1::PlacementRefusal;

TEST(RefusalTest, EveryReasonInWords) {
  PlacementRefusal refusal;
  refusal.set_size_bytes(uint64_t{8} << 30);
  auto add = [&](uint32_t index, DeviceRefusal::Reason reason) {
    DeviceRefusal* d = refusal.add_devices();
    d->set_device_index(index);
    d->set_reason(reason);
    d->set_free_bytes(uint64_t{3} << 30);
    d->set_largest_free_bytes(uint64_t{1} << 30);
    return d;
  };
  add(0, DeviceRefusal::REASON_CAPACITY)->set_device_uuid("GPU-aa");
  add(1, DeviceRefusal::REASON_FRAGMENTATION);
  add(2, DeviceRefusal::REASON_QUOTA)->set_detail("tenant ml: 0 B left");
  add(3, DeviceRefusal::REASON_EXCLUDED);
  add(4, DeviceRefusal::REASON_HOLDS_SHARD)->set_shard_index(1);
  EXPECT_EQ(DescribeRefusal(refusal),
            "cannot place 8.00 GiB: device 0 (GPU-aa): capacity, 3.00 GiB "
            "free; device 1: fragmentation, largest free range 1.00 GiB of "
            "3.00 GiB free; device 2: quota (tenant ml: 0 B left); device 3: "
            "excluded; device 4: holds shard 1");
}

TEST(RefusalTest, StatusCarriesTheProto) {
  PlacementRefusal refusal;
  refusal.set_size_bytes(42);
  refusal.add_devices()->set_reason(DeviceRefusal::REASON_CAPACITY);
  absl::Status status = RefusalStatus(refusal);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), DescribeRefusal(refusal));
  std::optional<PlacementRefusal> back = RefusalFromStatus(status);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->SerializeAsString(), refusal.SerializeAsString());
  EXPECT_FALSE(
      RefusalFromStatus(absl::ResourceExhaustedError("x")).has_value());
}

}  // namespace
}  // namespace placement
}  // namespace gpumem
