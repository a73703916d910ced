// FakeKubelet: the kubelet's side of a DRA driver, for tests: a gRPC client
// of the plugin's registration socket (GetInfo, NotifyRegistrationStatus)
// and of its node service (DRAPlugin v1 or v1beta1) on the endpoint
// GetInfo named, with the kubelet's own deadline on every call.
#ifndef GPUMEMD_TESTS_DRA_FAKE_KUBELET_H_
#define GPUMEMD_TESTS_DRA_FAKE_KUBELET_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/dra/claim.h"
#include "proto/k8s/dra/v1/api.grpc.pb.h"
#include "proto/k8s/dra/v1beta1/api.grpc.pb.h"
#include "proto/k8s/pluginregistration/v1/api.grpc.pb.h"

namespace gpumem {
namespace dra {
namespace testing {

namespace drapb = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drapb_beta = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

class FakeKubelet {
 public:
  // The kubelet's call timeout for DRA plugins (45 s in 1.34); tests use less.
  explicit FakeKubelet(absl::Duration call_timeout = absl::Seconds(45))
      : timeout_(call_timeout) {}

  // GetInfo on the registration socket, then NotifyRegistrationStatus(ok).
  absl::StatusOr<pluginregistration::PluginInfo> Register(const std::string& registration_socket,
                                                          bool accept = true);

  absl::StatusOr<drapb::NodePrepareResourcesResponse> Prepare(
      const std::vector<ClaimRef>& claims) const;
  absl::StatusOr<drapb::NodeUnprepareResourcesResponse> Unprepare(
      const std::vector<ClaimRef>& claims) const;
  absl::StatusOr<drapb_beta::NodePrepareResourcesResponse> PrepareV1beta1(
      const std::vector<ClaimRef>& claims) const;

  const std::string& endpoint() const { return endpoint_; }

 private:
  absl::Duration timeout_;
  std::string endpoint_;
};

}  // namespace testing
}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_DRA_FAKE_KUBELET_H_
