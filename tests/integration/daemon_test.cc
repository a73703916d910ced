// End-to-end tests against a real gpumemd process and real client processes:
// clients are separate programs (test_client) that the test starts, kills
// with SIGKILL and watches, and the daemon's own GetStats is the witness
// that every byte came back.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_client_test.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
using client::Client;
namespace {

using testing::ChildProcess;
using testing::DaemonClientTest;
using testing::DaemonProcess;
using testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Alloc {
  uint64_t id, device, slab, offset, size;
};

class DaemonTest : public DaemonClientTest {
 protected:
  DaemonTest() : DaemonClientTest({"--sim_devices=4x1GiB", "--slab_size=64MiB"}) {}

  uint64_t TotalUsed() {
    uint64_t t = 0;
    for (uint64_t u : UsedPerDevice()) t += u;
    return t;
  }
  bool HasSessionFor(pid_t pid) {
    auto stats = client_->GetStats();
    if (!stats.ok()) return false;
    for (const auto& s : stats->sessions()) {
      if (s.pid() == pid) return true;
    }
    return false;
  }

  std::unique_ptr<ChildProcess> StartHolder(uint64_t size, int count,
                                            const std::string& devices,
                                            std::vector<Alloc>* allocs,
                                            const std::string& then = "hold") {
    std::vector<std::string> argv = {RunfilePath("tests/integration/test_client"),
                                     "--socket=" + daemon_->socket(),
                                     "--size=" + std::to_string(size),
                                     "--count=" + std::to_string(count),
                                     "--then=" + then};
    if (!devices.empty()) argv.push_back("--devices=" + devices);
    auto child = std::make_unique<ChildProcess>(argv);
    for (;;) {
      std::string line = child->ReadLine();
      if (line == "ready") break;
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() != 6 || f[0] != "alloc") {
        ADD_FAILURE() << "client said: \"" << line << "\"";
        return child;
      }
      Alloc a;
      EXPECT_TRUE(absl::SimpleAtoi(f[1], &a.id) && absl::SimpleAtoi(f[2], &a.device) &&
                  absl::SimpleAtoi(f[3], &a.slab) && absl::SimpleAtoi(f[4], &a.offset) &&
                  absl::SimpleAtoi(f[5], &a.size));
      if (allocs) allocs->push_back(a);
    }
    return child;
  }

  // Polls until total used bytes equal `want`; returns the time it took, or
  // a negative duration on timeout (5 s).
  double SecondsUntilUsed(uint64_t want) {
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      double elapsed = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start).count();
      if (TotalUsed() == want) return elapsed;
      if (elapsed > 5) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::string ClientRun(const std::vector<std::string>& args, uid_t uid = 0) {
    std::string binary = RunfilePath("tests/integration/test_client");
    if (uid != 0) {
      // Runfiles live under root's home, which other uids cannot enter.
      const std::string copy = daemon_->dir() + "/test_client";
      std::filesystem::copy_file(binary, copy,
                                 std::filesystem::copy_options::overwrite_existing);
      chmod(copy.c_str(), 0755);
      binary = copy;
    }
    std::vector<std::string> argv = {binary,
                                     "--socket=" + daemon_->socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess child(argv, uid);
    std::string line = child.ReadLine();
    const int status = child.Wait();
    if (line.empty()) return "no output, exit status " + std::to_string(status);
    return line;
  }
};

TEST_F(DaemonTest, SigkilledClientsMemoryReturnsWithinOneSecond) {
  const std::vector<uint64_t> before = UsedPerDevice();
  std::vector<Alloc> allocs;
  auto child = StartHolder(8 * kMiB, 3, "0,1", &allocs);
  ASSERT_EQ(allocs.size(), 3u);
  std::vector<uint64_t> during = UsedPerDevice();
  EXPECT_EQ(during[0], before[0] + 16 * kMiB);  // allocations 1 and 3
  EXPECT_EQ(during[1], before[1] + 8 * kMiB);
  EXPECT_TRUE(HasSessionFor(child->pid()));

  const pid_t pid = child->pid();
  child->Kill(SIGKILL);
  EXPECT_EQ(child->Wait(), -SIGKILL);
  double seconds = SecondsUntilUsed(before[0] + before[1] + before[2] + before[3]);
  ASSERT_GE(seconds, 0) << "memory of a SIGKILLed client never came back";
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(UsedPerDevice(), before);
  EXPECT_FALSE(HasSessionFor(pid));
}

TEST_F(DaemonTest, KillingOneOfSeveralClientsReturnsExactlyItsBytes) {
  const uint64_t base = TotalUsed();
  auto a = StartHolder(3 * kMiB, 2, "", nullptr);
  auto b = StartHolder(5 * kMiB, 4, "", nullptr);
  auto c = StartHolder(7 * kMiB, 1, "2", nullptr);
  ASSERT_EQ(TotalUsed(), base + 6 * kMiB + 20 * kMiB + 7 * kMiB);
  b->Kill(SIGKILL);
  b->Wait();
  double seconds = SecondsUntilUsed(base + 13 * kMiB);
  ASSERT_GE(seconds, 0);
  EXPECT_LT(seconds, 1.0);
  a->Kill(SIGKILL);
  c->Kill(SIGKILL);
  a->Wait();
  c->Wait();
  ASSERT_GE(SecondsUntilUsed(base), 0);
}

TEST_F(DaemonTest, ClientThatExitsWithoutFreeingIsReclaimed) {
  const uint64_t base = TotalUsed();
  auto child = StartHolder(kMiB, 5, "", nullptr, "exit");
  EXPECT_EQ(child->Wait(), 0);
  double seconds = SecondsUntilUsed(base);
  ASSERT_GE(seconds, 0);
  EXPECT_LT(seconds, 1.0);
}

TEST_F(DaemonTest, ClientThatFreesLeavesNothingBehind) {
  const uint64_t base = TotalUsed();
  auto child = StartHolder(2 * kMiB, 3, "", nullptr, "free");
  EXPECT_EQ(child->ReadLine(), "freed");
  EXPECT_EQ(child->Wait(), 0);
  EXPECT_EQ(TotalUsed(), base);
}

TEST_F(DaemonTest, BytesAreSharedBetweenProcessesOfOneUser) {
  std::vector<Alloc> allocs;
  auto holder = StartHolder(kMiB, 1, "3", &allocs);
  ASSERT_EQ(allocs.size(), 1u);
  const Alloc& a = allocs[0];
  EXPECT_EQ(a.device, 3u);
  const std::string expect = std::to_string(a.id & 0xff);
  // Another process maps the same slab and sees what the holder wrote.
  EXPECT_EQ(ClientRun({"--read_slab=" + std::to_string(a.slab),
                       "--offset=" + std::to_string(a.offset + a.size - 1),
                       "--expect=" + expect}),
            "read ok");
  holder->Kill(SIGKILL);
  holder->Wait();
  ASSERT_GE(SecondsUntilUsed(0), 0);
  // With no live block left in it, the slab is still its tenant's (root's)
  // until released, and never another uid's: to that uid it is a slab that
  // does not exist (NOT_FOUND, no oracle).
  if (geteuid() == 0) {
    EXPECT_EQ(ClientRun({"--read_slab=" + std::to_string(a.slab), "--offset=0",
                         "--expect=0"}, 65534),
              "error 5");  // NOT_FOUND
  }
}

TEST_F(DaemonTest, AnotherUserCanNeitherFreeNorMapTheMemory) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  std::vector<Alloc> allocs;
  auto holder = StartHolder(kMiB, 1, "", &allocs);
  ASSERT_EQ(allocs.size(), 1u);
  const uid_t nobody = 65534;
  // Answered as ids that do not exist (NOT_FOUND): no oracle of live ids.
  EXPECT_EQ(ClientRun({"--free=" + std::to_string(allocs[0].id)}, nobody),
            "status 5");  // NOT_FOUND
  EXPECT_EQ(ClientRun({"--read_slab=" + std::to_string(allocs[0].slab),
                       "--offset=0", "--expect=0"}, nobody),
            "error 5");
  EXPECT_EQ(TotalUsed(), kMiB);
  // The owner's uid (root here) may free it from another process.
  EXPECT_EQ(ClientRun({"--free=" + std::to_string(allocs[0].id)}), "status 0");
  EXPECT_EQ(TotalUsed(), 0u);
}

TEST_F(DaemonTest, BadInputGetsPreciseStatusesAndTheDaemonKeepsServing) {
  v1::AllocateRequest req;
  req.set_size_bytes(0);
  auto r = client_->AllocateRaw(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("size"), absl::string_view::npos);

  req.set_size_bytes(2 * (uint64_t{1} << 30));  // devices are 1 GiB
  r = client_->AllocateRaw(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("larger than any device"), absl::string_view::npos)
      << r.status();

  req.set_size_bytes(kMiB);
  req.mutable_placement()->add_devices("9");
  r = client_->AllocateRaw(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("\"9\""), absl::string_view::npos) << r.status();

  req.clear_placement();
  req.set_alignment(3);
  r = client_->AllocateRaw(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  absl::Status s = client_->Free(123456);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("123456"), absl::string_view::npos);

  req.set_alignment(0);
  r = client_->AllocateRaw(req);
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t id = r->allocations(0).id();
  EXPECT_TRUE(client_->Free(id).ok());
  EXPECT_EQ(client_->Free(id).code(), absl::StatusCode::kNotFound);  // twice

  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->devices_size(), 4);
  EXPECT_EQ(TotalUsed(), 0u);
}

TEST_F(DaemonTest, CapacityIsEnforcedPerDevice) {
  v1::AllocateRequest req;
  req.set_size_bytes(700 * kMiB);
  req.mutable_placement()->add_devices("1");
  auto first = client_->AllocateRaw(req);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = client_->AllocateRaw(req);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("capacity"), absl::string_view::npos)
      << second.status();
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->devices(1).used_bytes(), 700 * kMiB);
  EXPECT_LE(stats->devices(1).pooled_bytes(), stats->devices(1).total_bytes());
  EXPECT_TRUE(client_->Free(first->allocations(0).id()).ok());
}

TEST_F(DaemonTest, MappedMemoryIsReadableAndWritable) {
  auto b = client_->Allocate(3 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  auto* p = static_cast<unsigned char*>(b->data());
  ASSERT_NE(p, nullptr);
  for (uint64_t i = 0; i < b->size(); i += 512) p[i] = static_cast<unsigned char>(i >> 9);
  for (uint64_t i = 0; i < b->size(); i += 512) {
    ASSERT_EQ(p[i], static_cast<unsigned char>(i >> 9));
  }
  // Two buffers in one slab share one mapping and do not overlap.
  auto c = client_->Allocate(kMiB, {}, 4096);
  ASSERT_TRUE(c.ok());
  if (c->allocation().slab_id() == b->allocation().slab_id()) {
    const uint64_t b0 = b->allocation().offset(), c0 = c->allocation().offset();
    EXPECT_TRUE(b0 + b->size() <= c0 || c0 + c->size() <= b0);
  }
  EXPECT_EQ(c->allocation().offset() % 4096, 0u);
  EXPECT_EQ(TotalUsed(), 4 * kMiB);
}

TEST(DaemonLifecycleTest, SigtermStopsCleanlyWithLiveAllocationsAndRemovesTheSocket) {
  DaemonProcess daemon({"--sim_devices=2x256MiB", "--slab_size=32MiB"});
  ASSERT_TRUE(daemon.Start()) << daemon.Log();
  ChildProcess holder({RunfilePath("tests/integration/test_client"),
                       "--socket=" + daemon.socket(), "--size=1048576", "--count=2"});
  std::string line;
  do {
    line = holder.ReadLine();
  } while (!line.empty() && line != "ready");
  ASSERT_EQ(line, "ready");
  const std::string socket = daemon.socket();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
  struct stat st;
  EXPECT_NE(stat(socket.c_str(), &st), 0) << "socket file left behind";
  EXPECT_NE(daemon.Log().find("every slab released"), std::string::npos) << daemon.Log();
}

TEST(DaemonLifecycleTest, ASecondDaemonOnTheSameSocketRefusesToStart) {
  DaemonProcess first({"--sim_devices=1x64MiB"});
  ASSERT_TRUE(first.Start());
  // Its own ledger (none), so the socket is the only thing they share.
  ChildProcess second({RunfilePath("server/gpumemd"), "--socket=" + first.socket(),
                       "--ledger=none", "--sim_devices=1x64MiB"});
  EXPECT_EQ(second.Wait(), 1);
  // The first one is still serving.
  auto c = Client::Connect(first.socket());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->GetStats().ok());
  EXPECT_EQ(first.Stop(), 0);
}

TEST(DaemonLifecycleTest, BadFlagsExitWithStatusOne) {
  for (const char* bad : {"--sim_devices=4x", "--backend=tpu", "--slab_size=lots"}) {
    ChildProcess d({RunfilePath("server/gpumemd"), "--socket=/tmp/gpumemd-bad.sock",
                    "--ledger=none", bad});
    EXPECT_EQ(d.Wait(), 1) << bad;
  }
}

}  // namespace
}  // namespace gpumem
