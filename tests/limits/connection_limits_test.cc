// Connection limits against a real gpumemd, with clients of other uids
// (setuid: root only, else skipped):
//  - the (N+1)th connection of a uid is closed at accept while another uid
//    and root still connect and allocate; the uid's count drops when its
//    gRPC connections close; the refusals are logged at most about once a
//    second, the lines adding up to every refusal;
//  - the fd reserve: with the daemon's RLIMIT_NOFILE at 600, a flood of
//    connections is cut off before the reserve, an already connected client
//    still gets new slabs (the daemon's handle exports never fail with "Too
//    many open files"), and root still connects;
//  - per connection: the server advertises SETTINGS_MAX_CONCURRENT_STREAMS
//    as set, and a request over --max_receive_message_size is refused
//    RESOURCE_EXHAUSTED while one under it is served.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::ChildProcess;
using testing::DaemonProcess;
using testing::PollUntil;
using testing::RunfilePath;

constexpr uid_t kFlooder = 65534;
constexpr uid_t kVictim = 65533;

class ConnectionLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
  }

  // Starts the daemon with `args`; with `nofile`, under that hard
  // RLIMIT_NOFILE and a soft one of half of it (the daemon raises its soft
  // limit to the hard one), set by a shell that then execs the daemon.
  void StartDaemon(std::vector<std::string> args, int nofile = 0) {
    daemon_ = std::make_unique<DaemonProcess>(std::move(args));
    if (nofile != 0) {
      const std::string wrapper = daemon_->dir() + "/gpumemd_low_nofile";
      std::ofstream(wrapper) << "#!/bin/sh\nulimit -Sn " << nofile / 2 << " && ulimit -Hn "
                             << nofile << " && exec " << RunfilePath("server/gpumemd")
                             << " \"$@\"\n";
      chmod(wrapper.c_str(), 0755);
      daemon_->SetBinary(wrapper);
    }
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
  }

  // limits_client's command line. Runfiles live under root's home, which
  // other uids cannot enter: the binary is copied next to the socket.
  std::vector<std::string> Client(std::vector<std::string> args) {
    const std::string copy = daemon_->dir() + "/limits_client";
    if (access(copy.c_str(), X_OK) != 0) {
      std::filesystem::copy_file(RunfilePath("tests/limits/limits_client"), copy,
                                 std::filesystem::copy_options::overwrite_existing);
      chmod(copy.c_str(), 0755);
    }
    std::vector<std::string> argv = {copy, "--socket=" + daemon_->socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // "open K closed M" of a flood of `n` connections by `uid`; the child
  // holds the open ones until it is destroyed.
  std::pair<int, int> Flood(std::unique_ptr<ChildProcess>* child, uid_t uid, int n) {
    *child = std::make_unique<ChildProcess>(Client({"--flood=" + std::to_string(n)}), uid);
    const std::string line = (*child)->ReadLine();
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    int open = -1, closed = -1;
    if (words.size() != 4 || !absl::SimpleAtoi(words[1], &open) ||
        !absl::SimpleAtoi(words[3], &closed)) {
      ADD_FAILURE() << "flood said \"" << line << "\"";
    }
    return {open, closed};
  }

  std::string AllocOnce(uid_t uid) {
    ChildProcess c(Client({"--alloc_once"}), uid);
    return c.ReadLine();
  }

  // The daemon's refusal lines that contain `what`, and the refusals they
  // add up to.
  std::pair<int, int64_t> RefusalLines(const std::string& what) {
    std::istringstream log(daemon_->Log());
    std::string line;
    int lines = 0;
    int64_t total = 0;
    while (std::getline(log, line)) {
      if (!absl::StrContains(line, "connection(s) refused since the last such line") ||
          !absl::StrContains(line, what)) {
        continue;
      }
      ++lines;
      std::vector<std::string> words = absl::StrSplit(line, ' ');
      int64_t n = 0;
      if (words.size() > 1 && absl::SimpleAtoi(words[1], &n)) total += n;
    }
    return {lines, total};
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ConnectionLimitsTest, UidCapClosesTheNextConnectionAndOthersStillServe) {
  StartDaemon({"--sim_devices=2x256MiB", "--slab_size=16MiB", "--max_connections_per_uid=8"});
  std::unique_ptr<ChildProcess> flood;
  const std::pair<int, int> first = Flood(&flood, kFlooder, 8 + 200);
  EXPECT_EQ(first.first, 8) << daemon_->Log();
  EXPECT_EQ(first.second, 200);

  // Another uid and root are not held back by the flooder's cap.
  EXPECT_EQ(AllocOnce(kVictim), "alloc ok") << daemon_->Log();
  EXPECT_EQ(AllocOnce(0), "alloc ok") << daemon_->Log();
  // Root is not counted against a cap at all.
  std::unique_ptr<ChildProcess> root_flood;
  EXPECT_EQ(Flood(&root_flood, 0, 20), std::make_pair(20, 0));
  root_flood.reset();

  // 200 refusals in about a second (or a few, on a slow machine) make a
  // handful of lines, not 200; once the sweep wrote the rest, the lines'
  // counts add up to every refusal.
  ASSERT_TRUE(PollUntil([&] { return RefusalLines("uid 65534 holds 8").second == 200; },
                        std::chrono::seconds(10)))
      << daemon_->Log();
  const std::pair<int, int64_t> lines = RefusalLines("uid 65534 holds 8");
  EXPECT_GE(lines.first, 1);
  EXPECT_LE(lines.first, 6) << daemon_->Log();
  EXPECT_TRUE(absl::StrContains(
      daemon_->Log(),
      "the most --max_connections_per_uid=8 (DaemonConfig.max_connections_per_uid) allows"));

  // The flooder's gRPC connections close with its process: its count drops
  // (gRPC closed those fds; the listener sees their sockets gone).
  flood.reset();
  bool back = PollUntil(
      [&] {
        std::unique_ptr<ChildProcess> again;
        return Flood(&again, kFlooder, 8) == std::make_pair(8, 0);
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(back) << daemon_->Log();
  EXPECT_EQ(daemon_->Stop(), 0);
}

TEST_F(ConnectionLimitsTest, FdReserveKeepsTheDaemonsOwnWorkAndRootsWayIn) {
  StartDaemon({"--sim_devices=4x256MiB", "--slab_size=16MiB",
               "--max_connections_per_uid=100000", "--fd_reserve=256"},
              /*nofile=*/600);
  EXPECT_TRUE(absl::StrContains(daemon_->Log(),
                                "open files: limit 600 (soft limit raised from 300)"))
      << daemon_->Log();
  const std::string go = daemon_->dir() + "/go";
  ChildProcess victim(Client({"--go_file=" + go, "--devices=1,2,3"}), kVictim);
  ASSERT_EQ(victim.ReadLine(), "connected") << daemon_->Log();

  std::unique_ptr<ChildProcess> flood;
  const std::pair<int, int> f = Flood(&flood, kFlooder, 800);
  // Cut off before the reserve: at most (600 - 256) / 3 connections in all
  // (each may hold three fds: its socket and its gRPC link's pair), and not
  // refused from the start either.
  EXPECT_LE(f.first, (600 - 256) / 3);
  EXPECT_GE(f.first, 60);
  EXPECT_EQ(f.first + f.second, 800);

  // The connected client's new slabs: created and exported by the daemon
  // with its own fds, while the flood holds every connection it could get.
  std::ofstream(go).put('1');
  for (const char* d : {"1", "2", "3"}) {
    EXPECT_EQ(victim.ReadLine(), std::string("alloc ") + d + " ok") << daemon_->Log();
  }
  EXPECT_EQ(victim.ReadLine(), "done");
  // Root may use the reserve's upper half.
  EXPECT_EQ(AllocOnce(0), "alloc ok") << daemon_->Log();

  const std::string log = daemon_->Log();
  EXPECT_TRUE(absl::StrContains(log, "fewer than --fd_reserve=256 (DaemonConfig.fd_reserve)"))
      << log;
  EXPECT_FALSE(absl::StrContains(log, "Too many open files")) << log;
  flood.reset();
  EXPECT_EQ(daemon_->Stop(), 0);
}

TEST_F(ConnectionLimitsTest, StreamsAdvertisedAndLargeMessagesRefused) {
  StartDaemon({"--sim_devices=1x256MiB", "--max_concurrent_streams=37",
               "--max_receive_message_size=1MiB"});
  ChildProcess settings(Client({"--settings"}), kVictim);
  EXPECT_EQ(settings.ReadLine(), "max_concurrent_streams 37");

  auto channel = grpc::CreateChannel("unix:" + daemon_->socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::GpuMemory::NewStub(channel);
  // GetStats padded with an unknown field: parsed (and ignored) when it fits
  // its method's limit (4 KiB); past gRPC's message limit, refused by gRPC.
  auto call = [&](size_t pad) {
    v1::GetStatsRequest req;
    req.GetReflection()->MutableUnknownFields(&req)->AddLengthDelimited(1000,
                                                                        std::string(pad, 'x'));
    v1::GetStatsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub->GetStats(&ctx, req, &resp);
  };
  const grpc::Status small = call(2 << 10);
  EXPECT_TRUE(small.ok()) << small.error_message();
  const grpc::Status large = call(2 << 20);
  EXPECT_EQ(large.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << large.error_message();
  // The connection stays usable for calls that fit.
  const grpc::Status after = call(16);
  EXPECT_TRUE(after.ok()) << after.error_message();
  EXPECT_EQ(daemon_->Stop(), 0);
}

}  // namespace
}  // namespace gpumem
