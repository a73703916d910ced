// ApiServer: the plugin's HTTP client of the Kubernetes API server (libcurl).
//
// It does what gpumemd-dra needs and no more: GET a JSON object, and write
// one with server-side apply (PATCH, application/apply-patch+yaml, a field
// manager, force), which creates or updates in one idempotent request.
// Every request has a deadline (connect + transfer), so a slow or dead API
// server costs at most that long. Errors are statuses a person can act on:
//   NOT_FOUND (404), PERMISSION_DENIED (401, 403: check the RBAC in
//   deploy/kubernetes/), INVALID_ARGUMENT (400, 422: the server's message),
//   UNAVAILABLE (cannot connect, 429, 5xx), DEADLINE_EXCEEDED (timeout);
// each carries the method, path and, where the server sent a
// metav1.Status, its message.
// The bearer token is read from its file on every request (the kubelet
// rotates projected service-account tokens). Thread-safe: each request uses
// its own curl handle.
#ifndef GPUMEMD_CLIENT_DRA_API_SERVER_H_
#define GPUMEMD_CLIENT_DRA_API_SERVER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gpumem {
namespace dra {

struct ApiServerConfig {
  // "https://10.96.0.1:443"; "http://..." only for tests and local proxies.
  std::string url;
  // When set, connect to this Unix socket instead of url's host (url then
  // only names the scheme and Host header: e.g. `kubectl proxy
  // --unix-socket`, or the tests' fake API server).
  std::string unix_socket;
  // Bearer token file; empty: no Authorization header.
  std::string token_file;
  // CA bundle verifying an https server; empty: the system's.
  std::string ca_file;
  // Whole-request deadline.
  absl::Duration timeout = absl::Seconds(10);
};

// The in-cluster configuration: https://$KUBERNETES_SERVICE_HOST:
// $KUBERNETES_SERVICE_PORT with the pod's service-account token and CA
// (/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}).
// FAILED_PRECONDITION when the variables are not set (not in a pod).
absl::StatusOr<ApiServerConfig> InClusterConfig(
    const std::string& service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

class ApiServer {
 public:
  explicit ApiServer(ApiServerConfig config);

  // GET path (e.g. /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c):
  // the body of a 2xx answer.
  absl::StatusOr<std::string> Get(const std::string& path) const;

  // Server-side apply of `object` (JSON) at path, as field manager
  // `manager`, taking ownership of conflicting fields (force=true).
  absl::Status Apply(const std::string& path, const std::string& object,
                     const std::string& manager) const;

  const ApiServerConfig& config() const { return config_; }

 private:
  absl::StatusOr<std::string> Request(const std::string& method, const std::string& path,
                                      const std::string& content_type,
                                      const std::string& body) const;
  ApiServerConfig config_;
};

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_API_SERVER_H_
