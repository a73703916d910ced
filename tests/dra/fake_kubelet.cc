#include "tests/dra/fake_kubelet.h"

#include <grpcpp/grpcpp.h>

namespace gpumem {
namespace dra {
namespace testing {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::shared_ptr<grpc::Channel> Channel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

template <typename Request>
Request Claims(const std::vector<ClaimRef>& claims) {
  Request req;
  for (const ClaimRef& c : claims) {
    auto* pc = req.add_claims();
    pc->set_namespace_(c.ns);
    pc->set_name(c.name);
    pc->set_uid(c.uid);
  }
  return req;
}

}  // namespace

absl::StatusOr<pluginregistration::PluginInfo> FakeKubelet::Register(const std::string& socket,
                                                                     bool accept) {
  auto stub = pluginregistration::Registration::NewStub(Channel(socket));
  pluginregistration::PluginInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    pluginregistration::InfoRequest req;
    if (absl::Status s = FromGrpc(stub->GetInfo(&ctx, req, &info)); !s.ok()) return s;
  }
  endpoint_ = info.endpoint();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(accept);
  if (!accept) status.set_error("refused by the fake kubelet");
  pluginregistration::RegistrationStatusResponse resp;
  if (absl::Status s = FromGrpc(stub->NotifyRegistrationStatus(&ctx, status, &resp)); !s.ok()) {
    return s;
  }
  return info;
}

absl::StatusOr<drapb::NodePrepareResourcesResponse> FakeKubelet::Prepare(
    const std::vector<ClaimRef>& claims) const {
  auto stub = drapb::DRAPlugin::NewStub(Channel(endpoint_));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  drapb::NodePrepareResourcesResponse resp;
  absl::Status s = FromGrpc(stub->NodePrepareResources(
      &ctx, Claims<drapb::NodePrepareResourcesRequest>(claims), &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<drapb::NodeUnprepareResourcesResponse> FakeKubelet::Unprepare(
    const std::vector<ClaimRef>& claims) const {
  auto stub = drapb::DRAPlugin::NewStub(Channel(endpoint_));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  drapb::NodeUnprepareResourcesResponse resp;
  absl::Status s = FromGrpc(stub->NodeUnprepareResources(
      &ctx, Claims<drapb::NodeUnprepareResourcesRequest>(claims), &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<drapb_beta::NodePrepareResourcesResponse> FakeKubelet::PrepareV1beta1(
    const std::vector<ClaimRef>& claims) const {
  auto stub = drapb_beta::DRAPlugin::NewStub(Channel(endpoint_));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  drapb_beta::NodePrepareResourcesResponse resp;
  absl::Status s = FromGrpc(stub->NodePrepareResources(
      &ctx, Claims<drapb_beta::NodePrepareResourcesRequest>(claims), &resp));
  if (!s.ok()) return s;
  return resp;
}

}  // namespace testing
}  // namespace dra
}  // namespace gpumem
