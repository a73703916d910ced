// SizeClassCache over a LeaseSource against a real daemon (sim): class
// blocks share their arena's leases and the daemon sees whole leases and the
// pool's figures; a full lease makes another, arenas never share; large
// requests, and requests the daemon has no room for a lease for, become
// whole blocks; empty leases go back when asked; a lost lease is not carved
// again and is abandoned once the program's blocks of it are freed.
#include "client/lib/pool/size_class_cache.h"

#include <unistd.h>

#include <memory>
#include <set>
#include <vector>

#include "client/lib/pool/size_classes.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace client {
namespace {

using size_classes::ClassOf;
using size_classes::ClassSize;
using testing::DaemonProcess;

constexpr uint64_t kMiB = 1 << 20;

class SizeClassCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start()) << daemon_.Log();
    absl::StatusOr<std::unique_ptr<LeaseSource>> s = LeaseSource::Connect(daemon_.socket(), &lost_);
    ASSERT_TRUE(s.ok()) << s.status();
    source_ = *std::move(s);
    cache_ = std::make_unique<SizeClassCache>(
        source_.get(), &lost_,
        SizeClassCache::Options{kMiB, 256 << 10, [this] { return parked_; }});
    any_ = arenas_.For({});
    v1::PlacementRequest zero, one;
    zero.add_devices("0");
    one.add_devices("1");
    gpu0_ = arenas_.For(zero);
    gpu1_ = arenas_.For(one);
  }
  void TearDown() override {
    cache_.reset();
    source_.reset();
  }
  Block Take(uint64_t size, Arena* arena) {
    absl::StatusOr<Block> b = cache_->Allocate(size, *arena);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : Block();
  }
  void Give(Block b) { EXPECT_TRUE(cache_->Free(std::move(b), ReuseAfter::DeviceWork()).ok()); }
  // This process's session in the daemon's stats.
  v1::SessionStats Session() {
    absl::StatusOr<v1::GetStatsResponse> st = source_->daemon().GetStats();
    EXPECT_TRUE(st.ok()) << st.status();
    for (const auto& s : st->sessions()) {
      if (s.pid() == getpid()) return s;
    }
    ADD_FAILURE() << "no session";
    return {};
  }

  DaemonProcess daemon_{{"--sim_devices=2x16MiB", "--slab_size=16MiB"}};
  LostBlocks lost_;
  ArenaTable arenas_;
  std::unique_ptr<LeaseSource> source_;
  std::unique_ptr<SizeClassCache> cache_;
  uint64_t parked_ = 0;
  Arena* any_ = nullptr;
  Arena* gpu0_ = nullptr;
  Arena* gpu1_ = nullptr;
};

TEST_F(SizeClassCacheTest, ClassBlocksShareALeaseAndTheDaemonSeesTheFigures) {
  std::vector<Block> blocks;
  std::set<uintptr_t> ptrs;
  for (int i = 0; i < 10; ++i) {
    blocks.push_back(Take(3000, any_));
    const Block& b = blocks.back();
    ASSERT_NE(b.lease, nullptr);
    EXPECT_EQ(b.lease, blocks[0].lease);
    EXPECT_EQ(cache_->FindLease(b.ptr), b.lease);
    EXPECT_EQ(b.ptr % 256, 0u);
    EXPECT_EQ(b.bytes, ClassSize(ClassOf(3000)));
    ptrs.insert(b.ptr);
  }
  EXPECT_EQ(ptrs.size(), 10u);
  SizeClassCache::Figures f = cache_->Stats();
  EXPECT_EQ(f.leases, 1u);
  EXPECT_EQ(f.leased_bytes, kMiB);
  EXPECT_EQ(f.carved_bytes, 10 * ClassSize(ClassOf(3000)));
  ASSERT_EQ(f.rows.size(), 1u);
  EXPECT_EQ(f.rows[0].blocks_out, 10u);
  // Told with the lease: itself and its first block, nothing parked above.
  v1::SessionStats s = Session();
  EXPECT_EQ(s.leased_bytes(), kMiB);
  EXPECT_EQ(s.in_use_bytes(), ClassSize(ClassOf(3000)));
  EXPECT_EQ(s.used_bytes(), kMiB);
  for (Block& b : blocks) Give(std::move(b));
  EXPECT_EQ(cache_->Stats().carved_bytes, 0u);
  EXPECT_EQ(cache_->Stats().leases, 1u);  // kept until given back
}

TEST_F(SizeClassCacheTest, AFullLeaseMakesAnotherAndArenasNeverShare) {
  const uint64_t cls_bytes = ClassSize(ClassOf(200 << 10));
  std::vector<Block> blocks;
  for (uint64_t n = 0; n <= kMiB / cls_bytes; ++n) blocks.push_back(Take(200 << 10, any_));
  EXPECT_EQ(cache_->Stats().leases, 2u);
  EXPECT_NE(blocks.front().lease, blocks.back().lease);
  // One of those blocks is parked above (not in use): the next lease's
  // report counts everything carved but it, plus the new block.
  parked_ = cls_bytes;
  Block on1 = Take(3000, gpu1_);
  EXPECT_EQ(on1.lease->device, 1);
  for (const Block& b : blocks) EXPECT_NE(b.lease, on1.lease);
  EXPECT_EQ(cache_->Stats().leases, 3u);
  v1::SessionStats s = Session();
  EXPECT_EQ(s.leased_bytes(), 3 * kMiB);
  EXPECT_EQ(s.in_use_bytes(), (blocks.size() - 1) * cls_bytes + ClassSize(ClassOf(3000)));
}

TEST_F(SizeClassCacheTest, LargeRequestsAndRefusedLeasesBecomeWholeBlocks) {
  Block big = Take(512 << 10, gpu0_);  // above max_request
  EXPECT_EQ(big.lease, nullptr);
  EXPECT_EQ(source_->Stats().blocks, 1u);
  EXPECT_EQ(cache_->Stats().leases, 0u);
  // Fill device 1 but for half a MiB: no room for a lease there.
  v1::PlacementRequest one;
  one.add_devices("1");
  absl::StatusOr<Buffer> filler = source_->daemon().Allocate(15 * kMiB + kMiB / 2, one);
  ASSERT_TRUE(filler.ok()) << filler.status();
  Block small = Take(100 << 10, gpu1_);
  EXPECT_EQ(small.lease, nullptr);  // the request alone still fits
  EXPECT_EQ(source_->Stats().blocks, 2u);
  EXPECT_EQ(cache_->Stats().leases, 0u);
  std::unique_ptr<Buffer> whole = source_->TakeWhole(small.ptr);
  ASSERT_NE(whole, nullptr);
  small.whole = std::move(whole);
  Give(std::move(small));
  // Nothing fits any more: the daemon's refusal comes back as it was.
  absl::StatusOr<Block> none = cache_->Allocate(kMiB, *gpu1_);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
}

TEST_F(SizeClassCacheTest, EmptyLeasesGoBackWhenIdleLongEnough) {
  Block a = Take(3000, any_);
  Block b = Take(3000, gpu1_);
  EXPECT_EQ(cache_->ReleaseEmpty(absl::ZeroDuration()), 0u);  // both have a block out
  Give(std::move(a));
  EXPECT_EQ(cache_->ReleaseEmpty(absl::Hours(1)), 0u);  // not idle long enough
  EXPECT_EQ(cache_->ReleaseEmpty(absl::ZeroDuration()), kMiB);
  EXPECT_EQ(cache_->Stats().leases, 1u);
  EXPECT_EQ(Session().leased_bytes(), kMiB);
  EXPECT_EQ(Session().used_bytes(), kMiB);
  Give(std::move(b));
  EXPECT_EQ(cache_->ReleaseEmpty(absl::ZeroDuration()), kMiB);
  EXPECT_EQ(Session().used_bytes(), 0u);
  EXPECT_EQ(cache_->FindLease(b.ptr), nullptr);
}

TEST_F(SizeClassCacheTest, ALostLeaseIsAbandonedOnceItsBlocksAreBack) {
  Block held = Take(3000, any_);
  Block cached = Take(3000, any_);
  Lease* lease = held.lease;
  const uintptr_t base = lease->base;
  lease->shadow.MarkLive(held.ptr - base, held.handle, held.cls);
  EXPECT_FALSE(cache_->MarkLost({lease->id + 1000}));
  EXPECT_TRUE(cache_->MarkLost({lease->id}));
  EXPECT_TRUE(lease->lost.load());
  EXPECT_EQ(cache_->FindLease(held.ptr), nullptr);
  EXPECT_TRUE(cache_->InLostLease(held.ptr));
  EXPECT_EQ(cache_->Stats().lost_bytes, kMiB);
  // A new request gets a new lease.
  Block fresh = Take(3000, any_);
  EXPECT_NE(fresh.lease, lease);
  // The cached block is dropped above; the held one is still mapped.
  std::vector<Block> dropped;
  dropped.push_back(std::move(cached));
  cache_->ForgetCached(dropped);
  EXPECT_FALSE(lost_.Reserved(base));
  EXPECT_FALSE(cache_->FreeLost(fresh.ptr));
  EXPECT_TRUE(cache_->FreeLost(held.ptr));  // the last block: abandoned
  EXPECT_TRUE(lost_.Reserved(base));
  EXPECT_FALSE(cache_->InLostLease(held.ptr));
  // Never freed at the daemon: its bytes stay used there until the session goes.
  EXPECT_EQ(Session().used_bytes(), 2 * kMiB);
}

}  // namespace
}  // namespace client
}  // namespace gpumem
