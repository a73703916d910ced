// DraPluginFixture: a gpumemd-dra process from the runfiles between its two
// fake peers: a FakeKubelet on its sockets and a FakeApiServer on a Unix
// socket, with a gpumemd behind the GpumemdPeer seam (the double, or the
// real daemon when the test target defines GPUMEMD_DRA_REAL_DAEMON).
//
// A real daemon that does not serve PutTenant (an older one) skips
// the test with a message saying so, unless GPUMEMD_DRA_REQUIRE_TENANT_SOCKETS
// is set in the environment, which makes that a failure.
#ifndef GPUMEMD_TESTS_DRA_PLUGIN_FIXTURE_H_
#define GPUMEMD_TESTS_DRA_PLUGIN_FIXTURE_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/dra/claim.h"
#include "gtest/gtest.h"
#include "tests/dra/fake_api_server.h"
#include "tests/dra/fake_kubelet.h"
#include "tests/dra/gpumemd_peer.h"

namespace gpumem {
namespace dra {
namespace testing {

inline constexpr char kDriver[] = "gpumemd.io";
inline constexpr char kNode[] = "node-a";

// One allocation result of a claim: device (slice name), consumed memory
// ("" for none: a whole-device allocation).
struct Result {
  std::string request;
  std::string device;
  std::string memory;
};

// A resource.k8s.io/v1 ResourceClaim as the API server would return it,
// allocated on this node's pool.
std::string ClaimJson(const ClaimRef& ref, const std::vector<Result>& results,
                      const std::string& pool = kNode);

class DraPluginFixture : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  bool real_daemon() const { return peer_->fake() == nullptr; }
  // Starts (or restarts) the plugin and registers it with the fake kubelet.
  void StartPlugin(const std::vector<std::string>& extra_flags = {});
  // SIGTERM (clean) or SIGKILL; returns the exit status (-signal if killed).
  int StopPlugin(bool kill9 = false);
  std::string PluginLog() const;

  // The slice name of device i as the plugin publishes it.
  std::string DeviceName(uint32_t index) const;
  // A fresh claim served by the fake API server.
  ClaimRef AddClaim(const std::string& name, const std::vector<Result>& results);

  std::string SocketDir(const ClaimRef& c) const;
  std::string CdiSpec(const ClaimRef& c) const;
  // The claim left nothing behind: no tenant in gpumemd, no socket
  // directory, no CDI spec, no record in the state file.
  void ExpectNothingMadeFor(const ClaimRef& c) const;
  nlohmann::json StateFile() const;

  std::string dir_;
  std::unique_ptr<GpumemdPeer> peer_;
  std::unique_ptr<FakeApiServer> api_;
  FakeKubelet kubelet_{absl::Seconds(30)};
  pid_t plugin_ = -1;
  std::string registration_socket_, plugin_dir_, cdi_dir_, state_file_;
  int claim_counter_ = 0;
};

}  // namespace testing
}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_DRA_PLUGIN_FIXTURE_H_
