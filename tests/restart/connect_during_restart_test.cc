// Client::Connect while the daemon restarts. A program that starts in the
// moment a daemon dies must ride the restart out, as its calls would: a
// daemon that took the connection and hung up (or stayed silent) before
// answering the hello is tried again, for at most GPUMEM_RECONNECT_MS. What
// is not a restart still fails at once: nothing listening at the path, or a
// daemon that answered with a refusal.
//
// The daemon that dies mid-hello is played by the test: it holds the
// listening socket (as systemd's fd store does across a restart), takes one
// connection, reads its hello and hangs up; then a real gpumemd is started
// on that same socket and the waiting Connect reaches it.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "common/fd_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

namespace gpumem {
namespace {

using client::Client;

int Listen(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Accepts one connection, reads its hello request (so the client is past
// connect() and waiting for the answer), then does `answer` and hangs up.
bool TakeHello(int listener, const std::function<void(int)>& answer) {
  const int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return false;
  SlabRequest req;
  const ssize_t n = recv(c, &req, sizeof(req), MSG_WAITALL);
  const bool hello = n == static_cast<ssize_t>(sizeof(req)) &&
                     memcmp(req.magic, kFdChannelMagic, 4) == 0 &&
                     req.op == static_cast<uint16_t>(SlabOp::kHello);
  if (hello) answer(c);
  close(c);
  return hello;
}

class ConnectDuringRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    socket_ = dir_ + "/gpumemd.sock";
  }
  void TearDown() override { unsetenv("GPUMEM_RECONNECT_MS"); }

  std::string dir_, socket_;
};

TEST_F(ConnectDuringRestartTest, NothingListeningFailsAtOnce) {
  const absl::Time t = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "cannot connect to gpumemd"))
      << c.status();
  EXPECT_LT(absl::Now() - t, absl::Seconds(2)) << "no retry when nothing listens";
}

TEST_F(ConnectDuringRestartTest, ARefusalIsReturnedAsItCameWithoutRetrying) {
  const int listener = Listen(socket_);
  ASSERT_GE(listener, 0) << strerror(errno);
  std::atomic<int> taken{0};
  std::thread daemon([&] {
    if (TakeHello(listener, [](int c) {
          const std::string why = "uid 4242 is in no tenant";
          SlabResponse resp = {};
          resp.code = static_cast<uint32_t>(absl::StatusCode::kPermissionDenied);
          resp.message_len = static_cast<uint32_t>(why.size());
          std::string bytes(reinterpret_cast<const char*>(&resp), sizeof(resp));
          bytes += why;
          (void)!send(c, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        })) {
      ++taken;
    }
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_);
  daemon.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied) << c.status();
  EXPECT_EQ(c.status().message(), "uid 4242 is in no tenant");
  EXPECT_EQ(taken.load(), 1);
  // No second try came: the listener has nothing queued.
  struct timeval none = {0, 200000};
  setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  EXPECT_LT(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC), 0) << "a refusal was retried";
  close(listener);
}

TEST_F(ConnectDuringRestartTest, ADaemonThatKeepsHangingUpIsTriedForTheReconnectWait) {
  setenv("GPUMEM_RECONNECT_MS", "400", 1);
  const int listener = Listen(socket_);
  ASSERT_GE(listener, 0) << strerror(errno);
  std::atomic<bool> done{false};
  std::atomic<int> taken{0};
  std::thread daemon([&] {
    struct timeval tick = {0, 50000};
    setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof(tick));
    while (!done) {
      if (TakeHello(listener, [](int) {})) ++taken;
    }
  });
  const absl::Time t = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_);
  const absl::Duration took = absl::Now() - t;
  done = true;
  daemon.join();
  close(listener);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "took the connection but gave no answer"))
      << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "GPUMEM_RECONNECT_MS")) << c.status();
  EXPECT_GE(took, absl::Milliseconds(300)) << "gave up before the reconnect wait";
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_GT(taken.load(), 2) << "tried again";
}

TEST_F(ConnectDuringRestartTest, ADaemonThatDiesMidHelloIsWaitedForAndTheNextOneServes) {
  const int listener = Listen(socket_);
  ASSERT_GE(listener, 0) << strerror(errno);
  testing::FakeSystemd systemd(dir_, /*fd_store=*/true);
  systemd.Store("gpumemd-listen", dup(listener));  // as the daemon stores it
  absl::StatusOr<std::unique_ptr<Client>> c;
  std::thread program([&] { c = Client::Connect(socket_); });
  // The dying daemon: takes the hello and hangs up without an answer.
  ASSERT_TRUE(TakeHello(listener, [](int) {}));
  close(listener);
  const std::vector<std::string> args = {testing::RunfilePath("server/gpumemd"),
                                         "--socket=" + socket_,
                                         "--ledger=" + dir_ + "/ledger.db",
                                         "--state=" + dir_ + "/state",
                                         "--sim_devices=1x1GiB",
                                         "--slab_size=64MiB"};
  ASSERT_TRUE(systemd.Start(args, socket_)) << systemd.Log();
  program.join();
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << systemd.Log();
  absl::StatusOr<client::Buffer> b = (*c)->Allocate(1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  memset(b->data(), 0x5a, b->size());
  EXPECT_TRUE(b->Free().ok());
}

}  // namespace
}  // namespace gpumem
