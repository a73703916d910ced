// The daemon's own grpc.health.v1.Health (server/service/health_service.h):
// Check answers SERVING for "" and gpumem.v1.GpuMemory and NOT_FOUND for
// other names; Watch sends the status, keeps the stream open and sends the
// change to NOT_SERVING when a drain begins; watches that stay open do not
// stop the daemon from shutting down cleanly (exit status 0).
#include <signal.h>

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_client_test.h"

namespace gpumem {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthTest : public testing::DaemonClientTest {
 protected:
  // A drain waits up to 60 s for live allocations (none in most tests).
  HealthTest() : DaemonClientTest({"--sim_devices=1x1GiB", "--drain_seconds=60"}) {}

  std::unique_ptr<Health::Stub> Stub() {
    return Health::NewStub(grpc::CreateChannel("unix:" + daemon_->socket(),
                                               grpc::InsecureChannelCredentials()));
  }
};

TEST_F(HealthTest, CheckKnowsTheDaemonsServices) {
  auto stub = Stub();
  for (const char* name : {"", "gpumem.v1.GpuMemory"}) {
    grpc::ClientContext ctx;
    HealthCheckRequest req;
    req.set_service(name);
    HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << name << ": " << s.error_message();
    EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING) << name;
  }
  grpc::ClientContext ctx;
  HealthCheckRequest req;
  req.set_service("no.such.Service");
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("no.such.Service"), std::string::npos);
}

TEST_F(HealthTest, WatchSendsTheStatusStaysOpenAndSendsTheChange) {
  auto stub = Stub();
  grpc::ClientContext ctx;
  // A bound on a hang (a change never sent), far beyond the test's length.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  HealthCheckRequest req;
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);

  grpc::ClientContext unknown_ctx;
  req.set_service("no.such.Service");
  auto unknown = stub->Watch(&unknown_ctx, req);
  ASSERT_TRUE(unknown->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVICE_UNKNOWN);

  // The daemon still answers while the watches are open.
  EXPECT_TRUE(client_->GetSession().ok());
  // A live allocation holds the drain open; SIGTERM begins it. The open
  // watch (the same stream: a server that ended it early fails here) is
  // sent NOT_SERVING.
  auto held = client_->Allocate(1 << 20);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(kill(daemon_->pid(), SIGTERM), 0);
  ASSERT_TRUE(reader->Read(&resp)) << "the watch ended instead of sending the change";
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  // Check agrees, while the daemon drains.
  grpc::ClientContext check_ctx;
  HealthCheckRequest whole;
  HealthCheckResponse now;
  ASSERT_TRUE(stub->Check(&check_ctx, whole, &now).ok());
  EXPECT_EQ(now.status(), HealthCheckResponse::NOT_SERVING);

  // A second SIGTERM ends the drain; the daemon stops and ends the streams.
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_FALSE(unknown->Read(&resp));  // unknown's status never changed
  daemon_.reset();
}

TEST_F(HealthTest, OpenWatchDoesNotHoldUpShutdown) {
  auto stub = Stub();
  grpc::ClientContext ctx;
  auto reader = stub->Watch(&ctx, HealthCheckRequest());
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  // The daemon ended the stream, perhaps after sending the change (its
  // drain, with nothing live, is over at once).
  int changes = 0;
  while (reader->Read(&resp)) {
    EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
    ++changes;
  }
  EXPECT_LE(changes, 1);
  daemon_.reset();
}

}  // namespace
}  // namespace gpumem
