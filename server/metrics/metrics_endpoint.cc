// See metrics_endpoint.h. Level-triggered epoll over non-blocking sockets:
// a connection reads until its request's blank line, then writes its whole
// answer and is closed (Connection: close); the loop wakes for the nearest
// deadline too.
#include "server/metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <utility>

#include <prometheus/text_serializer.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gpumem {
namespace {

constexpr size_t kMaxRequest = 8192;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Answer(absl::string_view status, absl::string_view type, absl::string_view body,
                   absl::string_view extra = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra,
                      "Connection: close\r\n\r\n", body);
}

struct Conn {
  uint64_t order = 0;    // accept order: the smallest is the oldest
  int64_t deadline = 0;  // steady ms
  std::string in;
  std::string out;
  size_t sent = 0;
  bool answering = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  return Start(address, std::move(collectables), Options());
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables, Options options) {
  if (options.max_connections < 2 || options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics endpoint: ", options.max_connections, " connection(s) and a request timeout "
        "of ", options.request_timeout_ms, " ms; at least 2 connections and 1 ms are needed"));
  }
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen=\"", address, "\" is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", gai_strerror(gai),
        " (give a numeric HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464)"));
  }
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->options_ = options;
  e->collectables_ = std::move(collectables);
  e->listen_fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (e->listen_fd_ >= 0) setsockopt(e->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = e->listen_fd_ >= 0 &&
                     bind(e->listen_fd_, found->ai_addr, found->ai_addrlen) == 0 &&
                     listen(e->listen_fd_, 128) == 0;
  const int err = errno;
  freeaddrinfo(found);
  if (!bound) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", strerror(err),
        " (address in use, or not this machine's?)"));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(e->listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  e->port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  e->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  e->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (e->epoll_fd_ < 0 || e->stop_fd_ < 0) {
    return absl::InternalError(absl::StrCat("metrics endpoint: ", strerror(errno)));
  }
  for (int fd : {e->listen_fd_, e->stop_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(e->epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  e->thread_ = std::thread([endpoint = e.get()] { endpoint->Serve(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int fd : {listen_fd_, epoll_fd_, stop_fd_}) {
    if (fd >= 0) close(fd);
  }
}

std::string MetricsEndpoint::Scrape() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : collectables_) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void MetricsEndpoint::Serve() {
  std::map<int, Conn> conns;
  uint64_t accepted = 0;
  auto drop = [&](int fd) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    conns.erase(fd);
  };
  auto watch = [&](int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  };
  // Writes what it can; true once the whole answer is out.
  auto send_some = [&](int fd, Conn& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n = send(fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? false : true;
    }
    return true;
  };
  auto answer = [&](int fd, Conn& c, std::string out) {
    c.out = std::move(out);
    c.answering = true;
    if (send_some(fd, c)) {
      drop(fd);
    } else {
      watch(fd, EPOLLOUT);
    }
  };
  // A whole request in c.in: what it asks for.
  auto respond = [&](int fd, Conn& c) {
    const absl::string_view line = absl::string_view(c.in).substr(0, c.in.find("\r\n"));
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
      return answer(fd, c, Answer("400 Bad Request", "text/plain", "bad request\n"));
    }
    if (parts[0] != "GET") {
      return answer(fd, c, Answer("405 Method Not Allowed", "text/plain", "GET only\n",
                                  "Allow: GET\r\n"));
    }
    absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (path != "/metrics") {
      return answer(fd, c, Answer("404 Not Found", "text/plain", "metrics are at /metrics\n"));
    }
    answer(fd, c, Answer("200 OK", "text/plain; version=0.0.4; charset=utf-8", Scrape()));
  };

  std::vector<epoll_event> events(64);
  for (;;) {
    int64_t now = NowMs();
    int timeout = -1;
    for (const auto& [fd, c] : conns) {
      const int64_t left = std::max<int64_t>(0, c.deadline - now);
      if (timeout < 0 || left < timeout) timeout = static_cast<int>(left);
    }
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) return;
    now = NowMs();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_fd_) {
        while (!conns.empty()) drop(conns.begin()->first);
        return;
      }
      if (fd == listen_fd_) {
        for (;;) {
          const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;  // EAGAIN, or out of fds: the next wake tries again
          if (static_cast<int>(conns.size()) >= options_.max_connections) {
            int oldest = conns.begin()->first;
            for (const auto& [ofd, oc] : conns) {
              if (oc.order < conns[oldest].order) oldest = ofd;
            }
            drop(oldest);
          }
          Conn& conn = conns[c];
          conn.order = accepted++;
          conn.deadline = now + options_.request_timeout_ms;
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.fd = c;
          epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev);
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;  // dropped earlier in this round
      Conn& c = it->second;
      if (c.answering) {
        if ((events[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0 && send_some(fd, c)) {
          drop(fd);
        }
        continue;
      }
      char buf[4096];
      bool gone = false;
      for (;;) {
        const ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r > 0) {
          c.in.append(buf, static_cast<size_t>(r));
          if (c.in.size() > kMaxRequest) break;
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        gone = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        break;
      }
      if (c.in.find("\r\n\r\n") != std::string::npos) {
        respond(fd, c);
      } else if (c.in.size() > kMaxRequest) {
        answer(fd, c, Answer("431 Request Header Fields Too Large", "text/plain",
                             "a request is at most 8 KiB\n"));
      } else if (gone) {
        drop(fd);
      }
    }
    // Whoever has not sent its request, or taken its answer, in time.
    std::vector<int> late;
    for (const auto& [fd, c] : conns) {
      if (c.deadline <= now) late.push_back(fd);
    }
    for (int fd : late) drop(fd);
  }
}

}  // namespace gpumem
