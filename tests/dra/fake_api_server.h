// FakeApiServer: the Kubernetes API server as gpumemd-dra sees it, for tests:
// plain HTTP/1.1 on a Unix socket (the plugin's --api_server_unix_socket).
//
// It serves ResourceClaims set by the test (GET .../namespaces/NS/
// resourceclaims/NAME; the body is served as given, so a test can serve a
// malformed one), accepts ResourceSlice writes (PATCH .../resourceslices/
// NAME) and records every request with its arrival time. It can be taken
// down (the socket is closed and removed: connections are refused) and
// brought back, made slow (every answer waits), or made to refuse the next
// N slice writes with an HTTP status.
#ifndef GPUMEMD_TESTS_DRA_FAKE_API_SERVER_H_
#define GPUMEMD_TESTS_DRA_FAKE_API_SERVER_H_

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumem {
namespace dra {
namespace testing {

class FakeApiServer {
 public:
  struct Request {
    std::string method, path, query, content_type, authorization, body;
    int status = 0;  // what it was answered
    absl::Time at;
  };

  explicit FakeApiServer(std::string socket_path);
  ~FakeApiServer();

  void Up();    // listen (again)
  void Down();  // stop listening, remove the socket; open connections are cut
  void SetDelay(absl::Duration d);
  void FailNextSliceWrites(int n, int http_status);
  void SetClaim(const std::string& ns, const std::string& name, std::string body);
  void RemoveClaim(const std::string& ns, const std::string& name);

  std::vector<Request> Requests() const;
  // PATCHes of resourceslices, in arrival order (answered or not).
  std::vector<Request> SliceWrites() const;
  // Waits until pred() holds (checked on every request and every 10 ms).
  bool WaitFor(const std::function<bool()>& pred, absl::Duration timeout) const;

  const std::string& socket() const { return socket_; }

 private:
  void AcceptLoop(int listen_fd, int wake_fd);
  void Serve(int fd);
  void Respond(int fd, Request* r);

  const std::string socket_;
  mutable absl::Mutex mu_;
  int listen_fd_ ABSL_GUARDED_BY(mu_) = -1;
  int wake_[2] ABSL_GUARDED_BY(mu_) = {-1, -1};
  std::thread acceptor_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  bool down_ ABSL_GUARDED_BY(mu_) = true;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  int fail_writes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_status_ ABSL_GUARDED_BY(mu_) = 503;
  std::map<std::string, std::string> claims_ ABSL_GUARDED_BY(mu_);
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing
}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_DRA_FAKE_API_SERVER_H_
