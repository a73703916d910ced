// The Clients of one process share its session (a C ABI pool and a C++
// Client side by side, as the chaos soak's workers run them). One of them
// closing a slab it had open must leave the slab held for another Client
// that still maps it: after a kill -9 of the daemon that one gives the
// handle back and its block survives, byte for byte, and frees normally.
// Before client/lib/cpp/process_open_slabs.h the first Client's close made the
// daemon forget the process held the slab; the restarted daemon then
// refused the other's handle (PERMISSION_DENIED: "was never given slab
// ...'s handle") and closed the block at the end of the grace time.
#include <signal.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

namespace gpumem {
namespace {

using client::Buffer;
using client::Client;

constexpr uint64_t kMiB = uint64_t{1} << 20;

bool Filled(const Buffer& b, char byte) {
  const char* p = static_cast<const char*>(b.data());
  for (uint64_t i = 0; i < b.size(); ++i) {
    if (p[i] != byte) return false;
  }
  return true;
}

TEST(SharedSessionTest, OneClientClosingASlabLeavesItHeldForAnotherAcrossRestarts) {
  const std::string dir = testing::MakeTempDir();
  const std::string socket = dir + "/gpumemd.sock";
  const std::vector<std::string> args = {testing::RunfilePath("server/gpumemd"),
                                         "--socket=" + socket,
                                         "--ledger=" + dir + "/ledger.db",
                                         "--state=" + dir + "/state",
                                         "--sim_devices=1x1GiB",
                                         "--slab_size=64MiB", "--min_slab_size=64MiB",
                                         "--empty_slab_release_seconds=0",
                                         "--restore_grace_seconds=3"};
  testing::FakeSystemd systemd(dir, /*fd_store=*/false);
  ASSERT_TRUE(systemd.Start(args, socket)) << systemd.Log();
  absl::StatusOr<std::unique_ptr<Client>> first = Client::Connect(socket);
  absl::StatusOr<std::unique_ptr<Client>> second = Client::Connect(socket);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // Both map the one slab; the second's block is the one that must stay.
    absl::StatusOr<Buffer> mine = (*first)->Allocate(kMiB);
    absl::StatusOr<Buffer> kept = (*second)->Allocate(2 * kMiB);
    ASSERT_TRUE(mine.ok()) << mine.status();
    ASSERT_TRUE(kept.ok()) << kept.status();
    absl::StatusOr<v1::GetStatsResponse> stats = (*second)->GetStats(false);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->devices(0).slab_count(), 1u) << "both blocks in one slab";
    memset(kept->data(), 'k', kept->size());
    // The first Client's last block in that slab: it closes the slab.
    ASSERT_TRUE(mine->Free().ok());

    systemd.Kill(SIGKILL);
    ASSERT_EQ(systemd.Wait(), -SIGKILL);
    ASSERT_TRUE(systemd.Start(args, socket)) << systemd.Log();
    // The second Client comes through the restart (its next call waits for
    // it), then the grace time ends: what no holder gave back is closed.
    ASSERT_TRUE(testing::PollUntil([&] {
      (void)(*second)->GetUsage();
      return (*second)->restarts() == static_cast<uint64_t>(round);
    }));
    absl::SleepFor(absl::Milliseconds(3500));
    EXPECT_TRUE(Filled(*kept, 'k'));
    const absl::Status freed = kept->Free();
    EXPECT_TRUE(freed.ok()) << freed << "\n" << systemd.Log();
  }
}

}  // namespace
}  // namespace gpumem
