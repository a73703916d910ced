// Waiting requests (AllocateRequest.wait_ms) on GpuMemory.Stream against a
// real daemon: served as on the unary Allocate (the stream goes on answering
// its other requests meanwhile), under the same limits and refusals, and a
// stream that ends while a request of it waits frees the waiting place at
// once (one that fails, too). Raw streams, so what is tested is the daemon,
// not the library's routing.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using client::Client;
using testing::DaemonProcess;
using testing::PollUntil;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint32_t kMaxWaitMs = 30000;

class StreamWaitingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    const std::string config = dir_ + "/gpumemd.textproto";
    // This test's tenant may have one request waiting at a time.
    std::ofstream(config) << absl::StrCat("tenant { name: \"me\" uids: ", getuid(),
                                          " max_waiting_requests: 1 }\n");
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--sim_devices=1x64MiB", "--slab_size=64MiB", "--ledger=none",
        absl::StrCat("--max_wait_ms=", kMaxWaitMs), "--config=" + config});
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
    auto c = Client::Connect(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    channel_ = grpc::CreateChannel("unix:" + daemon_->socket(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::GpuMemory::NewStub(channel_);
  }
  void TearDown() override {
    stub_.reset();
    channel_.reset();
    client_.reset();
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
    }
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  uint64_t Waiting() {
    absl::StatusOr<v1::GetStatsResponse> s = client_->GetStats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->counters().waiting_requests() : 0;
  }

  // The whole device, held by the library client (another connection).
  uint64_t TakeWholeDevice() {
    v1::AllocateRequest r;
    r.set_size_bytes(64 * kMiB);
    absl::StatusOr<v1::AllocateResponse> whole = client_->AllocateRaw(r);
    EXPECT_TRUE(whole.ok()) << whole.status();
    return whole.ok() ? whole->allocations(0).id() : 0;
  }

  static v1::StreamRequest WaitingAllocate(uint64_t request_id, uint32_t wait_ms) {
    v1::StreamRequest req;
    req.set_request_id(request_id);
    req.mutable_allocate()->set_size_bytes(64 * kMiB);
    req.mutable_allocate()->set_wait_ms(wait_ms);
    return req;
  }

  // A stream context that cannot hang the test when the daemon never answers.
  static void Bound(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
};

// A stream Allocate with wait_ms waits while the device is full, the stream
// answering its other requests meanwhile (and after the client half-closes),
// and is served once another client frees.
TEST_F(StreamWaitingTest, AWaitingStreamAllocateIsServedWhenAnotherClientFrees) {
  const uint64_t whole = TakeWholeDevice();
  ASSERT_NE(whole, 0u);
  grpc::ClientContext ctx;
  Bound(&ctx);
  auto stream = stub_->Stream(&ctx);
  ASSERT_TRUE(stream->Write(WaitingAllocate(1, kMaxWaitMs)));
  ASSERT_TRUE(PollUntil([&] { return Waiting() == 1; }))
      << "the stream's request never waited: " << daemon_->Log();

  // Not held up by the waiting request: the next one is answered first.
  v1::StreamRequest session;
  session.set_request_id(2);
  session.mutable_get_session();
  ASSERT_TRUE(stream->Write(session));
  v1::StreamReply reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.answer().request_id(), 2u);
  EXPECT_EQ(reply.answer().status().code(), 0) << reply.answer().status().message();
  EXPECT_TRUE(reply.answer().has_session());
  // A half-close ends nothing: the waiting request is still answered.
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_EQ(Waiting(), 1u);

  ASSERT_TRUE(client_->Free(whole).ok());
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.answer().request_id(), 1u);
  ASSERT_EQ(reply.answer().status().code(), 0) << reply.answer().status().message();
  ASSERT_EQ(reply.answer().allocate().allocations_size(), 1);
  EXPECT_EQ(reply.answer().allocate().allocations(0).size_bytes(), 64 * kMiB);
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Waiting(), 0u);

  // Delivered, so kept: it is this connection's to free.
  v1::FreeRequest free;
  free.set_id(reply.answer().allocate().allocations(0).id());
  v1::FreeResponse freed;
  grpc::ClientContext free_ctx;
  EXPECT_TRUE(stub_->Free(&free_ctx, free, &freed).ok());
}

// With the tenant's limit at one waiting request, a stream's waiting request
// holds the place (a unary one is refused by name); cancelling the stream
// frees it at once, long before its wait_ms, for the next waiting request,
// which is then served (the cancelled one took nothing).
TEST_F(StreamWaitingTest, AStreamClosedWhileItsRequestWaitsFreesThePlaceAtOnce) {
  const uint64_t whole = TakeWholeDevice();
  ASSERT_NE(whole, 0u);
  {
    grpc::ClientContext ctx;
    Bound(&ctx);
    auto stream = stub_->Stream(&ctx);
    ASSERT_TRUE(stream->Write(WaitingAllocate(1, kMaxWaitMs)));
    ASSERT_TRUE(PollUntil([&] { return Waiting() == 1; }))
        << "the stream's request never waited: " << daemon_->Log();

    v1::AllocateRequest unary;
    unary.set_size_bytes(64 * kMiB);
    unary.set_wait_ms(kMaxWaitMs);
    v1::AllocateResponse ignored;
    grpc::ClientContext unary_ctx;
    const grpc::Status refused = stub_->Allocate(&unary_ctx, unary, &ignored);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_TRUE(absl::StrContains(refused.error_message(), "max_waiting_requests 1"))
        << refused.error_message();

    const auto cancelled = Clock::now();
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
    // At once: long before its wait_ms; the margin is for a sanitizer build
    // on a loaded machine.
    ASSERT_TRUE(PollUntil([&] { return Waiting() == 0; }, std::chrono::seconds(20)))
        << Waiting() << " waiting 20 s after the stream was cancelled";
    EXPECT_LT(Clock::now() - cancelled, std::chrono::seconds(5));
  }

  // The place is free: the next waiting request of the tenant waits.
  grpc::ClientContext ctx;
  Bound(&ctx);
  auto stream = stub_->Stream(&ctx);
  ASSERT_TRUE(stream->Write(WaitingAllocate(7, kMaxWaitMs)));
  ASSERT_TRUE(PollUntil([&] { return Waiting() == 1; }, std::chrono::seconds(20)))
      << "the next waiting request was not admitted";
  ASSERT_TRUE(client_->Free(whole).ok());
  v1::StreamReply reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.answer().request_id(), 7u);
  EXPECT_EQ(reply.answer().status().code(), 0) << reply.answer().status().message();
  EXPECT_EQ(reply.answer().allocate().allocations_size(), 1);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
  absl::StatusOr<v1::GetStatsResponse> s = client_->GetStats();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices(0).used_bytes(), 64 * kMiB);
  EXPECT_EQ(s->counters().waiting_requests(), 0u);
}

// A stream that fails (a request id reused while its request waits) does
// not wait out its waiting request: that one is answered CANCELLED at once,
// then the stream ends with the fault's INVALID_ARGUMENT.
TEST_F(StreamWaitingTest, AStreamThatFailsCancelsItsWaitingRequests) {
  const uint64_t whole = TakeWholeDevice();
  ASSERT_NE(whole, 0u);
  grpc::ClientContext ctx;
  Bound(&ctx);
  auto stream = stub_->Stream(&ctx);
  ASSERT_TRUE(stream->Write(WaitingAllocate(5, kMaxWaitMs)));
  ASSERT_TRUE(PollUntil([&] { return Waiting() == 1; }))
      << "the stream's request never waited: " << daemon_->Log();
  const auto reused = Clock::now();
  ASSERT_TRUE(stream->Write(WaitingAllocate(5, kMaxWaitMs)));
  v1::StreamReply reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.answer().request_id(), 5u);
  EXPECT_EQ(reply.answer().status().code(), static_cast<int>(grpc::StatusCode::CANCELLED))
      << reply.answer().status().message();
  EXPECT_FALSE(stream->Read(&reply));
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(ended.error_message(), "request id 5 reused"))
      << ended.error_message();
  EXPECT_LT(Clock::now() - reused, std::chrono::seconds(5));
  EXPECT_EQ(Waiting(), 0u);
  ASSERT_TRUE(client_->Free(whole).ok());
}

// wait_ms past --max_wait_ms: the unary Allocate's INVALID_ARGUMENT, word
// for word, at once.
TEST_F(StreamWaitingTest, AWaitPastMaxWaitMsIsTheUnaryRefusal) {
  v1::AllocateRequest request;
  request.set_size_bytes(kMiB);
  request.set_wait_ms(kMaxWaitMs + 1);
  v1::AllocateResponse ignored;
  grpc::ClientContext unary_ctx;
  const grpc::Status unary = stub_->Allocate(&unary_ctx, request, &ignored);
  ASSERT_EQ(unary.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(unary.error_message(),
                                absl::StrCat("exceeds --max_wait_ms=", kMaxWaitMs)))
      << unary.error_message();

  grpc::ClientContext ctx;
  Bound(&ctx);
  auto stream = stub_->Stream(&ctx);
  v1::StreamRequest req;
  req.set_request_id(3);
  *req.mutable_allocate() = request;
  ASSERT_TRUE(stream->Write(req));
  v1::StreamReply reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.answer().request_id(), 3u);
  EXPECT_EQ(reply.answer().status().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(reply.answer().status().message(), unary.error_message());
  EXPECT_EQ(Waiting(), 0u);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace gpumem
