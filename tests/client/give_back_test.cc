// GiveBack over a real stack against a daemon (sim): on the timer, an idle
// thread cache goes back to its lease and the empty lease to the daemon; a
// reclaim request gives back everything idle at once, long before the idle
// time; Trim counts what it gave back and keeps leases with a block out.
#include "client/lib/pool/give_back.h"

#include <unistd.h>

#include <atomic>
#include <memory>

#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace client {
namespace {

using testing::DaemonProcess;

constexpr uint64_t kMiB = 1 << 20;

class GiveBackTest : public ::testing::Test {
 protected:
  void Compose(int64_t idle_release_ms) {
    ASSERT_TRUE(daemon_.Start()) << daemon_.Log();
    absl::StatusOr<std::unique_ptr<LeaseSource>> s = LeaseSource::Connect(daemon_.socket(), &lost_);
    ASSERT_TRUE(s.ok()) << s.status();
    source_ = *std::move(s);
    size_classes_ = std::make_unique<SizeClassCache>(
        source_.get(), &lost_,
        SizeClassCache::Options{kMiB, 256 << 10, [this] { return caches_->CachedBytes(); }});
    queue_ = std::make_unique<FreeQueue>(size_classes_.get(), FreeQueue::Options());
    caches_ =
        std::make_unique<ThreadCaches>(queue_.get(), ThreadCaches::Options{256 << 10, 128 << 10});
    absl::StatusOr<std::unique_ptr<GiveBack>> gb = GiveBack::Create(
        idle_release_ms,
        GiveBack::Layers{caches_.get(), queue_.get(), size_classes_.get(), source_.get()},
        [this] { ++wakes_; });
    ASSERT_TRUE(gb.ok()) << gb.status();
    give_back_ = *std::move(gb);
    give_back_->Start();
    arena_ = arenas_.For({});
  }
  void TearDown() override {
    if (give_back_ != nullptr) give_back_->Stop();
    caches_.reset();
    queue_.reset();
    size_classes_.reset();
    source_.reset();
  }
  // Allocates and frees one block on this thread: it stays parked in the
  // thread's cache, its lease leased.
  void ParkABlock() {
    absl::StatusOr<Block> b = caches_->Allocate(3000, *arena_);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(caches_->Free(*std::move(b), ReuseAfter::DeviceWork()).ok());
    ASSERT_GT(caches_->CachedBytes(), 0u);
  }
  // Waits up to 10 s (a loaded machine) for the lease to be given back.
  bool LeaseGoesBack() {
    for (int i = 0; i < 500; ++i) {
      if (size_classes_->Stats().leases == 0) return true;
      usleep(20 * 1000);
    }
    return false;
  }

  DaemonProcess daemon_{{"--sim_devices=1x64MiB", "--slab_size=16MiB"}};
  LostBlocks lost_;
  ArenaTable arenas_;
  Arena* arena_ = nullptr;
  std::unique_ptr<LeaseSource> source_;
  std::unique_ptr<SizeClassCache> size_classes_;
  std::unique_ptr<FreeQueue> queue_;
  std::unique_ptr<ThreadCaches> caches_;
  std::unique_ptr<GiveBack> give_back_;
  std::atomic<int> wakes_{0};
};

TEST_F(GiveBackTest, IdleCachesAndLeasesGoBackOnTheTimer) {
  Compose(/*idle_release_ms=*/100);
  ParkABlock();
  EXPECT_TRUE(LeaseGoesBack());
  EXPECT_EQ(caches_->CachedBytes(), 0u);
}

TEST_F(GiveBackTest, AReclaimRequestGivesBackEverythingIdleAtOnce) {
  Compose(/*idle_release_ms=*/600000);
  ParkABlock();
  usleep(100 * 1000);
  EXPECT_EQ(size_classes_->Stats().leases, 1u);
  give_back_->RequestReclaim();
  EXPECT_TRUE(LeaseGoesBack());
  EXPECT_EQ(caches_->CachedBytes(), 0u);
  EXPECT_GE(wakes_.load(), 1);
}

TEST_F(GiveBackTest, TrimCountsWhatWentBackAndKeepsLeasesInUse) {
  Compose(/*idle_release_ms=*/600000);
  absl::StatusOr<Block> held = caches_->Allocate(3000, *arena_);
  ASSERT_TRUE(held.ok());
  ParkABlock();
  EXPECT_EQ(give_back_->Trim(), 0u);  // the lease has a block out
  EXPECT_EQ(caches_->CachedBytes(), 0u);
  ASSERT_TRUE(caches_->Free(*std::move(held), ReuseAfter::DeviceWork()).ok());
  EXPECT_EQ(give_back_->Trim(), kMiB);
  EXPECT_EQ(size_classes_->Stats().leases, 0u);
}

}  // namespace
}  // namespace client
}  // namespace gpumem
