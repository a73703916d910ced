// Clients the daemon cannot see by pid (containers without hostPID): the
// daemon runs in its own pid namespace (unshare --pid --fork), so for every
// client here SO_PEERCRED gives pid 0. Such a client gets a session bound to
// its slab channel; it can allocate, its memory comes back within a second
// of its death, and a caller without the channel's token (or with another
// uid's) is refused with a message that says why. Also the converse: a
// client under `unshare --pid --fork` with the daemon in the root namespace.
// Needs root (unshare, setuid); skipped otherwise.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
using client::Client;
namespace {

using testing::ChildProcess;
using testing::MakeTempDir;
using testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20;

bool WaitForSocket(const std::string& path) {
  for (int i = 0; i < 3000; ++i) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class PidNamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
      GTEST_SKIP() << "needs root and unshare";
    }
    dir_ = MakeTempDir();
    socket_ = dir_ + "/gpumemd.sock";
  }
  void TearDown() override {
    daemon_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  void StartDaemon(bool own_namespace) {
    std::vector<std::string> argv;
    if (own_namespace) argv = {"/usr/bin/unshare", "--pid", "--fork", "--kill-child"};
    argv.push_back(RunfilePath("server/gpumemd"));
    argv.push_back("--socket=" + socket_);
    // Its own ledger: the default path is the machine's, shared by every
    // daemon started without one (and locked by the first).
    argv.push_back("--ledger=" + dir_ + "/ledger.db");
    argv.push_back("--sim_devices=2x256MiB");
    argv.push_back("--slab_size=16MiB");
    daemon_ = std::make_unique<ChildProcess>(argv);
    ASSERT_TRUE(WaitForSocket(socket_));
  }
  std::string TestClient() {
    const std::string copy = dir_ + "/test_client";
    if (access(copy.c_str(), X_OK) != 0) {
      std::filesystem::copy_file(RunfilePath("tests/integration/test_client"), copy);
      chmod(copy.c_str(), 0755);
    }
    return copy;
  }
  uint64_t Used(Client& c) {
    auto s = c.GetStats();
    EXPECT_TRUE(s.ok()) << s.status();
    uint64_t used = 0;
    if (s.ok()) {
      for (const auto& d : s->devices()) used += d.used_bytes();
    }
    return used;
  }
  // Milliseconds until used bytes are `want` (-1 after 5 s).
  int MsUntilUsed(Client& c, uint64_t want) {
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - start).count());
      if (Used(c) == want) return ms;
      if (ms > 5000) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::string dir_, socket_;
  std::unique_ptr<ChildProcess> daemon_;
};

TEST_F(PidNamespaceTest, InvisibleClientsGetAConnectionBoundSession) {
  StartDaemon(/*own_namespace=*/true);
  auto client = Client::Connect(socket_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->GetSession();
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->pid(), 0) << "this process should be invisible to the daemon";
  auto buf = (*client)->Allocate(kMiB);
  ASSERT_TRUE(buf.ok()) << buf.status();
  memset(buf->data(), 7, buf->size());
  EXPECT_EQ(Used(**client), kMiB);

  // Another invisible process holds memory and is killed with SIGKILL.
  ChildProcess holder({TestClient(), "--socket=" + socket_, "--size=4194304",
                       "--count=3", "--then=hold"});
  for (int i = 0; i < 3; ++i) ASSERT_EQ(holder.ReadLine().rfind("alloc ", 0), 0u);
  ASSERT_EQ(holder.ReadLine(), "ready");
  EXPECT_EQ(Used(**client), kMiB + 12 * kMiB);
  holder.Kill(SIGKILL);
  const int ms = MsUntilUsed(**client, kMiB);
  EXPECT_GE(ms, 0);
  EXPECT_LT(ms, 1000);
  std::cerr << "invisible client's memory back " << ms << " ms after SIGKILL\n";

  // gRPC without the channel's token: refused, saying why.
  auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  auto stub = v1::GpuMemory::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest req;
    req.set_size_bytes(kMiB);
    v1::AllocateResponse resp;
    grpc::Status s = stub->Allocate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(s.error_message().find("slab channel"), std::string::npos) << s.error_message();
  }
  {  // A made-up token.
    grpc::ClientContext ctx;
    ctx.AddMetadata("gpumem-session-token", "00112233445566778899aabbccddeeff");
    v1::AllocateRequest req;
    req.set_size_bytes(kMiB);
    v1::AllocateResponse resp;
    EXPECT_EQ(stub->Allocate(&ctx, req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // GetStats needs no session.
  {
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    EXPECT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
  }
  EXPECT_TRUE(buf->Free().ok());
}

TEST_F(PidNamespaceTest, AClientInItsOwnPidNamespaceIsReclaimedToo) {
  StartDaemon(/*own_namespace=*/false);
  auto client = Client::Connect(socket_);
  ASSERT_TRUE(client.ok()) << client.status();
  ChildProcess holder({"/usr/bin/unshare", "--pid", "--fork", "--kill-child", TestClient(),
                       "--socket=" + socket_, "--size=4194304", "--count=2",
                       "--then=hold"});
  for (int i = 0; i < 2; ++i) ASSERT_EQ(holder.ReadLine().rfind("alloc ", 0), 0u);
  ASSERT_EQ(holder.ReadLine(), "ready");
  EXPECT_EQ(Used(**client), 8 * kMiB);
  holder.Kill(SIGKILL);  // unshare; --fork's child dies with its namespace's init
  const int ms = MsUntilUsed(**client, 0);
  EXPECT_GE(ms, 0);
  EXPECT_LT(ms, 1000);
}

}  // namespace
}  // namespace gpumem
