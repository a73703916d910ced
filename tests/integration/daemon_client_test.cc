#include "tests/integration/daemon_client_test.h"

namespace gpumem {
namespace testing {

void DaemonClientTest::SetUp() {
  daemon_ = std::make_unique<DaemonProcess>(daemon_args_);
  ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
  auto c = Client::Connect(daemon_->socket());
  ASSERT_TRUE(c.ok()) << c.status();
  client_ = std::move(*c);
}

void DaemonClientTest::TearDown() {
  client_.reset();
  if (daemon_) {
    EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  }
}

std::vector<uint64_t> DaemonClientTest::UsedPerDevice() {
  auto stats = client_->GetStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  std::vector<uint64_t> used;
  if (!stats.ok()) return used;
  for (const auto& d : stats->devices()) used.push_back(d.used_bytes());
  return used;
}

}  // namespace testing
}  // namespace gpumem
