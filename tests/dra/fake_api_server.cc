// One thread accepts; one thread per connection reads one request
// (headers, Content-Length body), answers it with Connection: close and
// closes. Enough HTTP for libcurl, nothing more.
#include "tests/dra/fake_api_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace gpumem {
namespace dra {
namespace testing {
namespace {

constexpr char kClaims[] = "/apis/resource.k8s.io/v1/namespaces/";
constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices/";

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string StatusBody(int code, const std::string& message) {
  return absl::StrCat(R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":")",
                      message, R"(","code":)", code, "}");
}

}  // namespace

FakeApiServer::FakeApiServer(std::string socket_path) : socket_(std::move(socket_path)) { Up(); }

FakeApiServer::~FakeApiServer() {
  Down();
  std::vector<std::thread> workers;
  {
    absl::MutexLock l(&mu_);
    workers.swap(workers_);
  }
  for (std::thread& t : workers) t.join();
}

void FakeApiServer::Up() {
  absl::MutexLock l(&mu_);
  if (!down_) return;
  unlink(socket_.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 64) != 0) {
    std::perror("fake api server: bind/listen");
    close(fd);
    return;
  }
  if (pipe2(wake_, O_CLOEXEC) != 0) std::abort();
  listen_fd_ = fd;
  down_ = false;
  acceptor_ = std::thread([this, fd, wake = wake_[0]] { AcceptLoop(fd, wake); });
}

void FakeApiServer::Down() {
  std::thread acceptor;
  {
    absl::MutexLock l(&mu_);
    if (down_) return;
    down_ = true;
    if (write(wake_[1], "x", 1) != 1) std::abort();
    acceptor.swap(acceptor_);
  }
  acceptor.join();
  absl::MutexLock l(&mu_);
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
  listen_fd_ = -1;
  unlink(socket_.c_str());
}

void FakeApiServer::AcceptLoop(int listen_fd, int wake_fd) {
  for (;;) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return;
    const int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    absl::MutexLock l(&mu_);
    workers_.emplace_back([this, c] { Serve(c); });
  }
}

void FakeApiServer::Serve(int fd) {
  std::string in;
  char buf[8192];
  size_t header_end = std::string::npos;
  size_t want = 0;
  for (;;) {
    if (header_end == std::string::npos) {
      header_end = in.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        for (absl::string_view line : absl::StrSplit(in.substr(0, header_end), "\r\n")) {
          if (absl::StartsWithIgnoreCase(line, "content-length:")) {
            size_t n = 0;
            if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)), &n)) want = n;
          }
        }
      }
    }
    if (header_end != std::string::npos && in.size() >= header_end + 4 + want) break;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      close(fd);
      return;
    }
    in.append(buf, static_cast<size_t>(n));
  }
  Request r;
  r.at = absl::Now();
  std::vector<std::string> lines = absl::StrSplit(in.substr(0, header_end), "\r\n");
  std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
  r.method = first.size() > 0 ? first[0] : "";
  std::string target = first.size() > 1 ? first[1] : "";
  const size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    const std::string key = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (key == "content-type") r.content_type = value;
    if (key == "authorization") r.authorization = value;
  }
  r.body = in.substr(header_end + 4, want);
  Respond(fd, &r);
  close(fd);
}

void FakeApiServer::Respond(int fd, Request* r) {
  absl::Duration delay;
  {
    absl::MutexLock l(&mu_);
    delay = delay_;
  }
  // A slow server: wait, but give up early when taken down.
  const absl::Time until = absl::Now() + delay;
  while (absl::Now() < until) {
    {
      absl::MutexLock l(&mu_);
      if (down_) {
        requests_.push_back(*r);
        return;
      }
    }
    absl::SleepFor(std::min(absl::Milliseconds(10), until - absl::Now()));
  }
  int code = 404;
  std::string body = StatusBody(404, "not found");
  {
    absl::MutexLock l(&mu_);
    if (r->method == "GET" && absl::StartsWith(r->path, kClaims)) {
      // namespaces/NS/resourceclaims/NAME
      std::vector<std::string> parts = absl::StrSplit(r->path.substr(strlen(kClaims)), '/');
      if (parts.size() == 3 && parts[1] == "resourceclaims") {
        auto it = claims_.find(parts[0] + "/" + parts[2]);
        if (it != claims_.end()) {
          code = 200;
          body = it->second;
        } else {
          body = StatusBody(404, absl::StrCat("resourceclaims.resource.k8s.io \\\"", parts[2],
                                              "\\\" not found"));
        }
      }
    } else if (r->method == "PATCH" && absl::StartsWith(r->path, kSlices)) {
      if (fail_writes_ > 0) {
        --fail_writes_;
        code = fail_status_;
        body = StatusBody(code, "the fake API server refuses this write");
      } else {
        code = 200;
        body = r->body;
      }
    }
    r->status = code;
    requests_.push_back(*r);
  }
  WriteAll(fd, absl::StrCat("HTTP/1.1 ", code, code == 200 ? " OK" : " Error",
                            "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                            "\r\nConnection: close\r\n\r\n", body));
}

void FakeApiServer::SetDelay(absl::Duration d) {
  absl::MutexLock l(&mu_);
  delay_ = d;
}

void FakeApiServer::FailNextSliceWrites(int n, int http_status) {
  absl::MutexLock l(&mu_);
  fail_writes_ = n;
  fail_status_ = http_status;
}

void FakeApiServer::SetClaim(const std::string& ns, const std::string& name, std::string body) {
  absl::MutexLock l(&mu_);
  claims_[ns + "/" + name] = std::move(body);
}

void FakeApiServer::RemoveClaim(const std::string& ns, const std::string& name) {
  absl::MutexLock l(&mu_);
  claims_.erase(ns + "/" + name);
}

std::vector<FakeApiServer::Request> FakeApiServer::Requests() const {
  absl::MutexLock l(&mu_);
  return requests_;
}

std::vector<FakeApiServer::Request> FakeApiServer::SliceWrites() const {
  std::vector<Request> out;
  for (Request& r : Requests()) {
    if (r.method == "PATCH" && absl::StartsWith(r.path, kSlices)) out.push_back(std::move(r));
  }
  return out;
}

bool FakeApiServer::WaitFor(const std::function<bool()>& pred, absl::Duration timeout) const {
  const absl::Time until = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

}  // namespace testing
}  // namespace dra
}  // namespace gpumem
