// ThreadCaches on a recording upstream: a thread's freed host block serves
// its next allocation of the class without going upstream; the per-class
// and per-cache limits, device memory, lost leases and large requests pass
// upstream; a thread that exits, DrainAll and DrainIdle give the blocks
// back; more arenas than a thread has slots for are served uncached.
#include "client/lib/pool/thread_caches.h"

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/lib/pool/size_classes.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace client {
namespace {

using size_classes::ClassOf;
using size_classes::ClassSize;

// Hands out consecutive class blocks of one lease and records what comes back.
class RecordingUpstream : public BlockResource {
 public:
  explicit RecordingUpstream(Lease* lease) : lease_(lease) {}
  absl::StatusOr<Block> Allocate(uint64_t size, const Arena&) override {
    absl::MutexLock lock(&mu_);
    ++allocations_;
    Block b;
    b.cls = ClassOf(size);
    b.bytes = ClassSize(b.cls);
    b.ptr = lease_->base + next_;
    b.lease = lease_;
    next_ += b.bytes;
    return b;
  }
  absl::Status Free(Block b, const ReuseAfter&) override {
    absl::MutexLock lock(&mu_);
    freed_.push_back(b.ptr);
    return absl::OkStatus();
  }
  int allocations() {
    absl::MutexLock lock(&mu_);
    return allocations_;
  }
  std::vector<uintptr_t> freed() {
    absl::MutexLock lock(&mu_);
    return freed_;
  }

 private:
  Lease* const lease_;
  absl::Mutex mu_;
  int allocations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uintptr_t> freed_ ABSL_GUARDED_BY(mu_);
};

// Arena ids are unique in a process (ArenaTable): thread caches key on them.
Arena NewArena() {
  static std::atomic<uint64_t> next{1ull << 40};
  Arena a;
  a.id = next.fetch_add(1);
  return a;
}

class ThreadCachesTest : public ::testing::Test {
 protected:
  Arena arena_ = NewArena();
  Lease host_{0, 1 << 30, 1 << 30, 0, "", /*on_device=*/false, &arena_, BlockShadow()};
  RecordingUpstream upstream_{&host_};
  ThreadCaches caches_{&upstream_, {/*max_request=*/1 << 20, /*max_cached_bytes=*/64 << 10}};

  Block Take(uint64_t size) {
    absl::StatusOr<Block> b = caches_.Allocate(size, arena_);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : Block();
  }
  void Give(Block b) { ASSERT_TRUE(caches_.Free(std::move(b), ReuseAfter::DeviceWork()).ok()); }
};

TEST_F(ThreadCachesTest, AFreedBlockServesTheThreadsNextAllocationOfItsClass) {
  Block a = Take(3000);
  const uintptr_t p = a.ptr;
  EXPECT_EQ(upstream_.allocations(), 1);
  Give(std::move(a));
  EXPECT_TRUE(upstream_.freed().empty());
  EXPECT_EQ(caches_.CachedBytes(), ClassSize(ClassOf(3000)));
  Block b = Take(2900);  // same class
  EXPECT_EQ(b.ptr, p);
  EXPECT_EQ(b.lease, &host_);
  EXPECT_EQ(upstream_.allocations(), 1);
  EXPECT_EQ(caches_.CachedBytes(), 0u);
  // Another thread's cache does not have it.
  Give(std::move(b));
  std::thread([&] {
    Block c = Take(3000);
    EXPECT_NE(c.ptr, p);
  }).join();
  EXPECT_EQ(upstream_.allocations(), 2);
}

TEST_F(ThreadCachesTest, ClassAndByteLimitsPassTheRestUpstream) {
  std::vector<Block> blocks;
  for (int i = 0; i < 9; ++i) blocks.push_back(Take(1024));
  for (Block& b : blocks) Give(std::move(b));
  EXPECT_EQ(upstream_.freed().size(), 9u - ThreadCaches::kPerClass);
  blocks.clear();
  // 64 KiB per cache: 8 KiB parked already, seven 8 KiB blocks fit, the rest do not.
  for (int i = 0; i < 8; ++i) blocks.push_back(Take(8192));
  for (Block& b : blocks) Give(std::move(b));
  EXPECT_EQ(caches_.CachedBytes(), 64u << 10);
  EXPECT_EQ(upstream_.freed().size(), 1u + 1u);
}

TEST_F(ThreadCachesTest, DeviceMemoryLostLeasesAndLargeRequestsPassThrough) {
  Lease device(0, 2ull << 30, 1 << 30, 0, "GPU-0", /*on_device=*/true, &arena_, BlockShadow());
  Block d;
  d.ptr = device.base;
  d.bytes = 4096;
  d.cls = ClassOf(4096);
  d.lease = &device;
  Give(std::move(d));
  EXPECT_EQ(upstream_.freed().size(), 1u);  // its reuse waits for device work: not here
  Block l = Take(4096);
  host_.lost.store(true);
  Give(std::move(l));
  EXPECT_EQ(upstream_.freed().size(), 2u);
  host_.lost.store(false);
  Take(2 << 20);
  Take(2 << 20);
  EXPECT_EQ(upstream_.allocations(), 3);
  EXPECT_EQ(caches_.CachedBytes(), 0u);
}

TEST_F(ThreadCachesTest, ExitDrainAllAndDrainIdleGiveTheBlocksBack) {
  std::thread([&] { Give(Take(512)); }).join();  // the thread exits
  EXPECT_EQ(upstream_.freed().size(), 1u);
  Give(Take(512));
  Give(Take(768));
  EXPECT_EQ(caches_.CachedBytes(), 512u + 768u);
  caches_.DrainIdle();  // used since the last look: kept
  EXPECT_EQ(caches_.CachedBytes(), 512u + 768u);
  caches_.DrainIdle();  // unused for a whole pass: drained
  EXPECT_EQ(caches_.CachedBytes(), 0u);
  EXPECT_EQ(upstream_.freed().size(), 3u);
  Give(Take(512));
  caches_.DrainAll();
  EXPECT_EQ(caches_.CachedBytes(), 0u);
  EXPECT_EQ(upstream_.freed().size(), 4u);
}

TEST_F(ThreadCachesTest, LostLeasesBlocksAreTakenOut) {
  Lease other(0, 3ull << 30, 1 << 30, 0, "", false, &arena_, BlockShadow());
  Block mine = Take(1024);
  Block theirs;
  theirs.ptr = other.base;
  theirs.bytes = 1024;
  theirs.cls = ClassOf(1024);
  theirs.lease = &other;
  Give(std::move(mine));
  Give(std::move(theirs));
  other.lost.store(true);
  std::vector<Block> lost = caches_.TakeLost();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].lease, &other);
  EXPECT_EQ(caches_.CachedBytes(), 1024u);
}

TEST_F(ThreadCachesTest, MoreArenasThanSlotsAreServedUncached) {
  std::vector<Arena> arenas;
  for (int i = 0; i <= ThreadCaches::kArenasPerThread; ++i) arenas.push_back(NewArena());
  // A block is cached by the arena of its lease: one lease per arena.
  std::vector<std::unique_ptr<Lease>> leases;
  for (size_t i = 0; i < arenas.size(); ++i) {
    leases.push_back(std::make_unique<Lease>(0, (i + 8) << 30, 1 << 30, 0, "", false, &arenas[i],
                                             BlockShadow()));
  }
  std::thread([&] {
    RecordingUpstream up(leases[0].get());
    ThreadCaches caches(&up, {1 << 20, 1 << 20});
    for (size_t i = 0; i < arenas.size(); ++i) {
      Block b;
      b.ptr = leases[i]->base;
      b.bytes = 256;
      b.lease = leases[i].get();
      ASSERT_TRUE(caches.Free(std::move(b), ReuseAfter::DeviceWork()).ok());
    }
    EXPECT_EQ(caches.CachedBytes(), 256u * ThreadCaches::kArenasPerThread);
    EXPECT_EQ(up.freed().size(), 1u);
  }).join();
}

// Threads allocate and free, half of the frees on another thread, while
// another drains: no block is ever handed out twice at once.
TEST_F(ThreadCachesTest, ConcurrentUseNeverHandsABlockOutTwice) {
  absl::Mutex mu;
  std::set<uintptr_t> live;
  std::vector<Block> handoff;
  std::atomic<bool> twice{false}, stop{false};
  auto take = [&](uint64_t size) {
    Block b = Take(size);
    absl::MutexLock lock(&mu);
    if (!live.insert(b.ptr).second) twice.store(true);
    return b;
  };
  auto give = [&](Block b) {
    {
      absl::MutexLock lock(&mu);
      live.erase(b.ptr);
    }
    Give(std::move(b));
  };
  std::thread drainer([&] {
    while (!stop.load()) {
      caches_.DrainAll();
      caches_.DrainIdle();
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 3000; ++i) {
        Block b = take(256ull << ((i + t) % 5));
        if (i % 2 == 0) {
          give(std::move(b));
          continue;
        }
        Block other;
        {
          absl::MutexLock lock(&mu);
          handoff.push_back(std::move(b));
          other = std::move(handoff.front());
          handoff.erase(handoff.begin());
        }
        give(std::move(other));  // often another thread's block
      }
    });
  }
  for (auto& t : ts) t.join();
  stop.store(true);
  drainer.join();
  EXPECT_FALSE(twice.load());
}

}  // namespace
}  // namespace client
}  // namespace gpumem
