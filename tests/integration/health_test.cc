// The daemon's own grpc.health.v1.Health (server/service/health_service.h):
// Check answers SERVING for "" and gpumem.v1.GpuMemory and NOT_FOUND for
// other names; Watch sends the status and keeps the stream open; watches
// that stay open do not stop the daemon from shutting down cleanly (the
// fixture's TearDown expects exit status 0).
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
  HealthTest() : DaemonClientTest({"--sim_devices=1x1GiB"}) {}

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

TEST_F(HealthTest, WatchSendsTheStatusAndStaysOpen) {
  auto stub = Stub();
  grpc::ClientContext ctx;
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
  ctx.TryCancel();
  EXPECT_FALSE(reader->Read(&resp));
  unknown_ctx.TryCancel();
  EXPECT_FALSE(unknown->Read(&resp));
}

TEST_F(HealthTest, OpenWatchDoesNotHoldUpShutdown) {
  auto stub = Stub();
  grpc::ClientContext ctx;
  auto reader = stub->Watch(&ctx, HealthCheckRequest());
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  EXPECT_FALSE(reader->Read(&resp));  // the daemon ended the stream
  daemon_.reset();
}

}  // namespace
}  // namespace gpumem
