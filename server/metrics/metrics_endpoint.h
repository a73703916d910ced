// MetricsEndpoint: the opt-in Prometheus pull endpoint (--metrics_listen),
// prometheus-cpp's civetweb Exposer serving GET /metrics.
//
// Guarantees:
//  - Start() either listens on `address` ("127.0.0.1:9464", "[::1]:9464";
//    port 0 picks a free port) or returns FAILED_PRECONDITION saying why
//    (address in use, not an address); it never throws.
//  - Each scrape collects the registered collectables at that moment.
//  - Destroying the endpoint stops serving before the collectables go.
// The endpoint is plain HTTP without authentication: bind it to loopback or
// a monitoring network only (the figures include per-uid usage).
#ifndef GPUMEMD_SERVER_METRICS_METRICS_ENDPOINT_H_
#define GPUMEMD_SERVER_METRICS_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include "absl/status/statusor.h"

namespace gpumem {

class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~MetricsEndpoint();

  // The TCP port actually listened on.
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_METRICS_ENDPOINT_H_
