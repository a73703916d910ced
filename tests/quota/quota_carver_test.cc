// QuotaCarver over a fake pool: charge-then-carve, refusals with figures,
// undo on inner failure, the limit under concurrent charges, and the
// tenant's peak (committed charges only, through QuotaBook and Commit).
#include "server/quota/quota_carver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/placement/fake_carver.h"

namespace gpumem {
namespace quota {
namespace {

using ::gpumem::Refusal;
using placement::testing::FakeCarver;
using placement::testing::kMiB;
using placement::testing::Used;

tenants::Quota TotalQuota(uint64_t total) {
  tenants::Quota q;
  q.total_bytes = total;
  return q;
}

TEST(QuotaCarverTest, RefusesBeyondTotalWithFigures) {
  FakeCarver pool({Used(1024 * kMiB, 0), Used(1024 * kMiB, 0)});
  QuotaBook book(2);
  book.SetQuota(1, TotalQuota(100 * kMiB));
  QuotaCarver carver(&pool, &book, 1, "ml");
  Refusal refusal;
  auto a = carver.TryCarve(0, 60 * kMiB, 256, &refusal);
  ASSERT_TRUE(a.ok());
  auto b = carver.TryCarve(1, 60 * kMiB, 256, &refusal);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(refusal.refused);
  EXPECT_EQ(refusal.reason, RefusalReason::kQuota);
  EXPECT_EQ(refusal.free_bytes, 40 * kMiB);
  EXPECT_NE(refusal.detail.find("tenant \"ml\" quota total_bytes 100.00 MiB"), std::string::npos)
      << refusal.detail;
  EXPECT_EQ(pool.devices()[1].charged, 0u);  // the pool was never asked
  carver.Release(*a);
  EXPECT_EQ(book.Holdings(1).total_bytes, 0u);
  EXPECT_TRUE(carver.TryCarve(1, 60 * kMiB, 256, &refusal).ok());
}

TEST(QuotaCarverTest, PerDeviceAndCountLimits) {
  FakeCarver pool({Used(1024 * kMiB, 0), Used(1024 * kMiB, 0)});
  QuotaBook book(2);
  tenants::Quota q;
  q.device_bytes = {10 * kMiB, std::nullopt};
  q.max_allocations = 3;
  book.SetQuota(7, q);
  QuotaCarver carver(&pool, &book, 7, "t");
  Refusal refusal;
  EXPECT_FALSE(carver.TryCarve(0, 11 * kMiB, 256, &refusal).ok());
  EXPECT_NE(refusal.detail.find("on device 0"), std::string::npos) << refusal.detail;
  EXPECT_TRUE(carver.TryCarve(1, 11 * kMiB, 256, &refusal).ok());
  EXPECT_TRUE(carver.TryCarve(1, kMiB, 256, &refusal).ok());
  EXPECT_TRUE(carver.TryCarve(0, kMiB, 256, &refusal).ok());
  EXPECT_FALSE(carver.TryCarve(1, kMiB, 256, &refusal).ok());
  EXPECT_NE(refusal.detail.find("max_allocations 3"), std::string::npos) << refusal.detail;
}

TEST(QuotaCarverTest, InnerRefusalCreditsTheCharge) {
  FakeCarver pool({Used(10 * kMiB, 0)});
  QuotaBook book(1);
  book.SetQuota(1, TotalQuota(100 * kMiB));
  QuotaCarver carver(&pool, &book, 1, "ml");
  Refusal refusal;
  EXPECT_FALSE(carver.TryCarve(0, 20 * kMiB, 256, &refusal).ok());
  EXPECT_EQ(refusal.reason, RefusalReason::kCapacity);
  EXPECT_EQ(book.Holdings(1).total_bytes, 0u);
  EXPECT_EQ(book.Holdings(1).allocations, 0u);
}

TEST(QuotaCarverTest, RetainedBytesCountAgainstTheQuota) {
  FakeCarver pool({Used(1024 * kMiB, 0), Used(1024 * kMiB, 0)});
  QuotaBook book(2);
  tenants::Quota q;
  q.total_bytes = 100 * kMiB;
  q.device_bytes = {std::nullopt, 50 * kMiB};
  book.SetQuota(1, q);
  uint64_t retained[2] = {30 * kMiB, 20 * kMiB};
  book.SetRetainedSource([&](uint32_t tenant, uint32_t device) {
    return tenant == 1 ? retained[device] : 0;
  });
  QuotaCarver carver(&pool, &book, 1, "ml");
  Refusal refusal;
  // Device 1: 20 MiB retained + 31 asked > 50.
  EXPECT_FALSE(carver.TryCarve(1, 31 * kMiB, 256, &refusal).ok());
  EXPECT_NE(refusal.detail.find("20.00 MiB held (20.00 MiB of it retained)"), std::string::npos)
      << refusal.detail;
  EXPECT_TRUE(carver.TryCarve(1, 30 * kMiB, 256, &refusal).ok());
  // Total: 50 retained + 30 held + 21 asked > 100.
  EXPECT_FALSE(carver.TryCarve(0, 21 * kMiB, 256, &refusal).ok());
  EXPECT_NE(refusal.detail.find("total_bytes 100.00 MiB: 80.00 MiB held (50.00 MiB of it "
                                "retained)"), std::string::npos) << refusal.detail;
  retained[0] = 0;  // the holder closed its handle
  EXPECT_TRUE(carver.TryCarve(0, 21 * kMiB, 256, &refusal).ok());
}

// Many threads charge one tenant at once; the book's holdings, sampled by a
// watcher throughout, never exceed the quota.
TEST(QuotaCarverTest, ConcurrentChargesNeverPassTheQuota) {
  QuotaBook book(1);
  const uint64_t kQuota = 10 * kMiB;
  book.SetQuota(1, TotalQuota(kQuota));
  std::atomic<bool> done{false};
  std::atomic<uint64_t> worst{0};
  std::thread watcher([&] {
    while (!done) {
      uint64_t held = book.Holdings(1).total_bytes;
      if (held > worst) worst = held;
    }
  });
  // What the successful chargers hold between charge and credit: at most
  // what the book holds, so it must stay under the quota too.
  std::atomic<uint64_t> held{0}, most_held{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      Refusal why;
      for (int i = 0; i < 20000; ++i) {
        if (!book.TryCharge(1, "ml", 0, 3 * kMiB, &why)) continue;
        uint64_t now = held += 3 * kMiB;
        uint64_t prev = most_held;
        while (now > prev && !most_held.compare_exchange_weak(prev, now)) {}
        std::this_thread::yield();
        held -= 3 * kMiB;
        book.Credit(1, 0, 3 * kMiB);
      }
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  watcher.join();
  EXPECT_LE(worst.load(), kQuota);
  EXPECT_LE(most_held.load(), kQuota);
  EXPECT_GE(most_held.load(), 3 * kMiB);
  EXPECT_EQ(book.Holdings(1).total_bytes, 0u);
}

// The book alone: the peak is the most ever held in committed charges.
TEST(QuotaBookPeak, IsTheMostEverHeldInCommittedCharges) {
  QuotaBook book(2);
  Refusal why;
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 10, &why));
  book.Commit(1, 10);
  ASSERT_TRUE(book.TryCharge(1, "t", 1, 30, &why));
  book.Commit(1, 30);
  book.Credit(1, 1, 30);
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 5, &why));
  book.Commit(1, 5);
  EXPECT_EQ(book.Holdings(1).total_bytes, 15u);
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 40u);
  // A charge undone before it was committed never counts.
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 100, &why));
  EXPECT_EQ(book.Holdings(1).pending_bytes, 100u);
  book.Uncharge(1, 0, 100);
  ASSERT_TRUE(book.TryCharge(1, "t", 0, 1, &why));
  book.Commit(1, 1);
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 40u);
  EXPECT_EQ(book.Holdings(1).total_bytes, 16u);
  EXPECT_EQ(book.Holdings(1).pending_bytes, 0u);
  // Charged and credited without a commit (a caller that never commits):
  // nothing pending is left behind, and the peak is untouched.
  ASSERT_TRUE(book.TryCharge(2, "u", 0, 8, &why));
  book.Credit(2, 0, 8);
  book.Commit(2, 0);
  EXPECT_EQ(book.Holdings(2).pending_bytes, 0u);
  EXPECT_EQ(book.Holdings(2).peak_total_bytes, 0u);
}

// Through the adaptor: Commit commits what it carved and did not release;
// a request whose blocks were all released never raises the peak.
TEST(QuotaBookPeak, TheCarverCommitsWhatItKept) {
  FakeCarver pool({Used(1024 * kMiB, 0), Used(1024 * kMiB, 0)});
  QuotaBook book(2);
  book.SetQuota(1, TotalQuota(100 * kMiB));
  {
    // A sharded request: two blocks placed, then the request fails (its
    // session ended, a backend error): both released, nothing committed.
    QuotaCarver carver(&pool, &book, 1, "ml");
    Refusal refusal;
    auto a = carver.TryCarve(0, 40 * kMiB, 256, &refusal);
    auto b = carver.TryCarve(1, 40 * kMiB, 256, &refusal);
    ASSERT_TRUE(a.ok() && b.ok());
    carver.Release(*a);
    carver.Release(*b);
    carver.Commit();
    EXPECT_EQ(book.Holdings(1).total_bytes, 0u);
    EXPECT_EQ(book.Holdings(1).peak_total_bytes, 0u);
  }
  QuotaCarver carver(&pool, &book, 1, "ml");
  Refusal refusal;
  auto a = carver.TryCarve(0, 30 * kMiB, 256, &refusal);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(carver.TryCarve(1, 80 * kMiB, 256, &refusal).ok());  // refused: quota
  auto b = carver.TryCarve(1, 20 * kMiB, 256, &refusal);
  ASSERT_TRUE(b.ok());
  // Charged but not yet committed: not in the peak.
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 0u);
  EXPECT_EQ(book.Holdings(1).pending_bytes, 50 * kMiB);
  carver.Commit();
  EXPECT_EQ(book.Holdings(1).pending_bytes, 0u);
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 50 * kMiB);
  carver.Commit();  // nothing left to commit
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 50 * kMiB);
  book.Credit(1, 0, 30 * kMiB);
  book.Credit(1, 1, 20 * kMiB);
  EXPECT_EQ(book.Holdings(1).total_bytes, 0u);
  EXPECT_EQ(book.Holdings(1).peak_total_bytes, 50 * kMiB);
}

}  // namespace
}  // namespace quota
}  // namespace gpumem
