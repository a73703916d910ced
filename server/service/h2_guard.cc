// See h2_guard.h.
#include "server/service/h2_guard.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shrink_if_sparse.h"

namespace gpumem {
namespace {

constexpr absl::string_view kCalmReason = "too many stream resets";

// GOAWAY(last_stream, ENHANCE_YOUR_CALM) with a reason a person can read.
std::string CalmGoaway(uint32_t last_stream) {
  const uint32_t length = 8 + kCalmReason.size();
  std::string f;
  f.reserve(kH2FrameHeaderBytes + length);
  auto be32 = [&f](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) f.push_back(static_cast<char>(v >> shift));
  };
  f.push_back(static_cast<char>(length >> 16));
  f.push_back(static_cast<char>(length >> 8));
  f.push_back(static_cast<char>(length));
  f.push_back(static_cast<char>(kH2Goaway));
  f.push_back(0);  // flags
  be32(0);         // stream 0: the connection
  be32(last_stream);
  be32(kH2EnhanceYourCalm);
  f.append(kCalmReason.data(), kCalmReason.size());
  return f;
}

std::string BudgetWords() {
  return absl::StrCat("it may reset ", static_cast<int>(ResetBudget::kBurst),
                      " streams at once and ", static_cast<int>(ResetBudget::kPerSecond),
                      " a second after that");
}

}  // namespace

H2Guard::H2Guard(int epoll_fd, OnEnd on_end, Note note)
    : epoll_fd_(epoll_fd),
      on_end_(std::move(on_end)),
      note_(std::move(note)),
      chunk_(new char[kChunkBytes]) {}

bool H2Guard::Admits(const PeerCred& cred, absl::Time now) {
  if (budget_.Admits(cred, now)) return true;
  const std::string who = ResetBudget::PrincipalName(cred);
  note_(absl::StrCat("resets ", who), "gRPC connection(s) refused",
        absl::StrCat(who, " spent its stream resets (", BudgetWords(),
                     "; HTTP/2 rapid reset): new connections wait until it has a second's worth"),
        now);
  return false;
}

absl::StatusOr<int> H2Guard::Link(int client_fd, const PeerCred& cred) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot make a socket pair for a gRPC connection: ", strerror(errno)));
  }
  auto l = std::make_unique<Linked>();
  l->client_fd = client_fd;
  l->grpc_fd = pair[0];
  l->cred = cred;
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = client_fd;
  const bool added_client = epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, client_fd, &ev) == 0;
  ev.data.fd = pair[0];
  if (!added_client || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pair[0], &ev) != 0) {
    const int err = errno;
    if (added_client) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, client_fd, nullptr);
    close(pair[0]);
    close(pair[1]);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot watch a gRPC connection: ", strerror(err)));
  }
  l->client_interest = l->grpc_interest = EPOLLIN;
  by_fd_[client_fd] = l.get();
  by_fd_[pair[0]] = l.get();
  links_[client_fd] = std::move(l);
  return pair[1];
}

void H2Guard::OnEvent(int fd, uint32_t events) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  Linked& l = *it->second;
  const bool client_side = fd == l.client_fd;
  Flow& outgoing = client_side ? l.down : l.up;  // waiting to be written to `fd`
  Flow& incoming = client_side ? l.up : l.down;  // to be read from `fd`
  Outcome out = Outcome::kGoOn;
  if ((events & EPOLLOUT) != 0 && !outgoing.waiting.empty()) out = Flush(outgoing, fd);
  if (out == Outcome::kGoOn && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) {
    // A side that hung up while what it sent still waits is not read (its
    // bytes would wait behind those), and would be reported again and again.
    if (incoming.waiting.empty()) {
      out = Pump(l, client_side, absl::Now());
    } else if ((events & (EPOLLHUP | EPOLLERR)) != 0) {
      out = Outcome::kEnd;
    }
  }
  if (out != Outcome::kGoOn) {
    End(l, out == Outcome::kEndCalm);
    return;
  }
  Interest(l);
}

H2Guard::Outcome H2Guard::Pump(Linked& l, bool up, absl::Time now) {
  const int from = up ? l.client_fd : l.grpc_fd;
  const int to = up ? l.grpc_fd : l.client_fd;
  Flow& flow = up ? l.up : l.down;
  ssize_t n;
  do {
    n = recv(from, chunk_.get(), kChunkBytes, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno == EAGAIN ? Outcome::kGoOn : Outcome::kEnd;
  if (n == 0) return Outcome::kEnd;  // that side closed: so does the link
  const absl::string_view read(chunk_.get(), static_cast<size_t>(n));
  size_t pass = read.size();
  if (up) {
    pass = flow.scanner.Scan(read, [&](const H2Frame& f) {
      if (f.type == kH2Headers) l.last_stream = std::max(l.last_stream, f.stream_id);
      return f.type != kH2RstStream || budget_.Spend(l.cred, now);
    });
  } else {
    flow.scanner.Scan(read, [](const H2Frame&) { return true; });
  }
  size_t sent = 0;
  while (sent < pass) {
    const ssize_t w = send(to, read.data() + sent, pass - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      sent += static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      break;
    } else {
      return Outcome::kEnd;
    }
  }
  if (sent < pass) flow.waiting.assign(read.data() + sent, pass - sent);
  if (flow.scanner.stopped()) {
    if (flow.scanner.bad_preface()) return Outcome::kEnd;
    const std::string who = ResetBudget::PrincipalName(l.cred);
    note_(absl::StrCat("resets ", who), "gRPC connection(s) ended",
          absl::StrCat(who, " reset more streams than it may (", BudgetWords(),
                       "; HTTP/2 rapid reset): GOAWAY ENHANCE_YOUR_CALM"),
          now);
    return Outcome::kEndCalm;
  }
  return Outcome::kGoOn;
}

H2Guard::Outcome H2Guard::Flush(Flow& flow, int to) {
  while (!flow.waiting.empty()) {
    const ssize_t w = send(to, flow.waiting.data(), flow.waiting.size(),
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      flow.waiting.erase(0, static_cast<size_t>(w));
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      return Outcome::kGoOn;
    } else {
      return Outcome::kEnd;
    }
  }
  std::string().swap(flow.waiting);  // a chunk's capacity is not kept per link
  return Outcome::kGoOn;
}

void H2Guard::Interest(Linked& l) {
  // Level-triggered: a side is read only while what it sent before was
  // taken, and watched for room only while something waits for it.
  const uint32_t client = (l.up.waiting.empty() ? EPOLLIN : 0u) |
                          (l.down.waiting.empty() ? 0u : EPOLLOUT);
  const uint32_t grpc = (l.down.waiting.empty() ? EPOLLIN : 0u) |
                        (l.up.waiting.empty() ? 0u : EPOLLOUT);
  struct epoll_event ev = {};
  if (client != l.client_interest) {
    ev.events = client;
    ev.data.fd = l.client_fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, l.client_fd, &ev);
    l.client_interest = client;
  }
  if (grpc != l.grpc_interest) {
    ev.events = grpc;
    ev.data.fd = l.grpc_fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, l.grpc_fd, &ev);
    l.grpc_interest = grpc;
  }
}

void H2Guard::End(Linked& l, bool calm) {
  // What the client still has coming (gRPC's last frames, a GOAWAY), as far
  // as its socket takes it now; what gRPC has not taken is dropped.
  Flush(l.down, l.client_fd);
  if (calm && l.down.waiting.empty() && l.down.scanner.at_frame_boundary()) {
    const std::string goaway = CalmGoaway(l.last_stream);
    (void)!send(l.client_fd, goaway.data(), goaway.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  const int client_fd = l.client_fd;
  const int grpc_fd = l.grpc_fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, client_fd, nullptr);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, grpc_fd, nullptr);
  by_fd_.erase(client_fd);
  by_fd_.erase(grpc_fd);
  links_.erase(client_fd);  // `l` is gone from here on
  ShrinkIfSparse(links_);    // what a flood of connections grew is given back
  ShrinkIfSparse(by_fd_);
  close(grpc_fd);           // gRPC sees its connection end
  close(client_fd);
  ++ended_;
  on_end_(client_fd);
}

void H2Guard::EndTenant(uint32_t tenant) {
  std::vector<Linked*> doomed;
  for (const auto& [fd, l] : links_) {
    if (l->cred.socket_tenant == tenant) doomed.push_back(l.get());
  }
  for (Linked* l : doomed) End(*l, /*calm=*/false);
}

void H2Guard::EndAll() {
  while (!links_.empty()) End(*links_.begin()->second, /*calm=*/false);
}

int H2Guard::Sweep(absl::Time now) {
  budget_.Sweep(now);
  const int ended = ended_;
  ended_ = 0;
  return ended;
}

}  // namespace gpumem
