// The plugin's gRPC services for the kubelet, on two Unix sockets:
//   - Registration (pluginregistration v1) on the registration socket in the
//     kubelet's plugins_registry directory: GetInfo names the driver, the
//     DRA socket and the node services served there; the kubelet's verdict
//     comes back through NotifyRegistrationStatus (logged).
//   - DRAPlugin v1 and v1beta1 (the kubelet of 1.34 prefers v1, older ones
//     speak v1beta1; both carry the same messages) on the DRA socket.
// NodePrepareResources / NodeUnprepareResources answer every claim of the
// request, each with its own error where it fails (the RPC itself only
// fails for a request that is not one); claims are handled concurrently so
// one slow claim does not hold up the others.
#ifndef GPUMEMD_CLIENT_DRA_KUBELET_SERVICE_H_
#define GPUMEMD_CLIENT_DRA_KUBELET_SERVICE_H_

#include <atomic>
#include <string>
#include <vector>

#include "client/dra/claim_preparer.h"
#include "proto/k8s/dra/v1/api.grpc.pb.h"
#include "proto/k8s/dra/v1beta1/api.grpc.pb.h"
#include "proto/k8s/pluginregistration/v1/api.grpc.pb.h"

namespace gpumem {
namespace dra {

// The services listed in PluginInfo.supported_versions, most preferred
// first ("<version>.<service>", as the kubelet's DRA manager expects).
const std::vector<std::string>& SupportedDraServices();

class RegistrationService final : public pluginregistration::Registration::Service {
 public:
  RegistrationService(std::string driver, std::string endpoint)
      : driver_(std::move(driver)), endpoint_(std::move(endpoint)) {}

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override;
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* status,
                                        pluginregistration::RegistrationStatusResponse*) override;

  // What the kubelet said last (false until it said so).
  bool registered() const { return registered_.load(); }

 private:
  const std::string driver_, endpoint_;
  std::atomic<bool> registered_{false};
};

class DraServiceV1 final : public k8s::io::kubelet::pkg::apis::dra::v1::DRAPlugin::Service {
 public:
  explicit DraServiceV1(ClaimPreparer* preparer) : preparer_(preparer) {}
  grpc::Status NodePrepareResources(
      grpc::ServerContext*, const k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesRequest*,
      k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse*) override;
  grpc::Status NodeUnprepareResources(
      grpc::ServerContext*,
      const k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesRequest*,
      k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse*) override;

 private:
  ClaimPreparer* const preparer_;
};

class DraServiceV1beta1 final
    : public k8s::io::kubelet::pkg::apis::dra::v1beta1::DRAPlugin::Service {
 public:
  explicit DraServiceV1beta1(ClaimPreparer* preparer) : preparer_(preparer) {}
  grpc::Status NodePrepareResources(
      grpc::ServerContext*,
      const k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesRequest*,
      k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesResponse*) override;
  grpc::Status NodeUnprepareResources(
      grpc::ServerContext*,
      const k8s::io::kubelet::pkg::apis::dra::v1beta1::NodeUnprepareResourcesRequest*,
      k8s::io::kubelet::pkg::apis::dra::v1beta1::NodeUnprepareResourcesResponse*) override;

 private:
  ClaimPreparer* const preparer_;
};

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_KUBELET_SERVICE_H_
