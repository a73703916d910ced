// The project's TSan suppressions (common/tsan_support.cc) do not hide races
// in code reached from an RPC handler: planted_race_server races on purpose
// in a unary handler, and under --config=tsan this test runs it and asserts
// TSan reported the race, in PlantedRaceWrite. Its locked control must draw
// no report (what remains suppressed is enough for gRPC itself), and the old
// namespace-wide line, `race:grpc::internal::`, added back through
// TSAN_OPTIONS=suppressions, must hide the planted race again: that is what
// the line did, and why it is gone. An async variant (completion queues, as
// the daemon serves) must be reported too: tsan_support's completion-queue
// annotations must not order two handlers.
//
// In a plain build there is no TSan: the program must still serve both calls
// (exit 0), and the TSan cases are skipped, saying so.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

std::string RunfilePath(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return rel;
  return std::string(srcdir) + "/" + workspace + "/" + rel;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

struct Result {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr
};

// Runs planted_race_server `mode` with TSAN_OPTIONS=`tsan_options`.
Result RunServer(const std::string& mode, const std::string& tsan_options) {
  const std::string out_path = TempPath("planted_race_" + mode + ".out");
  const std::string binary = RunfilePath("tests/common/planted_race_server");
  const std::string mode_arg = "--mode=" + mode;
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) _exit(120);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("TSAN_OPTIONS", tsan_options.c_str(), 1);
    execl(binary.c_str(), binary.c_str(), mode_arg.c_str(), static_cast<char*>(nullptr));
    _exit(121);
  }
  Result r;
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::ifstream in(out_path);
  std::stringstream text;
  text << in.rdbuf();
  r.output = text.str();
  return r;
}

// Reports are kept going (halt_on_error=0) so the program answers both calls
// and exits; TSan turns the exit code into 66 when it reported anything.
const std::string kReportAll = "halt_on_error=0 exitcode=66";

TEST(PlantedRaceTest, ServerAnswersBothCalls) {
  const Result r = RunServer("race", kReportAll);
  EXPECT_NE(r.output.find("answered 2 calls"), std::string::npos) << r.output;
  if (!kTsan) EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(PlantedRaceTest, TsanReportsTheRaceInTheHandler) {
  if (!kTsan) GTEST_SKIP() << "not a TSan build: run with --config=tsan to check the report";
  const Result r = RunServer("race", kReportAll);
  EXPECT_EQ(r.exit_code, 66) << r.output;
  EXPECT_NE(r.output.find("WARNING: ThreadSanitizer: data race"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("PlantedRaceWrite"), std::string::npos) << r.output;
  // The planted race is reached through the frames the old suppression
  // matched: the report's stacks name them.
  EXPECT_NE(r.output.find("grpc::internal::RpcMethodHandler"), std::string::npos)
      << r.output;
}

// The daemon serves its unary calls asynchronously from completion queues; the
// queue hand-offs tsan_support tells TSan of must not order two handlers.
TEST(PlantedRaceTest, TsanReportsTheRaceInAnAsyncHandler) {
  const Result r = RunServer("async_race", kReportAll);
  EXPECT_NE(r.output.find("answered 2 calls"), std::string::npos) << r.output;
  if (!kTsan) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    GTEST_SKIP() << "not a TSan build: run with --config=tsan to check the report";
  }
  EXPECT_EQ(r.exit_code, 66) << r.output;
  EXPECT_NE(r.output.find("WARNING: ThreadSanitizer: data race"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("PlantedAsyncRaceWrite"), std::string::npos) << r.output;
}

TEST(PlantedRaceTest, LockedControlDrawsNoReport) {
  if (!kTsan) GTEST_SKIP() << "not a TSan build: run with --config=tsan to check the report";
  const Result r = RunServer("locked", kReportAll);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("WARNING: ThreadSanitizer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("answered 2 calls"), std::string::npos) << r.output;
}

TEST(PlantedRaceTest, OldNamespaceSuppressionHidesIt) {
  if (!kTsan) GTEST_SKIP() << "not a TSan build: run with --config=tsan to check the report";
  const std::string supp = TempPath("old_grpc_internal.supp");
  {
    std::ofstream f(supp);
    f << "race:grpc::internal::\n";
  }
  const Result r = RunServer("race", kReportAll + " suppressions=" + supp);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("WARNING: ThreadSanitizer: data race"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("answered 2 calls"), std::string::npos) << r.output;
}

}  // namespace
