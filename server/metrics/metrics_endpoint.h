// MetricsEndpoint: the opt-in Prometheus pull endpoint (--metrics_listen):
// GET /metrics in Prometheus' text format, each scrape collecting the
// registered collectables at that moment.
//
// Invariants: one thread serves every connection from one epoll loop and
// never waits on a client, so slow clients cannot hold it: a connection
// gets request_timeout_ms from its accept to send its request and take the
// answer, then it is closed; at most max_connections are open, and one more
// closes the oldest; a request is at most 8 KiB. It never throws;
// destroying the endpoint stops serving before the collectables go. Plain
// HTTP without authentication: bind it to loopback or a monitoring network
// only (the figures include per-uid usage).
#ifndef GPUMEMD_SERVER_METRICS_METRICS_ENDPOINT_H_
#define GPUMEMD_SERVER_METRICS_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/collectable.h>

#include "absl/status/statusor.h"

namespace gpumem {

class MetricsEndpoint {
 public:
  struct Options {
    int max_connections = 64;       // open at once; one more closes the oldest
    int request_timeout_ms = 5000;  // from accept to the answer taken
  };
  // Listens on `address` ("127.0.0.1:9464", "[::1]:9464"; numeric; port 0
  // picks a free port) or returns FAILED_PRECONDITION saying why (address
  // in use, not an address), INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables, Options options);
  // Stops serving (its thread joined, every connection closed).
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The TCP port actually listened on.
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  void Serve();
  // The text of a scrape: every collectable, collected now.
  std::string Scrape() const;

  // Constant after Start.
  Options options_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd: the destructor's word to Serve
  int port_ = 0;
  std::thread thread_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_METRICS_METRICS_ENDPOINT_H_
