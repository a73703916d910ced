// MetricsEndpoint: the opt-in Prometheus pull endpoint (--metrics_listen),
// prometheus-cpp's civetweb Exposer serving GET /metrics. Each scrape
// collects the registered collectables at that moment. Invariants: it never
// throws; slow clients cannot hold it (Options); destroying the endpoint
// stops serving before the collectables go. The endpoint is plain HTTP
// without authentication: bind it to loopback or a monitoring network only
// (the figures include per-uid usage).
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
  // civetweb serves `threads` connections at once, and a connection that
  // has not sent a whole request (or does not read the answer) within
  // `request_timeout_ms` is closed, so clients that send half a request
  // leave a worker free for the scrape while there are fewer of them than
  // threads, and each of them is dropped after the timeout.
  struct Options {
    int threads = 4;                 // civetweb worker threads (connections served at once)
    int request_timeout_ms = 5000;   // a request not read (or answer not taken) by then: closed
  };
  // Listens on `address` ("127.0.0.1:9464", "[::1]:9464"; port 0 picks a
  // free port) or returns FAILED_PRECONDITION saying why (address in use,
  // not an address).
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
