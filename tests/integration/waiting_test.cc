// Waiting requests (AllocateRequest.wait_ms) against a real gpumemd: they
// hold no daemon thread, are served by tenant priority when room appears
// (unary and Stream requests in one queue),
// are refused by name past their tenant's limit, and leave nothing behind
// when their processes are killed or their callers give up.
//
// Clients are real processes (tests/integration/waiting_client) run as
// other uids, so this test needs root (it is skipped otherwise) and no
// sandbox.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using client::Client;
using testing::ChildProcess;
using testing::DaemonProcess;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kLow = 65534;     // tenant "low", priority 1
constexpr uid_t kHigh = 65533;    // tenant "high", priority 9
constexpr uid_t kCapped = 65532;  // tenant "capped", at most 5 waiting

// gRPC's timer threads apart (daemon_fixture.h): they are gRPC's high-water
// mark, not the daemon's threads.
int Threads(pid_t pid) { return testing::ThreadCountBesidesGrpcTimers(pid); }

template <typename F>
bool WaitFor(F done, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  const auto end = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

class WaitingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
    dir_ = testing::MakeTempDir();
    const std::string config = dir_ + "/gpumemd.textproto";
    std::ofstream(config) << absl::StrCat(R"(
      max_waiting_requests: 1000
      tenant { name: "root" uids: 0 }
      tenant { name: "low" priority: 1 uids: )", kLow, R"( }
      tenant { name: "high" priority: 9 uids: )", kHigh, R"( }
      tenant { name: "capped" uids: )", kCapped, R"( max_waiting_requests: 5 }
    )");
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--sim_devices=1x64MiB", "--slab_size=64MiB", "--ledger=none", "--config=" + config});
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
    auto c = Client::Connect(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    // Runfiles live under root's home, which other uids cannot enter.
    binary_ = dir_ + "/waiting_client";
    std::filesystem::copy_file(testing::RunfilePath("tests/integration/waiting_client"),
                               binary_);
    chmod(binary_.c_str(), 0755);
  }
  void TearDown() override {
    clients_.clear();
    client_.reset();
    if (daemon_ != nullptr) EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  ChildProcess* Waiters(uid_t uid, int requests, uint64_t size, uint32_t wait_ms = 60000,
                        bool keeper = false) {
    std::vector<std::string> argv = {binary_, "--socket=" + daemon_->socket(),
                                     "--requests=" + std::to_string(requests),
                                     "--size=" + std::to_string(size),
                                     "--wait_ms=" + std::to_string(wait_ms)};
    if (keeper) argv.push_back("--keeper");
    clients_.push_back(std::make_unique<ChildProcess>(argv, uid));
    return clients_.back().get();
  }

  // The same requests over one raw Stream of the client's.
  ChildProcess* StreamWaiters(uid_t uid, int requests, uint64_t size) {
    clients_.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{binary_, "--socket=" + daemon_->socket(), "--stream",
                                 "--requests=" + std::to_string(requests),
                                 "--size=" + std::to_string(size), "--wait_ms=60000"},
        uid));
    return clients_.back().get();
  }

  v1::GetStatsResponse Stats() {
    absl::StatusOr<v1::GetStatsResponse> s = client_->GetStats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::GetStatsResponse();
  }
  uint64_t Waiting() { return Stats().counters().waiting_requests(); }
  const v1::TenantStats* Tenant(const v1::GetStatsResponse& s, const std::string& name) {
    for (const v1::TenantStats& t : s.tenants()) {
      if (t.name() == name) return &t;
    }
    return nullptr;
  }

  std::string dir_;
  std::string binary_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<std::unique_ptr<ChildProcess>> clients_;
};

// 100 processes with 10 waiting requests each add at most a few daemon
// threads; when room appears the higher-priority tenant's requests are
// served first; killing the processes leaves no waiter, session or byte.
TEST_F(WaitingTest, AThousandWaitersHoldNoThreadAndAreServedByPriority) {
  constexpr int kProcesses = 100, kEach = 10;
  absl::StatusOr<v1::AllocateResponse> whole = [&] {
    v1::AllocateRequest r;
    r.set_size_bytes(64 * kMiB);
    return client_->AllocateRaw(r);
  }();
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int i = 0; i < 20; ++i) Stats();
  const int before = Threads(daemon_->pid());
  const int sessions_before = Stats().sessions_size();

  // Low-priority processes first, so arrival alone would favour them.
  std::vector<ChildProcess*> low, high;
  for (int i = 0; i < kProcesses / 2; ++i) low.push_back(Waiters(kLow, kEach, kMiB));
  for (int i = 0; i < kProcesses / 2; ++i) high.push_back(Waiters(kHigh, kEach, kMiB));
  for (auto& c : clients_) ASSERT_EQ(c->ReadLine(60000), "sent 10");
  ASSERT_TRUE(WaitFor([&] { return Waiting() == kProcesses * kEach; }))
      << Waiting() << " waiting";
  const int during = Threads(daemon_->pid());
  v1::GetStatsResponse s = Stats();
  std::cerr << "daemon threads: " << before << " before, " << during << " with "
            << kProcesses * kEach << " waiting requests\n";
  EXPECT_LE(during, before + 4);  // a thread per waiter would be +1000
  ASSERT_NE(Tenant(s, "low"), nullptr);
  ASSERT_NE(Tenant(s, "high"), nullptr);
  EXPECT_EQ(Tenant(s, "low")->waiting_requests(), kProcesses / 2 * kEach);
  EXPECT_EQ(Tenant(s, "high")->waiting_requests(), kProcesses / 2 * kEach);

  // Room for 64 requests: all of them high's.
  ASSERT_TRUE(client_->Free(whole->allocations(0).id()).ok());
  ASSERT_TRUE(WaitFor([&] { return Stats().devices(0).used_bytes() == 64 * kMiB; }));
  s = Stats();
  EXPECT_EQ(Tenant(s, "high")->used_bytes(), 64 * kMiB);
  EXPECT_EQ(Tenant(s, "low")->used_bytes(), 0u);
  EXPECT_EQ(s.counters().waiting_requests(), static_cast<uint64_t>(kProcesses * kEach - 64));
  int served = 0;
  for (ChildProcess* c : high) {
    for (std::string line = c->ReadLine(50); !line.empty(); line = c->ReadLine(50)) {
      EXPECT_TRUE(absl::StartsWith(line, "alloc ")) << line;
      ++served;
    }
  }
  for (ChildProcess* c : low) EXPECT_EQ(c->ReadLine(20), "");
  EXPECT_EQ(served, 64);

  // kill -9 every client: no waiter, session or byte is left.
  for (auto& c : clients_) c->Kill(SIGKILL);
  for (auto& c : clients_) c->Wait();
  ASSERT_TRUE(WaitFor([&] {
    const v1::GetStatsResponse now = Stats();
    return now.counters().waiting_requests() == 0 && now.devices(0).used_bytes() == 0 &&
           now.sessions_size() == sessions_before;
  }, std::chrono::seconds(20)));
  EXPECT_LE(Threads(daemon_->pid()), before + 4);
}

// Waiting requests on the Stream and unary ones wait in one queue, served by
// tenant priority whatever their transport: the low tenant's (unary and
// stream) came first, and the room that appears goes to the high tenant's
// (stream and unary) alone.
TEST_F(WaitingTest, StreamAndUnaryWaitersAreServedByPriorityAlike) {
  v1::AllocateRequest r;
  r.set_size_bytes(64 * kMiB);
  absl::StatusOr<v1::AllocateResponse> whole = client_->AllocateRaw(r);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<ChildProcess*> low = {Waiters(kLow, 2, 16 * kMiB),
                                    StreamWaiters(kLow, 2, 16 * kMiB)};
  for (ChildProcess* c : low) ASSERT_EQ(c->ReadLine(60000), "sent 2");
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 4; })) << Waiting() << " waiting";
  std::vector<ChildProcess*> high = {StreamWaiters(kHigh, 2, 16 * kMiB),
                                     Waiters(kHigh, 2, 16 * kMiB)};
  for (ChildProcess* c : high) ASSERT_EQ(c->ReadLine(60000), "sent 2");
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 8; })) << Waiting() << " waiting";

  // Room for four: the high tenant's four.
  ASSERT_TRUE(client_->Free(whole->allocations(0).id()).ok());
  for (ChildProcess* c : high) {
    for (int i = 0; i < 2; ++i) {
      const std::string line = c->ReadLine(30000);
      EXPECT_TRUE(absl::StartsWith(line, "alloc ")) << line;
    }
  }
  for (ChildProcess* c : low) EXPECT_EQ(c->ReadLine(20), "");
  const v1::GetStatsResponse s = Stats();
  ASSERT_NE(Tenant(s, "high"), nullptr);
  ASSERT_NE(Tenant(s, "low"), nullptr);
  EXPECT_EQ(Tenant(s, "high")->used_bytes(), 64 * kMiB);
  EXPECT_EQ(Tenant(s, "low")->used_bytes(), 0u);
  EXPECT_EQ(s.counters().waiting_requests(), 4u);
}

// Past its tenant's limit a waiting request is refused at once, by name;
// those within it wait.
TEST_F(WaitingTest, AFloodPastTheTenantsLimitIsRefusedByName) {
  v1::AllocateRequest r;
  r.set_size_bytes(64 * kMiB);
  absl::StatusOr<v1::AllocateResponse> whole = client_->AllocateRaw(r);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ChildProcess* capped = Waiters(kCapped, 10, kMiB);
  // Five refusals, at once (they may come before or after "sent 10").
  int refused = 0;
  bool sent = false;
  while (refused < 5 || !sent) {
    const std::string line = capped->ReadLine(30000);
    ASSERT_FALSE(line.empty()) << refused << " refused so far";
    if (line == "sent 10") {
      sent = true;
      continue;
    }
    EXPECT_TRUE(absl::StartsWith(line, "error 8 ")) << line;  // RESOURCE_EXHAUSTED
    EXPECT_TRUE(absl::StrContains(line, "\"capped\"")) << line;
    EXPECT_TRUE(absl::StrContains(line, "max_waiting_requests 5")) << line;
    ++refused;
  }
  EXPECT_EQ(refused, 5);
  EXPECT_EQ(capped->ReadLine(200), "");  // the other five wait
  EXPECT_EQ(Waiting(), 5u);
  ASSERT_TRUE(client_->Free(whole->allocations(0).id()).ok());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(absl::StartsWith(capped->ReadLine(10000), "alloc "));
  EXPECT_EQ(Waiting(), 0u);
}

// A waiting request whose process dies is dropped at once (its tenant's
// place is given to the next), and one whose caller gives up (its call's
// deadline passes) is dropped too: neither takes memory later.
TEST_F(WaitingTest, DeadAndAbandonedWaitersAreDroppedAtOnce) {
  v1::AllocateRequest r;
  r.set_size_bytes(48 * kMiB);
  absl::StatusOr<v1::AllocateResponse> held = client_->AllocateRaw(r);
  ASSERT_TRUE(held.ok()) << held.status();
  // The doomed process's connections outlive it (a forked keeper holds
  // them), so its call is not cancelled: only its session's end can drop
  // its waiter.
  ChildProcess* doomed = Waiters(kHigh, 1, 40 * kMiB, 60000, /*keeper=*/true);
  ASSERT_EQ(doomed->ReadLine(30000), "sent 1");
  const std::string keeper_line = doomed->ReadLine(30000);
  pid_t keeper = 0;
  ASSERT_EQ(sscanf(keeper_line.c_str(), "keeper %d", &keeper), 1) << keeper_line;
  struct KillKeeper {
    pid_t pid;
    ~KillKeeper() { kill(pid, SIGKILL); }
  } kill_keeper{keeper};
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 1; }));
  ChildProcess* next = Waiters(kLow, 1, 40 * kMiB);
  ASSERT_EQ(next->ReadLine(30000), "sent 1");
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 2; }));
  const auto killed = Clock::now();
  doomed->Kill(SIGKILL);
  doomed->Wait();
  ASSERT_EQ(kill(keeper, 0), 0) << "the keeper died with the doomed process";
  // At once: long before its wait_ms (60 s); 2 s is the margin for a
  // sanitizer build on a loaded machine.
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 1; }, std::chrono::seconds(30)))
      << Waiting() << " waiting 30 s after the waiting process was killed";
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(2));

  // A caller that gives up: its call's deadline passes long before wait_ms.
  auto channel = grpc::CreateChannel("unix:" + daemon_->socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::GpuMemory::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  v1::AllocateRequest patient;
  patient.set_size_bytes(40 * kMiB);
  patient.set_wait_ms(60000);
  v1::AllocateResponse ignored;
  EXPECT_EQ(stub->Allocate(&ctx, patient, &ignored).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 1; }, std::chrono::seconds(5)))
      << Waiting() << " waiting after the caller gave up";

  // Room: the one that is left gets it, and nobody else took memory: the
  // 40 MiB in use are next's session's.
  ASSERT_TRUE(client_->Free(held->allocations(0).id()).ok());
  EXPECT_TRUE(absl::StartsWith(next->ReadLine(10000), "alloc "));
  v1::GetStatsResponse s = Stats();
  EXPECT_EQ(s.devices(0).used_bytes(), 40 * kMiB);
  EXPECT_EQ(s.counters().waiting_requests(), 0u);
  uint64_t next_holds = 0;
  for (const v1::SessionStats& session : s.sessions()) {
    EXPECT_NE(session.pid(), doomed->pid()) << "the killed process still has a session";
    if (session.pid() == next->pid()) next_holds = session.used_bytes();
  }
  EXPECT_EQ(next_holds, 40 * kMiB) << "the grant went to someone other than the live waiter";
}

}  // namespace
}  // namespace gpumem
