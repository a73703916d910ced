// Server reflection cannot be held by one user: the daemon serves it on its
// own completion queues (no thread per stream), at most
// --max_reflection_streams_per_uid streams per uid at once (one more is
// ended RESOURCE_EXHAUSTED naming the setting), and a stream that sends no
// request for 10 s is closed. While one uid holds its streams, root and
// other uids still list the daemon's services. Clients run as other uids
// (setuid) where the test runs as root.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_client_test.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::ChildProcess;
using testing::DaemonClientTest;
using testing::RunfilePath;

constexpr uid_t kAttacker = 65534;
constexpr uid_t kOtherUser = 65533;

class ReflectionLimitsTest : public DaemonClientTest {
 protected:
  ReflectionLimitsTest()
      : DaemonClientTest({"--sim_devices=1x256MiB", "--max_reflection_streams_per_uid=3"}) {}

  std::unique_ptr<ChildProcess> Probe(uid_t as, int hold_ms = 0) {
    // Where other uids can run it (runfiles live under root's home).
    const std::string copy = daemon_->dir() + "/reflection_probe";
    if (access(copy.c_str(), X_OK) != 0) {
      std::filesystem::copy_file(RunfilePath("tests/integration/reflection_probe"), copy,
                                 std::filesystem::copy_options::overwrite_existing);
      chmod(copy.c_str(), 0755);
    }
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{copy, "--socket=" + daemon_->socket(),
                                 "--hold_ms=" + std::to_string(hold_ms)},
        as == geteuid() ? 0 : as);
  }

  // The probe's one line, as `as`.
  std::string ProbeLine(uid_t as) {
    auto p = Probe(as);
    std::string line = p->ReadLine();
    p->Wait();
    return line;
  }
};

TEST_F(ReflectionLimitsTest, HeldStreamsAreCappedPerUidAndOthersStillReflect) {
  const bool root = geteuid() == 0;
  const uid_t attacker = root ? kAttacker : geteuid();
  ASSERT_EQ(ProbeLine(attacker), "listed");
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->GetStats().ok());
  const int threads_before = testing::ThreadCountBesidesGrpcTimers(daemon_->pid());

  // Eight streams held 8 s each by one uid: three are served, five refused.
  std::vector<std::unique_ptr<ChildProcess>> holders;
  for (int i = 0; i < 8; ++i) holders.push_back(Probe(attacker, 8000));
  int listed = 0;
  for (auto& h : holders) {
    const std::string line = h->ReadLine();
    if (line == "listed") {
      ++listed;
      continue;
    }
    EXPECT_EQ(line.rfind("ended 8 ", 0), 0u) << line;  // RESOURCE_EXHAUSTED
    EXPECT_NE(line.find("already has 3 reflection streams open"), std::string::npos) << line;
    EXPECT_NE(line.find("--max_reflection_streams_per_uid"), std::string::npos) << line;
  }
  EXPECT_EQ(listed, 3);
  // While they are held: no thread per stream, and everyone else reflects.
  EXPECT_LE(testing::ThreadCountBesidesGrpcTimers(daemon_->pid()), threads_before + 2);
  if (root) {
    EXPECT_EQ(ProbeLine(0), "listed");
    EXPECT_EQ(ProbeLine(kOtherUser), "listed");
  }
  EXPECT_TRUE(client_->GetStats().ok());
  for (auto& h : holders) h->Wait();
  // Their streams ended with their processes: the uid reflects again.
  EXPECT_TRUE(testing::PollUntil([&] { return ProbeLine(attacker) == "listed"; }));
}

TEST_F(ReflectionLimitsTest, AnIdleStreamIsClosedAfterTenSeconds) {
  auto p = Probe(geteuid() == 0 ? kAttacker : geteuid(), 30000);
  ASSERT_EQ(p->ReadLine(), "listed");
  const std::string line = p->ReadLine(40000);
  EXPECT_EQ(line.rfind("ended 4 ", 0), 0u) << line;  // DEADLINE_EXCEEDED
  EXPECT_NE(line.find("sent no request for 10s"), std::string::npos) << line;
  p->Wait();
}

}  // namespace
}  // namespace gpumem
