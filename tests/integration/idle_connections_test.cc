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

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "client/client.h"
#include "common/fd_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_client_test.h"

namespace gpumem {
using client::Client;
namespace {

using testing::DaemonClientTest;

int Threads(pid_t pid) { return testing::ThreadCount(pid); }

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

  std::vector<int> idle;
  for (int i = 0; i < 2000; ++i) {
    int fd = Connect(daemon_->socket());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  // Let the daemon accept them all.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int during = Threads(daemon_->pid());
  t0 = std::chrono::steady_clock::now();
  auto stats = client_->GetStats();
  const double idle_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::cerr << "daemon threads: " << before << " with 0 idle connections, " << during
            << " with 2000; GetStats " << empty_ms << " ms / " << idle_ms << " ms\n";
  EXPECT_LE(during, before + 2);  // a thread each would be +2000
  EXPECT_LT(idle_ms, 100.0);

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
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(Threads(daemon_->pid()), before + 2);
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
  // and its slab channel are open.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int during = Threads(daemon_->pid());
  auto t0 = std::chrono::steady_clock::now();
  const auto [sessions, used] = SessionsAndUsed(*client_);
  const double stats_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count();
  std::cerr << "daemon threads: " << before << " with no other client, " << during
            << " with " << kProcesses * kClientsEach << " connected clients (" << sessions
            << " sessions); GetStats " << stats_ms << " ms\n";
  EXPECT_EQ(sessions, sessions_before + kProcesses);
  EXPECT_EQ(used, used_before + kProcesses * kClientsEach * kSize);
  // A fixed pool: gRPC's sync server may add a poller or two as calls
  // come and go; a thread per client would be +1000.
  EXPECT_LE(during, before + 4);

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

// Reflection is the one method gRPC serves synchronously (a thread per
// open stream): 64 reflection streams held open add only a bounded number
// of daemon threads (calls past the bound are refused), and reflection and
// every other call keep working.
TEST_F(IdleConnectionsTest, OpenReflectionStreamsAreBoundedInThreads) {
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->GetStats().ok());
  const int before = Threads(daemon_->pid());
  auto channel = grpc::CreateChannel("unix:" + daemon_->socket(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  constexpr int kStreams = 64;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::GenericClientAsyncReaderWriter>> calls;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    calls.push_back(stub.PrepareCall(
        contexts.back().get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        &cq));
    calls.back()->StartCall(reinterpret_cast<void*>(static_cast<intptr_t>(i + 1)));
  }
  for (int i = 0; i < kStreams; ++i) {
    void* tag;
    bool ok;
    ASSERT_TRUE(cq.Next(&tag, &ok));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int during = Threads(daemon_->pid());
  std::cerr << "daemon threads: " << before << " before, " << during << " with " << kStreams
            << " reflection streams open\n";
  EXPECT_LE(during, before + 6);  // a thread per stream would be +64
  auto b = client_->Allocate(1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->Free().ok());
  for (auto& ctx : contexts) ctx->TryCancel();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  calls.clear();
  contexts.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Reflection answers again once the streams are gone (what grpcurl list does).
  auto fresh = grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials());
  grpc::GenericStub again(fresh);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq2;
  auto call = again.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                &cq2);
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq2.Next(&tag, &ok));
  EXPECT_TRUE(ok);
  // list_services = "*" (field 7), as bytes: tag 0x3a, length 1, '*'.
  grpc::Slice request_slice(std::string("\x3a\x01*", 3));
  grpc::ByteBuffer request(&request_slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq2.Next(&tag, &ok));
  EXPECT_TRUE(ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq2.Next(&tag, &ok));
  EXPECT_TRUE(ok) << "no reflection answer";
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_NE(bytes.find("gpumem.v1.GpuMemory"), std::string::npos);
  ctx.TryCancel();
  cq2.Shutdown();
  while (cq2.Next(&tag, &ok)) {
  }
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
