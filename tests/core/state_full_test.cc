// An allocation the state file has no room for is refused, not served and
// lost at the next restart: the state file's disk fills (the allocator seam
// of server/state/durable_state.h answers ENOSPC, as a full tmpfs does) and
// the next Allocate that needs a new chunk of the allocations table gets
// RESOURCE_EXHAUSTED "state table full" naming the file, with nothing
// charged or kept; the caller's session and its other blocks are untouched,
// a Free makes room and the next Allocate is served from the freed slot.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/state/durable_state.h"
#include "tests/core/sleeping_child.h"

namespace gpumem {
namespace {

using ::gpumem::testing::SleepingChild;

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(StateFullTest, AnAllocationTheStateFileCannotKeepIsRefused) {
  char tmpl[] = "/tmp/gpumemd-state-full-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/state";
  std::atomic<bool> full{false};
  std::string note;
  state::Snapshot previous;
  auto state = state::DurableState::Open(
      path, &previous, &note, [&full](int fd, uint64_t offset, uint64_t bytes) {
        if (full.load()) return ENOSPC;
        return posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes));
      });
  ASSERT_TRUE(state.ok()) << state.status();
  SimBackend backend({4096 * kMiB});
  BrokerOptions o;
  o.pool.slab_size = 64 * kMiB;
  o.pool.granularity = 4096;
  o.state = state->get();
  o.reclaim_wait = absl::ZeroDuration();
  auto broker = std::make_unique<MemoryBroker>(&backend, o);
  ASSERT_TRUE(broker->Start().ok());
  SleepingChild proc;
  const PeerCred caller = proc.Cred(4401, 4401);

  full.store(true);  // the disk is full from now on
  std::vector<uint64_t> ids;
  absl::Status refused;
  for (int i = 0; i < 200000 && refused.ok(); ++i) {
    v1::AllocateRequest r;
    r.set_size_bytes(4096);
    auto a = broker->AllocateAndWait(caller, r);
    if (a.ok()) {
      ids.push_back(a->allocations(0).id());
    } else {
      refused = a.status();
    }
  }
  ASSERT_FALSE(refused.ok()) << "the allocations table never filled";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "state table full")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), path)) << refused;
  ASSERT_GT(ids.size(), 0u);
  EXPECT_EQ(broker->live_allocations(), ids.size());
  // Refused again while full; the session and its blocks are as they were.
  v1::AllocateRequest r;
  r.set_size_bytes(4096);
  EXPECT_FALSE(broker->AllocateAndWait(caller, r).ok());
  EXPECT_EQ(broker->live_allocations(), ids.size());
  // A Free makes a slot: the next allocation is kept there.
  v1::FreeRequest f;
  f.set_id(ids.back());
  ASSERT_TRUE(broker->Free(caller, f).ok());
  auto again = broker->AllocateAndWait(caller, r);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(broker->live_allocations(), ids.size());
  broker.reset();
  state->reset();
  std::string cmd = std::string("rm -rf ") + tmpl;
  EXPECT_EQ(system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace gpumem
