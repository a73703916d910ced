// See metrics_endpoint.h. civetweb reports a failed bind by an exception
// from the Exposer's constructor; it is turned into a status here.
#include "server/metrics/metrics_endpoint.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen=\"", address, "\" is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->collectables_ = std::move(collectables);
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", e.what(),
        " (address in use, or not HOST:PORT?)"));
  }
  for (const auto& c : endpoint->collectables_) endpoint->exposer_->RegisterCollectable(c);
  std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? 0 : ports.front();
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() { exposer_.reset(); }

}  // namespace gpumem
