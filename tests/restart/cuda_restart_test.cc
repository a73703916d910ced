// A restart on the cuda backend, judged by the strict fake driver
// (tests/fake_cuda): a VMM block written before gpumemd is killed with -9 is
// intact afterwards and frees normally (its memory lives on in the fd the
// fd store kept, or in the client's own import, which gives its fd back);
// a legacy IPC block does not survive (that memory dies with the daemon's
// context) and its owner is told so, by name.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "client/lib/include/gpumem.h"
#include "common/cuda_driver.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

namespace gpumem {
namespace {

using client::Buffer;
using client::Client;
using testing::FakeSystemd;

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string FakeDriverPath() { return testing::RunfilePath("tests/fake_cuda/libcuda.so.1"); }

class CudaRestartTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    socket_ = dir_ + "/gpumemd.sock";
    args_ = {testing::RunfilePath("server/gpumemd"), "--backend=cuda",
             "--socket=" + socket_, "--ledger=" + dir_ + "/ledger.db",
             "--state=" + dir_ + "/state", "--slab_size=16MiB",
             "--handle_kinds=cuda_vmm_fd,cuda_ipc"};
    systemd_ = std::make_unique<FakeSystemd>(dir_, /*fd_store=*/GetParam());
    ASSERT_TRUE(systemd_->Start(args_, socket_)) << systemd_->Log();
  }
  void TearDown() override {
    systemd_.reset();
    // What the fake driver saw done wrong, in this process or the daemons.
    std::ifstream in(getenv("FAKE_CUDA_VIOLATIONS"));
    std::string line, all;
    while (std::getline(in, line)) all += line + "\n";
    EXPECT_EQ(all, "") << "driver rules broken";
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  void KillAndRestart(Client& c) {
    const uint64_t before = c.restarts();
    systemd_->Kill(SIGKILL);
    ASSERT_EQ(systemd_->Wait(), -SIGKILL);
    ASSERT_TRUE(systemd_->Start(args_, socket_)) << systemd_->Log();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (c.restarts() == before && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_GT(c.restarts(), before) << systemd_->Log();
  }

  std::string dir_, socket_;
  std::vector<std::string> args_;
  std::unique_ptr<FakeSystemd> systemd_;
};

TEST_P(CudaRestartTest, AVmmBlockSurvivesAKillAndALegacyIpcBlockIsLostByName) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_);
  ASSERT_TRUE(c.ok()) << c.status();
  Client& client = **c;
  std::vector<Client::RestartReport> reports;
  client.OnRestart([&reports](const Client::RestartReport& r) { reports.push_back(r); });

  absl::StatusOr<Buffer> vmm = client.Allocate(2 * kMiB);
  ASSERT_TRUE(vmm.ok()) << vmm.status();
  ASSERT_EQ(vmm->allocation().handle_kind(), v1::HANDLE_KIND_CUDA_VMM_FD);
  std::vector<unsigned char> pattern(2 * kMiB);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 3);
  ASSERT_TRUE(vmm->Write(0, pattern.data(), pattern.size()).ok());
  void* const address = vmm->data();

  // And a block of the C ABI's caching pool (in a lease).
  gpumem_client* pool = gpumem_connect(socket_.c_str());
  ASSERT_NE(pool, nullptr) << gpumem_last_error_message();
  void* pooled = nullptr;
  ASSERT_EQ(gpumem_malloc(pool, kMiB, nullptr, &pooled), GPUMEM_OK) << gpumem_last_error_message();

  client.SetHandleKind(v1::HANDLE_KIND_CUDA_IPC);
  absl::StatusOr<Buffer> ipc = client.Allocate(kMiB);
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  const uint64_t ipc_id = ipc->id();
  client.SetHandleKind(v1::HANDLE_KIND_UNSPECIFIED);

  ASSERT_NO_FATAL_FAILURE(KillAndRestart(client));

  // The VMM block: same id, same address, same bytes, freed normally.
  EXPECT_FALSE(client.IsLost(vmm->id())) << systemd_->Log();
  EXPECT_EQ(vmm->data(), address);
  std::vector<unsigned char> back(pattern.size());
  ASSERT_TRUE(vmm->Read(0, back.data(), back.size()).ok());
  EXPECT_TRUE(back == pattern) << "the VMM block's bytes changed over the restart";
  // The IPC block: lost, by name.
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_EQ(reports[0].lost.size(), 1u);
  EXPECT_EQ(reports[0].lost[0].first, ipc_id);
  EXPECT_TRUE(absl::StrContains(reports[0].lost[0].second.message(), "legacy CUDA IPC"))
      << reports[0].lost[0].second;
  EXPECT_TRUE(client.IsLost(ipc_id));
  absl::Status ipc_free = ipc->Free();
  EXPECT_EQ(ipc_free.code(), absl::StatusCode::kNotFound) << ipc_free;
  // Serving goes on: a new block, and the survivor's free.
  absl::StatusOr<Buffer> fresh = client.Allocate(kMiB);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->Free().ok());
  EXPECT_TRUE(vmm->Free().ok());
  // The pool's lease survived too: its block frees normally.
  char* stats = nullptr;  // waits for the pool's client to come through
  ASSERT_EQ(gpumem_stats_json(pool, &stats), GPUMEM_OK) << gpumem_last_error_message();
  EXPECT_TRUE(absl::StrContains(stats, "\"generation\":2")) << stats;
  EXPECT_TRUE(absl::StrContains(stats, "\"lost_bytes\":0")) << stats;
  gpumem_string_free(stats);
  EXPECT_EQ(gpumem_free(pool, pooled), GPUMEM_OK) << gpumem_last_error_message() << systemd_->Log();
  gpumem_close(pool);
  if (!GetParam()) {
    EXPECT_TRUE(absl::StrContains(systemd_->Log(), "wait for a client to give their handle back"))
        << systemd_->Log();
  }
}

INSTANTIATE_TEST_SUITE_P(FdStore, CudaRestartTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "WithFdStore" : "ClientsGiveHandlesBack"; });

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  setenv("FAKE_CUDA_DEVICES", "2x256MiB", 1);
  char violations[] = "/tmp/gpumemd-cuda-restart-XXXXXX";
  const int vfd = mkstemp(violations);
  if (vfd < 0) return 2;
  close(vfd);
  setenv("FAKE_CUDA_VIOLATIONS", violations, 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  // The daemon (a child) finds the fake by LD_LIBRARY_PATH; this process
  // loads it by path first, so the library's dlopen("libcuda.so.1") gets it.
  const std::string lib = gpumem::FakeDriverPath();
  setenv("LD_LIBRARY_PATH", lib.substr(0, lib.rfind('/')).c_str(), 1);
  if (!gpumem::LoadCudaDriver(lib.c_str()).ok()) return 2;
  const int rc = RUN_ALL_TESTS();
  unlink(violations);
  return rc;
}
