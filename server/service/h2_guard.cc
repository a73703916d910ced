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

// GOAWAY(last_stream, code) with a reason a person can read.
std::string Goaway(uint32_t last_stream, uint32_t code, absl::string_view reason) {
  const uint32_t length = 8 + reason.size();
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
  be32(code);
  f.append(reason.data(), reason.size());
  return f;
}

std::string BudgetWords() {
  return absl::StrCat("it may reset ", static_cast<int>(ResetBudget::kBurst),
                      " streams at once and ", static_cast<int>(ResetBudget::kPerSecond),
                      " a second after that");
}

}  // namespace

H2Guard::H2Guard(int epoll_fd, uint32_t max_streams, OnEnd on_end, Note note)
    : epoll_fd_(epoll_fd),
      max_streams_(max_streams),
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
  // The kernel doubles what it is given; a Unix stream socket's queue is
  // bounded by its sender's buffer.
  const int sndbuf = static_cast<int>(kChunkBytes / 2);
  setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
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
    End(l, out);
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
  Outcome stop = Outcome::kGoOn;
  if (up) {
    pass = flow.scanner.Scan(read, [&](const H2Frame& f) {
      if (f.type == kH2Headers && f.stream_id > l.last_stream) {  // opens a stream
        const uint32_t limit =
            l.settings_acked ? max_streams_ : max_streams_ * kUnsettledStreamsFactor;
        if (l.open.size() >= limit) {
          stop = Outcome::kEndStreams;
          return false;
        }
        l.open.insert(f.stream_id);
        l.last_stream = f.stream_id;
      } else if (f.type == kH2Settings && (f.flags & kH2Ack) != 0) {
        l.settings_acked = true;
      } else if (f.type == kH2RstStream) {
        l.open.erase(f.stream_id);
        if (!budget_.Spend(l.cred, now)) {
          stop = Outcome::kEndResets;
          return false;
        }
      }
      return true;
    });
  } else {
    // What gRPC ends no longer counts (a stream it ended while the client
    // still sends still counts for the client: the count errs low).
    flow.scanner.Scan(read, [&](const H2Frame& f) {
      if (f.type == kH2RstStream ||
          ((f.type == kH2Headers || f.type == kH2Data) && (f.flags & kH2EndStream) != 0)) {
        l.open.erase(f.stream_id);
      }
      return true;
    });
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
  if (!flow.scanner.stopped()) return Outcome::kGoOn;
  if (flow.scanner.bad_preface()) return Outcome::kEnd;
  const std::string who = ResetBudget::PrincipalName(l.cred);
  if (stop == Outcome::kEndResets) {
    note_(absl::StrCat("resets ", who), "gRPC connection(s) ended",
          absl::StrCat(who, " reset more streams than it may (", BudgetWords(),
                       "; HTTP/2 rapid reset): GOAWAY ENHANCE_YOUR_CALM"),
          now);
  } else {
    budget_.SpendAll(l.cred, now);
    note_(absl::StrCat("streams ", who), "gRPC connection(s) ended",
          absl::StrCat(who, " opened more than ", max_streams_,
                       " concurrent streams on one connection (--max_concurrent_streams, "
                       "DaemonConfig.max_concurrent_streams, SETTINGS_MAX_CONCURRENT_STREAMS): "
                       "GOAWAY PROTOCOL_ERROR; its new connections wait a second"),
          now);
  }
  return stop;
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

void H2Guard::End(Linked& l, Outcome why) {
  // What the client still has coming (gRPC's last frames, a GOAWAY), as far
  // as its socket takes it now; what gRPC has not taken is dropped.
  Flush(l.down, l.client_fd);
  if ((why == Outcome::kEndResets || why == Outcome::kEndStreams) && l.down.waiting.empty() &&
      l.down.scanner.at_frame_boundary()) {
    const std::string goaway =
        why == Outcome::kEndResets
            ? Goaway(l.last_stream, kH2EnhanceYourCalm, "too many stream resets")
            : Goaway(l.last_stream, kH2ProtocolError,
                     absl::StrCat("more than ", max_streams_, " concurrent streams"));
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
  for (Linked* l : doomed) End(*l, Outcome::kEnd);
}

void H2Guard::EndAll() {
  while (!links_.empty()) End(*links_.begin()->second, Outcome::kEnd);
}

int H2Guard::Sweep(absl::Time now) {
  budget_.Sweep(now);
  const int ended = ended_;
  ended_ = 0;
  return ended;
}

}  // namespace gpumem
