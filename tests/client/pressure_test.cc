// Memory pressure across processes, against a real daemon: process A (the C
// ABI's caching pool) holds idle leases filling most of a small device and
// then sits idle, making no library call; process B's request that fits
// only if A gives back is served, because the daemon asks A over its stream
// and A's library returns its empty leases by itself.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/lib/cpp/client.h"
#include "client/lib/include/gpumem.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace {

using gpumem::testing::DaemonProcess;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// Process A: fills 7 leases of 8 MiB with 1 MiB blocks, frees them all (they
// stay cached: leased, not in use), says "ready" on `out` and sleeps until
// killed. Exits non-zero if the library fails.
[[noreturn]] void RunIdleCacher(const std::string& socket, int out) {
  setenv("GPUMEM_LEASE_SIZE", "8MiB", 1);
  setenv("GPUMEM_IDLE_RELEASE_MS", "600000", 1);  // never gives back by itself
  gpumem_client* c = gpumem_connect(socket.c_str());
  if (c == nullptr) _exit(10);
  std::vector<void*> blocks;
  for (int i = 0; i < 56; ++i) {
    void* p = nullptr;
    if (gpumem_malloc(c, kMiB, nullptr, &p) != GPUMEM_OK) _exit(11);
    blocks.push_back(p);
  }
  for (void* p : blocks) {
    if (gpumem_free(c, p) != GPUMEM_OK) _exit(12);
  }
  if (write(out, "r", 1) != 1) _exit(13);
  for (;;) pause();
}

// The session of `pid` in the daemon's stats, or nullptr.
const gpumem::v1::SessionStats* SessionOf(const gpumem::v1::GetStatsResponse& s,
                                          pid_t pid) {
  for (const auto& ss : s.sessions()) {
    if (ss.pid() == pid) return &ss;
  }
  return nullptr;
}

TEST(PressureTest, AnIdleProcessGivesBackItsCachedLeasesWhenAnotherNeedsRoom) {
  DaemonProcess daemon({"--sim_devices=1x64MiB", "--slab_size=64MiB"});
  ASSERT_TRUE(daemon.Start()) << daemon.Log();

  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t a = fork();
  ASSERT_GE(a, 0);
  if (a == 0) {
    close(pipe_fds[0]);
    RunIdleCacher(daemon.socket(), pipe_fds[1]);
  }
  close(pipe_fds[1]);
  char ready = 0;
  ASSERT_EQ(read(pipe_fds[0], &ready, 1), 1) << "process A failed; " << daemon.Log();
  close(pipe_fds[0]);

  absl::StatusOr<std::unique_ptr<gpumem::client::Client>> b =
      gpumem::client::Client::Connect(daemon.socket());
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<gpumem::v1::GetStatsResponse> before = (*b)->GetStats();
  ASSERT_TRUE(before.ok()) << before.status();
  const gpumem::v1::SessionStats* sa = SessionOf(*before, a);
  ASSERT_NE(sa, nullptr) << before->DebugString();
  EXPECT_EQ(sa->leased_bytes(), 56 * kMiB) << sa->DebugString();
  EXPECT_LT(sa->in_use_bytes(), sa->leased_bytes()) << sa->DebugString();
  ASSERT_LT(before->devices(0).free_bytes(), 32 * kMiB)
      << "B's request would fit without A: " << before->DebugString();

  // B asks for 32 MiB, waiting up to 10 s (a loaded machine) for room.
  gpumem::v1::AllocateRequest want;
  want.set_size_bytes(32 * kMiB);
  want.set_wait_ms(10000);
  absl::StatusOr<gpumem::v1::AllocateResponse> got = (*b)->AllocateRaw(want);
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << daemon.Log();
  ASSERT_EQ(got->allocations_size(), 1);
  EXPECT_EQ(got->allocations(0).size_bytes(), 32 * kMiB);

  // A gives back every empty lease (B may be served before A's last Frees
  // arrive: wait up to 10 s for them), stays alive, and says so in its
  // reports (its last Free carries leased 0).
  absl::StatusOr<gpumem::v1::GetStatsResponse> after;
  for (int i = 0; i < 200; ++i) {
    after = (*b)->GetStats();
    ASSERT_TRUE(after.ok()) << after.status();
    sa = SessionOf(*after, a);
    ASSERT_NE(sa, nullptr) << after->DebugString();
    if (sa->used_bytes() == 0) break;
    usleep(50 * 1000);
  }
  EXPECT_EQ(waitpid(a, nullptr, WNOHANG), 0) << "process A exited";
  EXPECT_EQ(sa->used_bytes(), 0u) << sa->DebugString();
  EXPECT_EQ(sa->leased_bytes(), 0u) << sa->DebugString();
  EXPECT_TRUE((*b)->Free(got->allocations(0).id()).ok());

  kill(a, SIGKILL);
  waitpid(a, nullptr, 0);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

}  // namespace
