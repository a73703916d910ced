// H2Guard (server/service/h2_guard.h) and ResetBudget, over real sockets:
// a socket pair stands for the client's connection, the fd Link returns for
// gRPC's end, and the test drives the loop (epoll) itself.
#include "server/service/h2_guard.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/service/reset_budget.h"

namespace gpumem {
namespace {

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const uint32_t n = payload.size();
  f.push_back(static_cast<char>(n >> 16));
  f.push_back(static_cast<char>(n >> 8));
  f.push_back(static_cast<char>(n));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) f.push_back(static_cast<char>(stream >> shift));
  return f + payload;
}

std::string Headers(uint32_t stream) { return Frame(kH2Headers, 0x4, stream, "\x88\x83\x86"); }
// gRPC's trailers: the stream's end.
std::string Trailers(uint32_t stream) { return Frame(kH2Headers, 0x5, stream, "\x88"); }
std::string Reset(uint32_t stream) { return Frame(kH2RstStream, 0, stream, std::string("\0\0\0\x08", 4)); }

PeerCred Uid(uid_t uid) {
  PeerCred c;
  c.uid = uid;
  c.pid = 1;
  return c;
}

class H2GuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(epoll_fd_, 0);
    guard_ = std::make_unique<H2Guard>(
        epoll_fd_, kMaxStreams, [this](int fd) { ended_.push_back(fd); },
        [this](const std::string& key, const char* what, const std::string& why, absl::Time) {
          notes_.push_back(key + ": " + what + ": " + why);
        });
  }
  void TearDown() override {
    guard_.reset();
    for (int fd : mine_) close(fd);
    close(epoll_fd_);
  }

  // A client connection linked for `cred`: {the client's end, gRPC's end}.
  std::pair<int, int> Connect(const PeerCred& cred) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    absl::StatusOr<int> grpc = guard_->Link(sv[1], cred);
    EXPECT_TRUE(grpc.ok()) << grpc.status();
    fcntl(*grpc, F_SETFL, fcntl(*grpc, F_GETFL) | O_NONBLOCK);
    mine_.push_back(sv[0]);
    mine_.push_back(*grpc);
    return {sv[0], *grpc};
  }

  // Runs the loop until it has been idle for `idle_ms`.
  void Run(int idle_ms = 20) {
    struct epoll_event ev[64];
    for (;;) {
      const int n = epoll_wait(epoll_fd_, ev, 64, idle_ms);
      if (n <= 0) return;
      for (int i = 0; i < n; ++i) guard_->OnEvent(ev[i].data.fd, ev[i].events);
    }
  }

  // Writes all of `bytes` to `fd`, running the loop whenever it is full.
  void Send(int fd, const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t w = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (w > 0) {
        sent += w;
      } else {
        ASSERT_EQ(errno, EAGAIN) << strerror(errno);
        Run(1);
      }
    }
  }

  // Everything that reaches `fd` until the loop has nothing more to move;
  // `eof` set when it is closed.
  std::string Drain(int fd, bool* eof = nullptr) {
    std::string out;
    char buf[65536];
    for (;;) {
      Run();
      const size_t before = out.size();
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
      if (n == 0 || (n < 0 && errno != EAGAIN) || out.size() == before) {
        if (eof != nullptr) *eof = n == 0 || (n < 0 && errno != EAGAIN);
        return out;
      }
    }
  }

  static constexpr uint32_t kMaxStreams = 10;
  int epoll_fd_ = -1;
  std::unique_ptr<H2Guard> guard_;
  std::vector<int> ended_;
  std::vector<std::string> notes_;
  std::vector<int> mine_;
};

TEST_F(H2GuardTest, PassesBytesBothWaysUnchangedThroughFullSockets) {
  auto [client, grpc] = Connect(Uid(1001));
  // More than the socket buffers hold, read only after it was all written:
  // both directions must hold back and lose nothing.
  std::string up = std::string(kH2ClientPreface) + Headers(1);
  for (int i = 0; up.size() < (3u << 20); ++i) {
    up += Frame(kH2Data, 0, 1, std::string(16000, static_cast<char>('a' + i % 26)));
  }
  std::string got_up;
  size_t sent = 0;
  while (sent < up.size()) {
    const ssize_t w = send(client, up.data() + sent, std::min<size_t>(up.size() - sent, 70000),
                           MSG_NOSIGNAL);
    if (w > 0) sent += w;
    ASSERT_TRUE(w > 0 || errno == EAGAIN) << strerror(errno);
    Run(1);
    if (w < 0) got_up += Drain(grpc);  // the receiver reads only when all is full
  }
  got_up += Drain(grpc);
  EXPECT_TRUE(got_up == up) << got_up.size() << " of " << up.size() << " bytes";

  std::string down;
  for (int i = 0; down.size() < (2u << 20); ++i) down += Frame(0, 0, 1, std::string(9000, 'z' - i % 7));
  std::string got_down;
  sent = 0;
  while (sent < down.size()) {
    const ssize_t w = send(grpc, down.data() + sent, down.size() - sent, MSG_NOSIGNAL);
    if (w > 0) sent += w;
    ASSERT_TRUE(w > 0 || errno == EAGAIN) << strerror(errno);
    Run(1);
    if (w < 0) got_down += Drain(client);
  }
  got_down += Drain(client);
  EXPECT_TRUE(got_down == down) << got_down.size() << " of " << down.size() << " bytes";
  EXPECT_TRUE(ended_.empty());
  EXPECT_EQ(guard_->links(), 1u);
}

TEST_F(H2GuardTest, ResetsPastTheBudgetEndTheLinkWithGoawayAndRefuseThatPrincipal) {
  auto [client, grpc] = Connect(Uid(65534));
  auto [other_client, other_grpc] = Connect(Uid(1001));
  const int budget = static_cast<int>(ResetBudget::kBurst);
  static_assert(kMaxStreams >= 2, "each reset stream ends before the next opens");
  std::string allowed(kH2ClientPreface);
  for (int i = 0; i < budget; ++i) allowed += Headers(2 * i + 1) + Reset(2 * i + 1);
  const uint32_t last = 2 * budget + 1;
  const std::string over = Headers(last) + Reset(last) + Headers(last + 2) + Reset(last + 2);
  const absl::Time before = absl::Now();  // no refill counted: however slow the run
  Send(client, allowed + over);

  bool grpc_eof = false;
  const std::string passed = Drain(grpc, &grpc_eof);
  // Everything before the first reset past the budget, and not one byte of it.
  EXPECT_TRUE(passed == allowed + Headers(last)) << passed.size();
  EXPECT_TRUE(grpc_eof) << "gRPC's end must see the link end";
  bool client_eof = false;
  const std::string goaway = Drain(client, &client_eof);
  ASSERT_GE(goaway.size(), 17u);
  EXPECT_EQ(static_cast<uint8_t>(goaway[3]), kH2Goaway);
  EXPECT_EQ(goaway.substr(9, 4), std::string("\0\0\x02\x01", 4)) << "last stream " << last;
  EXPECT_EQ(goaway.substr(13, 4), std::string("\0\0\0\x0b", 4)) << "ENHANCE_YOUR_CALM";
  EXPECT_NE(goaway.find("too many stream resets"), std::string::npos);
  EXPECT_TRUE(client_eof);
  EXPECT_EQ(ended_.size(), 1u);
  ASSERT_EQ(notes_.size(), 1u);
  EXPECT_NE(notes_[0].find("uid 65534 reset more streams than it may"), std::string::npos)
      << notes_[0];

  // That principal gets no new link until it has a reset left; others do,
  // and the other uid's link still relays.
  EXPECT_FALSE(guard_->Admits(Uid(65534), before));
  EXPECT_TRUE(guard_->Admits(Uid(1001), before));
  EXPECT_TRUE(guard_->Admits(Uid(65534), absl::Now() + absl::Seconds(2)));
  Send(other_client, std::string(kH2ClientPreface) + Headers(1) + Reset(1));
  EXPECT_EQ(Drain(other_grpc), std::string(kH2ClientPreface) + Headers(1) + Reset(1));
  EXPECT_EQ(guard_->links(), 1u);
}

TEST_F(H2GuardTest, AStreamPastTheConcurrentLimitEndsTheLinkWhileEndedOnesDoNotCount) {
  auto [client, grpc] = Connect(Uid(65534));
  // Before it acknowledged gRPC's SETTINGS a client may open more.
  std::string up(kH2ClientPreface);
  uint32_t s = 1;
  const uint32_t unsettled = kMaxStreams * H2Guard::kUnsettledStreamsFactor;
  for (; s < 2 * unsettled; s += 2) up += Headers(s);
  Send(client, up);
  EXPECT_EQ(Drain(grpc), up);
  std::string ends;
  for (uint32_t e = 1; e < 2 * unsettled; e += 2) ends += Trailers(e);
  Send(grpc, ends);
  EXPECT_EQ(Drain(client), ends);
  // Then kMaxStreams.
  up = Frame(kH2Settings, kH2Ack, 0, "");
  const uint32_t first = s;
  for (; s < first + 2 * kMaxStreams; s += 2) up += Headers(s);
  Send(client, up);
  EXPECT_EQ(Drain(grpc), up);
  // gRPC ends half of them (trailers, or a reset): as many may open again.
  std::string down;
  for (uint32_t e = first; e < first + kMaxStreams; e += 2) {
    down += e % 4 == 1 ? Trailers(e) : Frame(kH2RstStream, 0, e, std::string("\0\0\0\0", 4));
  }
  Send(grpc, down);
  EXPECT_EQ(Drain(client), down);
  std::string more;
  for (uint32_t i = 0; i < kMaxStreams / 2; ++i, s += 2) more += Headers(s);
  Send(client, more);
  EXPECT_EQ(Drain(grpc), more);
  EXPECT_TRUE(ended_.empty());

  // One more than the limit: that HEADERS is not passed on.
  const absl::Time before = absl::Now();
  Send(client, Headers(s) + Headers(s + 2));
  bool grpc_eof = false;
  EXPECT_EQ(Drain(grpc, &grpc_eof), "");
  EXPECT_TRUE(grpc_eof);
  const std::string goaway = Drain(client);
  ASSERT_GE(goaway.size(), 17u);
  EXPECT_EQ(static_cast<uint8_t>(goaway[3]), kH2Goaway);
  EXPECT_EQ(goaway.substr(13, 4), std::string("\0\0\0\x01", 4)) << "PROTOCOL_ERROR";
  EXPECT_NE(goaway.find("more than 10 concurrent streams"), std::string::npos);
  ASSERT_EQ(notes_.size(), 1u);
  EXPECT_NE(notes_[0].find("uid 65534 opened more than 10 concurrent streams"), std::string::npos)
      << notes_[0];
  // Its principal waits a second for a new connection.
  EXPECT_FALSE(guard_->Admits(Uid(65534), before));
}

TEST_F(H2GuardTest, EitherSideClosingEndsTheLinkAndAWrongPrefaceIsNotPassed) {
  auto [client, grpc] = Connect(Uid(1001));
  Send(grpc, Frame(0x4, 0, 0, ""));
  EXPECT_EQ(Drain(client), Frame(0x4, 0, 0, ""));
  shutdown(grpc, SHUT_WR);  // gRPC closed the connection
  bool eof = false;
  Drain(client, &eof);
  EXPECT_TRUE(eof);
  EXPECT_EQ(ended_.size(), 1u);

  auto [client2, grpc2] = Connect(Uid(1001));
  Send(client2, "PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n");
  eof = false;
  EXPECT_EQ(Drain(grpc2, &eof), "");
  EXPECT_TRUE(eof);
  EXPECT_EQ(ended_.size(), 2u);
  EXPECT_EQ(guard_->links(), 0u);
}

TEST_F(H2GuardTest, EndTenantEndsOnlyThatTenantsLinks) {
  PeerCred through = Uid(1001);
  through.socket_tenant = 7;
  auto [client, grpc] = Connect(through);
  auto [main_client, main_grpc] = Connect(Uid(1001));
  guard_->EndTenant(7);
  bool eof = false;
  Drain(grpc, &eof);
  EXPECT_TRUE(eof);
  EXPECT_EQ(guard_->links(), 1u);
  Send(main_client, std::string(kH2ClientPreface));
  EXPECT_EQ(Drain(main_grpc), std::string(kH2ClientPreface));
}

TEST(ResetBudgetTest, BurstThenRatePerPrincipalAndATenantSocketIsOnePrincipal) {
  ResetBudget budget;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PeerCred a = Uid(5);
  for (int i = 0; i < ResetBudget::kBurst; ++i) ASSERT_TRUE(budget.Spend(a, t0)) << i;
  EXPECT_FALSE(budget.Spend(a, t0));
  // No new connection until a second's worth has come back.
  EXPECT_FALSE(budget.Admits(a, t0 + absl::Milliseconds(900)));
  EXPECT_TRUE(budget.Admits(a, t0 + absl::Seconds(1)));
  EXPECT_TRUE(budget.Spend(Uid(6), t0));  // another uid's own budget
  // One second later: kPerSecond more, not one more.
  const absl::Time t1 = t0 + absl::Seconds(1);
  for (int i = 0; i < ResetBudget::kPerSecond; ++i) ASSERT_TRUE(budget.Spend(a, t1)) << i;
  EXPECT_FALSE(budget.Spend(a, t1));

  // Every caller of one tenant's socket spends the same budget.
  PeerCred t_a = Uid(10), t_b = Uid(11);
  t_a.socket_tenant = t_b.socket_tenant = 3;
  for (int i = 0; i < ResetBudget::kBurst; ++i) ASSERT_TRUE(budget.Spend(i % 2 ? t_a : t_b, t0));
  EXPECT_FALSE(budget.Spend(t_b, t0));
  EXPECT_FALSE(budget.Admits(t_a, t0));
  EXPECT_TRUE(budget.Admits(Uid(10), t0));  // uid 10 on the main socket is not that tenant

  // A whole budget is forgotten.
  EXPECT_EQ(budget.tracked(), 3u);
  budget.Sweep(t0 + absl::Seconds(60));
  EXPECT_EQ(budget.tracked(), 0u);
}

}  // namespace
}  // namespace gpumem
