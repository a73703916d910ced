// Per-method message limits (server/service/message_limits.h) and the
// query workers' budget (query_budget.h), in their tables and against a
// real daemon (//server:gpumemd):
//  - every unary method of gpumem.v1.GpuMemory has its limit, named in the
//    refusal (a method added without one fails here);
//  - a request over its method's limit is RESOURCE_EXHAUSTED naming the
//    method and the limit, unary (Allocate, GetStats, PutTenant, Resume)
//    and on the Stream (which ends with it), and the daemon serves on;
//  - what a well-behaved client sends is never refused for its size: an
//    Allocate naming every one of 16 devices by UUID in every list, a
//    Resume page of 1,000 blocks;
//  - one caller's requests waiting for the query workers stay within its
//    budget, others' are not held up by it, and what is held comes back.
#include "server/service/message_limits.h"
#include "server/service/query_budget.h"

#include <memory>
#include <string>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::DaemonProcess;

void AddJunk(google::protobuf::Message* m, size_t bytes) {
  m->GetReflection()->MutableUnknownFields(m)->AddLengthDelimited(1000, std::string(bytes, 'x'));
}

TEST(MessageLimitsTest, EveryUnaryMethodHasItsLimitNamedInTheRefusal) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("gpumem.v1.GpuMemory");
  ASSERT_NE(service, nullptr);
  google::protobuf::DynamicMessageFactory factory;
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    if (m->client_streaming()) continue;  // Stream: CheckStreamMessageSize
    const size_t limit = RequestLimit(m->input_type()->full_name());
    std::unique_ptr<google::protobuf::Message> req(
        factory.GetPrototype(m->input_type())->New());
    EXPECT_GT(limit, 0u) << m->name();
    EXPECT_LE(limit, m->name() == "Resume" ? size_t{256} << 10 : size_t{64} << 10) << m->name();
    AddJunk(req.get(), limit - 8);
    EXPECT_TRUE(CheckRequestSize(*req).ok()) << m->name();
    AddJunk(req.get(), 16);
    absl::Status over = CheckRequestSize(*req);
    EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << m->name();
    EXPECT_TRUE(absl::StartsWith(over.message(), absl::StrCat(m->name(), " request of ")))
        << m->name() << " has no row of its own: " << over;
  }
  EXPECT_TRUE(CheckStreamMessageSize(1, kAllocateRequestLimit).ok());
  EXPECT_EQ(CheckStreamMessageSize(7, kAllocateRequestLimit + 1).code(),
            absl::StatusCode::kResourceExhausted);
}

class MessageLimitsDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--sim_devices=16x64MiB", "--ledger=none", "--state=none"});
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
    stub_ = v1::GpuMemory::NewStub(grpc::CreateChannel("unix:" + daemon_->socket(),
                                                       grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }
  v1::GetStatsResponse Stats() {
    v1::GetStatsResponse out;
    grpc::Status s = stub_->GetStats(Ctx().get(), v1::GetStatsRequest(), &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }
  static void ExpectOver(const grpc::Status& s, const std::string& words) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), words)) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "KiB")) << s.error_message();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
};

TEST_F(MessageLimitsDaemonTest, OverItsMethodsLimitIsRefusedByName) {
  const v1::GetStatsResponse stats = Stats();
  ASSERT_EQ(stats.devices_size(), 16);
  // Allocate: 2,000 selectors (a placement's checks would refuse them too,
  // but only after parsing and walking them).
  v1::AllocateRequest alloc;
  alloc.set_size_bytes(1 << 20);
  for (int i = 0; i < 2000; ++i) alloc.mutable_placement()->add_devices(stats.devices(0).uuid());
  v1::AllocateResponse alloc_out;
  ExpectOver(stub_->Allocate(Ctx().get(), alloc, &alloc_out), "Allocate request of ");
  // GetStats with 8 KiB of fields it does not have.
  v1::GetStatsRequest get;
  AddJunk(&get, 8 << 10);
  v1::GetStatsResponse get_out;
  ExpectOver(stub_->GetStats(Ctx().get(), get, &get_out), "GetStats request of ");
  // PutTenant with a 100 KB name (root: it would be served otherwise).
  v1::PutTenantRequest put;
  put.set_name(std::string(100 << 10, 'n'));
  v1::PutTenantResponse put_out;
  ExpectOver(stub_->PutTenant(Ctx().get(), put, &put_out), "PutTenant request of ");
  // A Stream message over its limit ends the stream, naming it.
  {
    auto ctx = Ctx();
    std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamReply>> stream =
        stub_->Stream(ctx.get());
    v1::StreamRequest small;
    small.set_request_id(1);
    small.mutable_get_session();
    ASSERT_TRUE(stream->Write(small));
    v1::StreamReply reply;
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.answer().request_id(), 1u);
    v1::StreamRequest big;
    big.set_request_id(2);
    *big.mutable_allocate() = alloc;
    stream->Write(big);
    EXPECT_FALSE(stream->Read(&reply)) << "answered: " << reply.DebugString();
    stream->WritesDone();
    ExpectOver(stream->Finish(), "stream message 2 is ");
  }
  // The daemon serves on.
  EXPECT_EQ(Stats().devices_size(), 16);
}

TEST_F(MessageLimitsDaemonTest, AWellBehavedClientIsNeverRefusedForItsSize) {
  const v1::GetStatsResponse stats = Stats();
  // Every device by UUID in `devices` and in each of 8 fallback sets, one
  // shard size per device: about 7 KiB, served.
  v1::AllocateRequest alloc;
  v1::PlacementRequest* p = alloc.mutable_placement();
  for (const v1::DeviceStats& d : stats.devices()) p->add_devices(d.uuid());
  for (int f = 0; f < 8; ++f) {
    v1::DeviceSet* set = p->add_fallback();
    for (const v1::DeviceStats& d : stats.devices()) set->add_devices(d.uuid());
  }
  for (int i = 0; i < stats.devices_size(); ++i) alloc.add_shard_sizes(1 << 20);
  v1::AllocateResponse out;
  grpc::Status s = stub_->Allocate(Ctx().get(), alloc, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.allocations_size(), 16);
  // A Resume page of 1,000 blocks (what the client library sends at most):
  // not refused for its size; each block it does not have is answered lost.
  v1::ResumeRequest resume;
  for (int i = 0; i < 1000; ++i) {
    v1::Allocation* a = resume.add_allocations();
    a->set_id(1000000 + i);
    a->set_device_uuid(stats.devices(0).uuid());
    a->set_slab_id(77);
    a->set_offset(static_cast<uint64_t>(i) << 20);
    a->set_size_bytes(1 << 20);
    a->set_device_index(0);
    a->set_slab_size_bytes(64 << 20);
    a->set_handle_kind(v1::HANDLE_KIND_MEMFD);
  }
  ASSERT_GT(resume.ByteSizeLong(), size_t{64} << 10) << "a page is larger than any other request";
  v1::ResumeResponse resumed;
  s = stub_->Resume(Ctx().get(), resume, &resumed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resumed.lost_size(), 1000);
  // 5,000 in one call: over Resume's limit.
  for (int i = 1000; i < 5000; ++i) *resume.add_allocations() = resume.allocations(0);
  ExpectOver(stub_->Resume(Ctx().get(), resume, &resumed), "Resume request of ");
}

TEST(QueryBudgetTest, OneCallerWithinItsShareAllWithinTheTotal) {
  QueryBudget budget;
  std::vector<std::shared_ptr<QueryBudget::Hold>> held;
  // 16 pages of 256 KiB from uid 1000 fit; the 17th does not.
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> h = budget.Take(1000, 0, 256 << 10);
    ASSERT_TRUE(h.ok()) << i << ": " << h.status();
    held.push_back(*h);
  }
  absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> over = budget.Take(1000, 0, 256 << 10);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.status().message(), "uid 1000 has 4.00 MiB"))
      << over.status();
  EXPECT_TRUE(absl::StrContains(over.status().message(), "at most 4.00 MiB per caller"));
  // Another uid, and uid 1000 through a tenant socket, are callers of their own.
  EXPECT_TRUE(budget.Take(1001, 0, 256 << 10).ok());
  EXPECT_TRUE(budget.Take(1000, 7, 256 << 10).ok());
  // A tiny request counts 1 KiB.
  {
    absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> tiny = budget.Take(1002, 0, 2);
    ASSERT_TRUE(tiny.ok());
    EXPECT_EQ(budget.held(), (size_t{16} << 18) + 1024);  // 16 x 256 KiB + 1 KiB
  }
  // Given back when the holds go.
  held.clear();
  EXPECT_EQ(budget.held(), 0u);
  EXPECT_TRUE(budget.Take(1000, 0, 256 << 10).ok());
  // All callers together: 64 MiB.
  for (uint32_t uid = 0; uid < 16; ++uid) {
    absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> h = budget.Take(2000 + uid, 0, 4 << 20);
    ASSERT_TRUE(h.ok()) << uid;
    held.push_back(*h);
  }
  absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> full = budget.Take(3000, 0, 2 << 10);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(full.status().message(), "at most 64.00 MiB")) << full.status();
}

}  // namespace
}  // namespace gpumem
