// LeaseSource against a real daemon (sim): whole blocks are tracked until
// freed and taken out exactly once; leases carry the pool's figures to the
// daemon; shards land on distinct devices; a lost whole block is never
// freed at the daemon and its addresses stay reserved; Close gives
// everything back.
#include "client/lib/pool/lease_source.h"

#include <unistd.h>

#include <memory>

#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace client {
namespace {

using testing::DaemonProcess;

constexpr uint64_t kMiB = 1 << 20;

class LeaseSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start()) << daemon_.Log();
    absl::StatusOr<std::unique_ptr<LeaseSource>> s = LeaseSource::Connect(daemon_.socket(), &lost_);
    ASSERT_TRUE(s.ok()) << s.status();
    source_ = *std::move(s);
    absl::StatusOr<std::unique_ptr<Client>> w = Client::Connect(daemon_.socket());
    ASSERT_TRUE(w.ok()) << w.status();
    watcher_ = *std::move(w);
  }
  // The source's session, as another client sees it.
  v1::SessionStats Session() {
    absl::StatusOr<v1::GetStatsResponse> st = watcher_->GetStats();
    EXPECT_TRUE(st.ok()) << st.status();
    for (const auto& s : st->sessions()) {
      if (s.pid() == getpid() && s.used_bytes() + s.leased_bytes() > 0) return s;
    }
    return {};
  }
  uint64_t DeviceUsed() {
    absl::StatusOr<v1::GetStatsResponse> st = watcher_->GetStats();
    EXPECT_TRUE(st.ok()) << st.status();
    uint64_t used = 0;
    for (const auto& d : st->devices()) used += d.used_bytes();
    return used;
  }

  DaemonProcess daemon_{{"--sim_devices=2x64MiB", "--slab_size=16MiB"}};
  LostBlocks lost_;
  Arena any_;
  std::unique_ptr<LeaseSource> source_;
  std::unique_ptr<Client> watcher_;
};

TEST_F(LeaseSourceTest, WholeBlocksAreTrackedUntilTakenOutAndFreed) {
  absl::StatusOr<Block> b = source_->Allocate(5000, any_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->lease, nullptr);
  EXPECT_GE(b->bytes, 5000u);
  std::optional<LeaseSource::WholeInfo> info = source_->FindWhole(b->ptr);
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->on_device);  // sim: host memory
  EXPECT_EQ(source_->Stats().blocks, 1u);
  EXPECT_EQ(source_->Stats().bytes, b->bytes);
  EXPECT_GT(DeviceUsed(), 0u);
  b->whole = source_->TakeWhole(b->ptr);
  ASSERT_NE(b->whole, nullptr);
  EXPECT_EQ(source_->TakeWhole(b->ptr), nullptr);  // once
  EXPECT_FALSE(source_->FindWhole(b->ptr).has_value());
  EXPECT_TRUE(source_->Free(*std::move(b), ReuseAfter::DeviceWork()).ok());
  EXPECT_EQ(DeviceUsed(), 0u);
  EXPECT_EQ(source_->Stats().blocks, 0u);
}

TEST_F(LeaseSourceTest, LeasesCarryThePoolsFiguresToTheDaemon) {
  v1::UsageReport usage;
  usage.set_leased_bytes(kMiB);
  usage.set_in_use_bytes(4096);
  absl::StatusOr<Buffer> lease = source_->TakeLease(kMiB, any_, 64 << 10, usage);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->allocation().offset() % (64 << 10), 0u);  // in its slab
  EXPECT_EQ(source_->Stats().blocks, 0u);  // the caller's, not tracked here
  v1::SessionStats s = Session();
  EXPECT_EQ(s.leased_bytes(), kMiB);
  EXPECT_EQ(s.in_use_bytes(), 4096u);
  source_->GiveBack(*std::move(lease), v1::UsageReport());
  EXPECT_EQ(DeviceUsed(), 0u);
  EXPECT_EQ(Session().leased_bytes(), 0u);
}

TEST_F(LeaseSourceTest, ShardsAreWholeBlocksOnDistinctDevices) {
  absl::StatusOr<std::vector<Shard>> shards = source_->AllocateSharded(4 * kMiB, 2, {});
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 2u);
  EXPECT_NE((*shards)[0].device, (*shards)[1].device);
  for (const Shard& s : *shards) {
    std::optional<LeaseSource::WholeInfo> info =
        source_->FindWhole(reinterpret_cast<uintptr_t>(s.ptr));
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->device, s.device);
  }
  EXPECT_EQ(source_->Stats().blocks, 2u);
}

TEST_F(LeaseSourceTest, ALostWholeBlockIsAbandonedAndItsAddressesReserved) {
  absl::StatusOr<Block> b = source_->Allocate(kMiB, any_);
  ASSERT_TRUE(b.ok()) << b.status();
  const uint64_t id = source_->FindWhole(b->ptr)->id;
  source_->MarkLost({id});
  EXPECT_FALSE(source_->FindWhole(b->ptr).has_value());
  EXPECT_TRUE(source_->IsLost(b->ptr));
  EXPECT_EQ(source_->Stats().lost_bytes, b->bytes);
  EXPECT_FALSE(lost_.Reserved(b->ptr));
  EXPECT_TRUE(source_->FreeLost(b->ptr));
  EXPECT_FALSE(source_->FreeLost(b->ptr));
  EXPECT_FALSE(source_->IsLost(b->ptr));
  EXPECT_TRUE(lost_.Reserved(b->ptr));
  EXPECT_TRUE(lost_.Reserved(b->ptr + b->bytes - 1));
  EXPECT_EQ(DeviceUsed(), kMiB);  // never freed at the daemon
}

TEST_F(LeaseSourceTest, CloseFreesEveryWholeBlock) {
  ASSERT_TRUE(source_->Allocate(kMiB, any_).ok());
  ASSERT_TRUE(source_->AllocateSharded(2 * kMiB, 2, {}).ok());
  EXPECT_EQ(DeviceUsed(), 3 * kMiB);
  source_->Close();
  for (int i = 0; i < 100 && DeviceUsed() != 0; ++i) usleep(20 * 1000);
  EXPECT_EQ(DeviceUsed(), 0u);
}

}  // namespace
}  // namespace client
}  // namespace gpumem
