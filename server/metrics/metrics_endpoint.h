// MetricsEndpoint: the opt-in Prometheus pull endpoint (--metrics_listen),
// prometheus-cpp's civetweb Exposer serving GET /metrics.
//
// Guarantees:
//  - Start() either listens on `address` ("127.0.0.1:9464", "[::1]:9464";
//    port 0 picks a free port) or returns FAILED_PRECONDITION saying why
//    (address in use, not an address); it never throws.
//  - Each scrape collects the registered collectables at that moment.
//  - Slow clients cannot hold it: civetweb serves `threads` connections at
//    once (4 by default), and a connection that has not sent a whole request
//    (or does not read the answer) within `request_timeout_ms` (5000) is
//    closed, so three clients that send half a request leave a worker free
//    for the scrape, and each of them is dropped after the timeout.
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
  struct Options {
    int threads = 4;                 // civetweb worker threads (connections served at once)
    int request_timeout_ms = 5000;   // a request not read (or answer not taken) by then: closed
  };
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables, Options options);
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
