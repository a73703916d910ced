// The one rule that names why an Allocate was refused (GetStats' counters
// and the Prometheus refusal label), and the absl <-> gRPC status
// conversion the refusal travels through.
#include "common/refusal_payload.h"

#include <gtest/gtest.h>

#include "common/grpc_status.h"

namespace gpumem {
namespace {

TEST(RefusalReason, PlacementRefusalsVoteAndOtherCodesAreNamed) {
  v1::PlacementRefusal refusal;
  refusal.add_devices()->set_reason(v1::DeviceRefusal::REASON_EXCLUDED);
  refusal.add_devices()->set_reason(v1::DeviceRefusal::REASON_FRAGMENTATION);
  refusal.add_devices()->set_reason(v1::DeviceRefusal::REASON_FRAGMENTATION);
  refusal.add_devices()->set_reason(v1::DeviceRefusal::REASON_CAPACITY);
  v1::RpcStatus details;
  details.add_details()->PackFrom(refusal);
  // As the client gets it: the refusal in the binary error details.
  grpc::Status refused(grpc::StatusCode::RESOURCE_EXHAUSTED, "no", details.SerializeAsString());
  EXPECT_EQ(RefusalLabel(FromGrpcStatus(refused)), "fragmentation");
  EXPECT_EQ(RefusalReasonOf(FromGrpcStatus(refused)), RefusalReason::kFragmentation);
  EXPECT_EQ(RefusalLabel(absl::UnavailableError("stopping")), "unavailable");
  EXPECT_EQ(RefusalLabel(FromGrpcStatus(
                grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "x", "garbage"))),
            "resource_exhausted");
  // A tie goes to capacity, then fragmentation, then quota.
  v1::PlacementRefusal tie;
  tie.add_devices()->set_reason(v1::DeviceRefusal::REASON_QUOTA);
  tie.add_devices()->set_reason(v1::DeviceRefusal::REASON_CAPACITY);
  details.Clear();
  details.add_details()->PackFrom(tie);
  EXPECT_EQ(RefusalLabel(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no",
                                                     details.SerializeAsString()))),
            "capacity");
}

TEST(GrpcStatus, RefusalSurvivesTheRoundTripAndOtherStatusesKeepCodeAndMessage) {
  v1::PlacementRefusal refusal;
  refusal.set_size_bytes(42);
  refusal.add_devices()->set_reason(v1::DeviceRefusal::REASON_QUOTA);
  absl::Status refused = absl::ResourceExhaustedError("quota");
  refused.SetPayload(kPlacementRefusalTypeUrl, absl::Cord(refusal.SerializeAsString()));
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(refused));
  EXPECT_EQ(back.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(back.message(), "quota");
  ASSERT_TRUE(RefusalFromStatus(back).has_value());
  EXPECT_EQ(RefusalFromStatus(back)->size_bytes(), 42u);
  const absl::Status plain = FromGrpcStatus(ToGrpcStatus(absl::NotFoundError("no such id")));
  EXPECT_EQ(plain, absl::NotFoundError("no such id"));
  EXPECT_TRUE(FromGrpcStatus(ToGrpcStatus(absl::OkStatus())).ok());
  // Details that disagree with the call's own code do not change it.
  v1::RpcStatus lying;
  lying.set_code(0);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::INTERNAL, "x",
                                        lying.SerializeAsString())).code(),
            absl::StatusCode::kInternal);
}

// A Refusal becomes the wire's DeviceRefusal in one place, and its reason
// reads back as the same RefusalReason.
TEST(DeviceRefusalOf, CarriesTheFiguresAndTheReasonReadsBack) {
  Refusal r;
  r.refused = true;
  r.reason = RefusalReason::kFragmentation;
  r.device = 3;
  r.asked_bytes = 100;
  r.free_bytes = 90;
  r.largest_free_bytes = 40;
  r.message = "device 3: fragmentation";
  r.detail = "words";
  const v1::DeviceRefusal d = DeviceRefusalOf(r);
  EXPECT_EQ(d.device_index(), 3u);
  EXPECT_EQ(d.reason(), v1::DeviceRefusal::REASON_FRAGMENTATION);
  EXPECT_EQ(d.free_bytes(), 90u);
  EXPECT_EQ(d.largest_free_bytes(), 40u);
  EXPECT_EQ(d.detail(), "words");
  for (RefusalReason reason :
       {RefusalReason::kCapacity, RefusalReason::kFragmentation, RefusalReason::kQuota}) {
    r.reason = reason;
    v1::PlacementRefusal refusal;
    *refusal.add_devices() = DeviceRefusalOf(r);
    absl::Status status = absl::ResourceExhaustedError("refused");
    status.SetPayload(kPlacementRefusalTypeUrl, absl::Cord(refusal.SerializeAsString()));
    EXPECT_EQ(RefusalReasonOf(status), reason);
  }
}

}  // namespace
}  // namespace gpumem
