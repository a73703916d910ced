// v1 and v1beta1 differ only in their package: one template serves both.
#include "client/dra/kubelet_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "client/dra/log.h"

namespace gpumem {
namespace dra {
namespace {

// Runs fn(i) for i in [0, n) on up to 16 threads; returns when all are done.
template <typename Fn>
void ForEachConcurrently(int n, Fn fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min(n, 16); ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

template <typename Claim>
ClaimRef Ref(const Claim& c) {
  return ClaimRef{c.namespace_(), c.name(), c.uid()};
}

template <typename Request, typename Response>
grpc::Status PrepareAll(ClaimPreparer* preparer, const Request& req, Response* resp) {
  const int n = req.claims_size();
  std::vector<absl::StatusOr<std::vector<PreparedDevice>>> results(
      n, absl::UnknownError("not run"));
  ForEachConcurrently(n, [&](int i) { results[i] = preparer->Prepare(Ref(req.claims(i))); });
  for (int i = 0; i < n; ++i) {
    auto& entry = (*resp->mutable_claims())[req.claims(i).uid()];
    if (!results[i].ok()) {
      entry.set_error(results[i].status().ToString());
      Log("prepare claim ", req.claims(i).namespace_(), "/", req.claims(i).name(), ": ",
          results[i].status().ToString());
      continue;
    }
    const std::string cdi = preparer->CdiDeviceId(req.claims(i).uid());
    for (const PreparedDevice& d : *results[i]) {
      auto* dev = entry.add_devices();
      dev->add_request_names(d.request);
      dev->set_pool_name(d.pool);
      dev->set_device_name(d.device);
      dev->add_cdi_device_ids(cdi);
    }
  }
  return grpc::Status::OK;
}

template <typename Request, typename Response>
grpc::Status UnprepareAll(ClaimPreparer* preparer, const Request& req, Response* resp) {
  const int n = req.claims_size();
  std::vector<absl::Status> results(n);
  ForEachConcurrently(n, [&](int i) { results[i] = preparer->Unprepare(Ref(req.claims(i))); });
  for (int i = 0; i < n; ++i) {
    auto& entry = (*resp->mutable_claims())[req.claims(i).uid()];
    if (!results[i].ok()) {
      entry.set_error(results[i].ToString());
      Log("unprepare claim ", req.claims(i).namespace_(), "/", req.claims(i).name(), ": ",
          results[i].ToString());
    }
  }
  return grpc::Status::OK;
}

}  // namespace

const std::vector<std::string>& SupportedDraServices() {
  static const auto* v = new std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin"};
  return *v;
}

grpc::Status RegistrationService::GetInfo(grpc::ServerContext*,
                                          const pluginregistration::InfoRequest*,
                                          pluginregistration::PluginInfo* info) {
  info->set_type("DRAPlugin");
  info->set_name(driver_);
  info->set_endpoint(endpoint_);
  for (const std::string& s : SupportedDraServices()) info->add_supported_versions(s);
  return grpc::Status::OK;
}

grpc::Status RegistrationService::NotifyRegistrationStatus(
    grpc::ServerContext*, const pluginregistration::RegistrationStatus* status,
    pluginregistration::RegistrationStatusResponse*) {
  registered_ = status->plugin_registered();
  if (status->plugin_registered()) {
    Log("registered with the kubelet as DRA driver ", driver_);
  } else {
    Log("the kubelet refused the registration of ", driver_, ": ", status->error());
  }
  return grpc::Status::OK;
}

#define GPUMEMD_DRA_SERVICE(Class, ns)                                                      \
  grpc::Status Class::NodePrepareResources(grpc::ServerContext*,                            \
                                           const ns::NodePrepareResourcesRequest* req,      \
                                           ns::NodePrepareResourcesResponse* resp) {        \
    return PrepareAll(preparer_, *req, resp);                                               \
  }                                                                                         \
  grpc::Status Class::NodeUnprepareResources(grpc::ServerContext*,                          \
                                             const ns::NodeUnprepareResourcesRequest* req,  \
                                             ns::NodeUnprepareResourcesResponse* resp) {    \
    return UnprepareAll(preparer_, *req, resp);                                             \
  }

GPUMEMD_DRA_SERVICE(DraServiceV1, k8s::io::kubelet::pkg::apis::dra::v1)
GPUMEMD_DRA_SERVICE(DraServiceV1beta1, k8s::io::kubelet::pkg::apis::dra::v1beta1)
#undef GPUMEMD_DRA_SERVICE

}  // namespace dra
}  // namespace gpumem
