// The vocabulary the pool's layers share: BlockShadow (a live block's word,
// taken exactly once), LeaseTable (address to lease, lock-free, old tables
// kept), ArenaTable (one arena per placement) and LostBlocks (ids taken
// once, reserved ranges).
#include <atomic>
#include <thread>
#include <vector>

#include "client/lib/pool/arena.h"
#include "client/lib/pool/block_shadow.h"
#include "client/lib/pool/lease_table.h"
#include "client/lib/pool/lost_blocks.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace client {
namespace {

TEST(BlockShadowTest, ALiveBlockIsTakenOnceAndClearedWordsAreNotLive) {
  absl::StatusOr<BlockShadow> s = BlockShadow::Create(1 << 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->IsLive(0));
  s->MarkLive(4096, /*handle=*/77, /*cls=*/15);
  EXPECT_TRUE(s->IsLive(4096));
  EXPECT_FALSE(s->IsLive(4096 + 256));
  const BlockShadow::Word w = s->Take(4096);
  EXPECT_TRUE(w.live);
  EXPECT_EQ(w.handle, 77u);
  EXPECT_EQ(w.cls, 15u);
  EXPECT_FALSE(s->Take(4096).live);  // a double free
  s->MarkLive(8192, 1, 1);
  s->Clear();
  EXPECT_FALSE(s->IsLive(8192));
}

TEST(BlockShadowTest, OfTwoThreadsTakingOneBlockExactlyOneSeesItLive) {
  absl::StatusOr<BlockShadow> s = BlockShadow::Create(1 << 20);
  ASSERT_TRUE(s.ok());
  for (int round = 0; round < 200; ++round) {
    const uint64_t off = (round % 64) * 256;
    s->MarkLive(off, round, 0);
    std::atomic<int> live{0};
    std::thread a([&] { live += s->Take(off).live; });
    std::thread b([&] { live += s->Take(off).live; });
    a.join();
    b.join();
    ASSERT_EQ(live.load(), 1) << round;
  }
}

TEST(LeaseTableTest, FindsTheLeaseOfAnAddressInEveryPublishedSet) {
  Arena arena;
  Lease a(1, 0x100000, 0x10000, 0, "", false, &arena, BlockShadow());
  Lease b(2, 0x300000, 0x10000, 0, "", false, &arena, BlockShadow());
  LeaseTable t;
  EXPECT_EQ(t.Find(0x100000), nullptr);
  t.Publish({&b, &a});
  EXPECT_EQ(t.Find(0x100000), &a);
  EXPECT_EQ(t.Find(0x10ffff), &a);
  EXPECT_EQ(t.Find(0x110000), nullptr);
  EXPECT_EQ(t.Find(0x0fffff), nullptr);
  EXPECT_EQ(t.Find(0x300100), &b);
  t.Publish({&b});
  EXPECT_EQ(t.Find(0x100000), nullptr);
  EXPECT_EQ(t.Find(0x300100), &b);
  // Readers race with publishers without a lock.
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) {
      Lease* l = t.Find(0x300100);
      ASSERT_EQ(l, &b);
    }
  });
  for (int i = 0; i < 1000; ++i)
    t.Publish(i % 2 ? std::vector<Lease*>{&a, &b} : std::vector<Lease*>{&b});
  stop.store(true);
  reader.join();
}

TEST(ArenaTableTest, OneArenaPerPlacementWithUniqueIdsAndDenseIndexes) {
  ArenaTable t1, t2;
  v1::PlacementRequest any, one;
  one.add_devices("1");
  Arena* a = t1.For(any);
  Arena* b = t1.For(one);
  EXPECT_EQ(t1.For(any), a);
  EXPECT_NE(a, b);
  EXPECT_EQ(a->index, 0u);
  EXPECT_EQ(b->index, 1u);
  EXPECT_EQ(b->placement.devices(0), "1");
  Arena* c = t2.For(any);
  EXPECT_EQ(c->index, 0u);
  EXPECT_NE(c->id, a->id);
  EXPECT_NE(c->id, b->id);
}

TEST(LostBlocksTest, IdsAreTakenOnceAndRangesStayReserved) {
  LostBlocks lost;
  Client::RestartReport none;
  EXPECT_FALSE(lost.Report(none));
  EXPECT_FALSE(lost.pending());
  Client::RestartReport report;
  report.lost.push_back({7, absl::NotFoundError("gone")});
  report.lost.push_back({9, absl::NotFoundError("gone")});
  EXPECT_TRUE(lost.Report(report));
  EXPECT_TRUE(lost.pending());
  absl::flat_hash_set<uint64_t> ids = lost.TakeIds();
  EXPECT_EQ(ids, (absl::flat_hash_set<uint64_t>{7, 9}));
  EXPECT_FALSE(lost.pending());
  EXPECT_TRUE(lost.TakeIds().empty());
  lost.Reserve(0x1000, 0x1000);
  lost.Reserve(0x1800, 0x100);  // inside the first
  EXPECT_TRUE(lost.Reserved(0x1000));
  EXPECT_TRUE(lost.Reserved(0x1fff));
  EXPECT_FALSE(lost.Reserved(0x2000));
  EXPECT_FALSE(lost.Reserved(0xfff));
}

}  // namespace
}  // namespace client
}  // namespace gpumem
