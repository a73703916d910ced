// Connections cost no thread while they say nothing: a real gpumemd with
// 2,000 connections that never send a byte keeps its thread count, answers
// GetStats quickly, serves a real client, and closes a silent connection
// after about 5 s. Also: a connection that sends garbage is closed at once,
// and a slab channel whose peer never reads its answers does not stall the
// daemon. And 1,000 real clients, each with its own gRPC connection, open
// stream and slab channel, cost the daemon no thread each and all their
// memory comes back when their processes are killed.
#include <dirent.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/lib/cpp/client.h"
#include "common/fd_channel.h"
#include "gtest/gtest.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_client_test.h"

namespace gpumem {
using client::Client;
namespace {

using testing::DaemonClientTest;
using testing::PollUntil;

// gRPC's timer threads apart (daemon_fixture.h): they are gRPC's high-water
// mark, not the daemon's threads.
int Threads(pid_t pid) { return testing::ThreadCountBesidesGrpcTimers(pid); }

int Connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closed `fd` within `ms` (read returns 0 or an error).
bool ClosedWithin(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char c;
  return read(fd, &c, 1) <= 0;
}

class IdleConnectionsTest : public DaemonClientTest {
 protected:
  IdleConnectionsTest() : DaemonClientTest({"--sim_devices=2x1GiB"}) {}
};

TEST_F(IdleConnectionsTest, TwoThousandSilentConnectionsCostNoThreads) {
  struct rlimit files;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max < 2200) GTEST_SKIP() << "fd hard limit too low";
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);

  // Warm: gRPC's own pollers exist (its sync server may add one or two
  // threads as calls come and go, whatever the number of connections).
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->GetStats().ok());
  const int before = Threads(daemon_->pid());
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(client_->GetStats().ok());
  const double empty_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count();

  const int fds_before = testing::FdCount(daemon_->pid());
  std::vector<int> idle;
  for (int i = 0; i < 2000; ++i) {
    int fd = Connect(daemon_->socket());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  // The daemon accepted them all: it holds an fd for each.
  ASSERT_TRUE(PollUntil([&] { return testing::FdCount(daemon_->pid()) >= fds_before + 2000; }))
      << "the daemon holds " << testing::FdCount(daemon_->pid()) - fds_before
      << " more fds, not 2000";
  const int during = Threads(daemon_->pid());
  t0 = std::chrono::steady_clock::now();
  auto stats = client_->GetStats();
  const double idle_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::cerr << "daemon threads: " << before << " with 0 idle connections, " << during
            << " with 2000; GetStats " << empty_ms << " ms / " << idle_ms << " ms\n";
  EXPECT_LE(during, before + 2);  // a thread each would be +2000
  // Not a speed figure: a call held up behind the 2000 (e.g. a thread
  // accepting or polling them one by one) would take seconds; 1 s is the
  // margin for a sanitizer build on a loaded 2-core machine.
  EXPECT_LT(idle_ms, 1000.0);

  // A new client is served while they wait.
  auto other = Client::Connect(daemon_->socket());
  ASSERT_TRUE(other.ok()) << other.status();
  auto b = (*other)->Allocate(1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->Free().ok());

  // Silent for 5 s: closed (all of them, within a few more seconds).
  EXPECT_FALSE(ClosedWithin(idle[0], 3000));
  int closed = 0;
  for (int fd : idle) {
    if (ClosedWithin(fd, 6000)) ++closed;
  }
  EXPECT_EQ(closed, 2000);
  for (int fd : idle) close(fd);
  EXPECT_TRUE(PollUntil([&] { return Threads(daemon_->pid()) <= before + 2; }))
      << Threads(daemon_->pid()) << " daemon threads, " << before << " before";
}

// Sessions and used bytes the daemon reports.
std::pair<int, uint64_t> SessionsAndUsed(Client& client) {
  auto stats = client.GetStats();
  if (!stats.ok()) return {-1, 0};
  uint64_t used = 0;
  for (const v1::DeviceStats& d : stats->devices()) used += d.used_bytes();
  return {stats->sessions_size(), used};
}

TEST_F(IdleConnectionsTest, AThousandConnectedClientsCostNoThreadEach) {
  constexpr int kProcesses = 10;
  constexpr int kClientsEach = 100;
  constexpr uint64_t kSize = 4096;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->GetStats().ok());
  ASSERT_TRUE(client_->GetSession().ok());  // this process's session, counted
  const int before = Threads(daemon_->pid());
  const auto [sessions_before, used_before] = SessionsAndUsed(*client_);

  std::vector<std::unique_ptr<testing::ChildProcess>> children;
  for (int i = 0; i < kProcesses; ++i) {
    children.push_back(std::make_unique<testing::ChildProcess>(std::vector<std::string>{
        testing::RunfilePath("tests/integration/test_client"),
        "--socket=" + daemon_->socket(), "--clients=" + std::to_string(kClientsEach),
        "--size=" + std::to_string(kSize)}));
  }
  for (auto& c : children) ASSERT_EQ(c->ReadLine(300000), "ready");
  // Every client is connected and idle: its gRPC connection, its stream
  // and its slab channel are open. gRPC's sync server may have added a
  // poller or two while they connected, which retire once idle: the count
  // must come down to the bound (a thread per client would stay +1000).
  int during = 0;
  EXPECT_TRUE(PollUntil([&] {
    during = Threads(daemon_->pid());
    return during <= before + 4;
  })) << during << " daemon threads, " << before << " before";
  auto t0 = std::chrono::steady_clock::now();
  const auto [sessions, used] = SessionsAndUsed(*client_);
  const double stats_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count();
  std::cerr << "daemon threads: " << before << " with no other client, " << during
            << " with " << kProcesses * kClientsEach << " connected clients (" << sessions
            << " sessions); GetStats " << stats_ms << " ms\n";
  EXPECT_EQ(sessions, sessions_before + kProcesses);
  EXPECT_EQ(used, used_before + kProcesses * kClientsEach * kSize);

  // Another client is served while they all hold their connections.
  auto other = Client::Connect(daemon_->socket());
  ASSERT_TRUE(other.ok()) << other.status();
  auto b = (*other)->Allocate(1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->Free().ok());
  other->reset();

  // kill -9 all of them: every byte and session comes back.
  for (auto& c : children) c->Kill(SIGKILL);
  for (auto& c : children) c->Wait();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::pair<int, uint64_t> now;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = SessionsAndUsed(*client_);
  } while ((now.first != sessions_before || now.second != used_before) &&
           std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(now.first, sessions_before);
  EXPECT_EQ(now.second, used_before);
  EXPECT_LE(Threads(daemon_->pid()), before + 4);
}

TEST_F(IdleConnectionsTest, GarbageIsClosedAtOnceAndTheDaemonKeepsServing) {
  const std::string garbages[] = {"GET / HTTP/1.1\r\n\r\n", std::string("\0\1\2\3", 4),
                                  "GMSLxxxxxxxxxxxxxxxx"};
  for (const std::string& garbage : garbages) {
    int fd = Connect(daemon_->socket());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, garbage.data(), garbage.size()),
              static_cast<ssize_t>(garbage.size()));
    EXPECT_TRUE(ClosedWithin(fd, 2000)) << garbage;
    close(fd);
  }
  // Half a preface, then silence: closed by the deadline, not before.
  int fd = Connect(daemon_->socket());
  ASSERT_EQ(write(fd, "PR", 2), 2);
  EXPECT_FALSE(ClosedWithin(fd, 2000));
  EXPECT_TRUE(ClosedWithin(fd, 6000));
  close(fd);
  EXPECT_TRUE(client_->GetStats().ok());
}

TEST_F(IdleConnectionsTest, AChannelThatNeverReadsItsAnswersDoesNotStallOthers) {
  auto b = client_->Allocate(1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  const uint64_t slab = b->allocation().slab_id();
  int fd = Connect(daemon_->socket());
  ASSERT_GE(fd, 0);
  // Thousands of requests, no reads: each answer carries an fd, so the
  // socket's buffer fills and the daemon must drop the connection.
  SlabRequest req;
  memcpy(req.magic, kFdChannelMagic, 4);
  req.version = kFdChannelVersion;
  req.op = static_cast<uint16_t>(SlabOp::kOpenSlab);
  req.slab_id = slab;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000; ++i) {
    if (send(fd, &req, sizeof(req), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(req)) break;
  }
  auto stats = client_->GetStats();
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(stats.ok());
  EXPECT_LT(ms, 5000.0);
  close(fd);
  EXPECT_TRUE(b->Free().ok());
  EXPECT_TRUE(client_->GetStats().ok());
}

}  // namespace
}  // namespace gpumem
