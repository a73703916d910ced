// See metrics_endpoint.h. civetweb reports a failed bind by an exception
// from the Exposer's constructor; it is turned into a status here.
#include "server/metrics/metrics_endpoint.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  return Start(address, std::move(collectables), Options());
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables, Options options) {
  if (options.threads < 2 || options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics endpoint: ", options.threads, " thread(s) and a request timeout of ",
        options.request_timeout_ms, " ms; at least 2 threads and 1 ms are needed"));
  }
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen=\"", address, "\" is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->collectables_ = std::move(collectables);
  try {
    // civetweb's own options (the Exposer passes them through): each worker
    // thread serves one connection; request_timeout_ms bounds how long one
    // may take to send its request and read the answer.
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address,
        "num_threads", absl::StrCat(options.threads),
        "request_timeout_ms", absl::StrCat(options.request_timeout_ms)});
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
