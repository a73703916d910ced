// DaemonClientTest: a gtest fixture with one gpumemd (DaemonProcess, see
// daemon_fixture.h) and a client connected to it.
#ifndef GPUMEMD_TESTS_INTEGRATION_DAEMON_CLIENT_TEST_H_
#define GPUMEMD_TESTS_INTEGRATION_DAEMON_CLIENT_TEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
using client::Client;
namespace testing {

// Base of the tests against one daemon: SetUp starts it with `daemon_args`
// and connects client_; TearDown drops the client and expects the daemon to
// stop cleanly.
class DaemonClientTest : public ::testing::Test {
 protected:
  explicit DaemonClientTest(std::vector<std::string> daemon_args)
      : daemon_args_(std::move(daemon_args)) {}

  void SetUp() override;
  void TearDown() override;

  // used_bytes of each device, from the daemon's GetStats (empty if it fails).
  std::vector<uint64_t> UsedPerDevice();

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;

 private:
  std::vector<std::string> daemon_args_;
};

}  // namespace testing
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_INTEGRATION_DAEMON_CLIENT_TEST_H_
