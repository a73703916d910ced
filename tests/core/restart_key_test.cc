// An Allocate retried across a restart (proto AllocateRequest.request_key):
// the daemon was killed after it carried out the Allocate (the block is in
// the durable state) but before its answer reached the client, and the
// client sends the same request with the same key to the restarted daemon.
// It must get the allocation the first attempt made (same id, slab and
// offset), charged once (quota unchanged, no second ALLOCATE in the
// ledger), while any other request of a tenant at its quota is still
// refused, a request that does not match the recorded one gets nothing of
// it, and another session (another process, of the same uid or another)
// sending the same key gets nothing of the first session's.
//
// The restart is the daemon's, in-process, as the core sequence fuzzer
// does it (tests/fuzz/core_sequence_fuzzer.cc): ShutdownForRestart (nothing
// released or recorded), the ledger and the state file reopened, a new
// broker Restores what the file kept and the ledger is reconciled. The
// callers are real processes (this test and forked sleeping children), so
// process-bound sessions come back as they do for a client after kill -9.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/quota/quota_book.h"
#include "server/restart/durable_slab_keeper.h"
#include "server/state/durable_state.h"
#include "tests/core/sleeping_child.h"

namespace gpumem {
namespace {

using ::gpumem::v1::AllocateRequest;
using ::gpumem::v1::AllocateResponse;
using testing::SleepingChild;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint32_t kDevices = 2;
// Forged uids (the broker takes identity as given): each its own tenant
// (no configured tenants), kUid with a quota of kQuota.
constexpr uid_t kUid = 4242;
constexpr uid_t kOtherUid = 4243;
constexpr uint64_t kQuota = 4 * kMiB;
constexpr uint64_t kKey = 0x1234567890abcdefull;

PeerCred Self() { return PeerCred{getpid(), kUid, kUid}; }

AllocateRequest Request(uint64_t size, uint64_t key, uint32_t shards = 0) {
  AllocateRequest r;
  r.set_size_bytes(size);
  r.set_shard_count(shards);
  r.set_request_key(key);
  return r;
}

class RestartKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/restart-key-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    OpenLedger(/*defer_recovery=*/false);
    state::Snapshot none;
    OpenState(&none);
    MakeBroker();
    ASSERT_TRUE(broker_->Start().ok());
  }
  void TearDown() override {
    // Shut down while broker_ still points at it: the keeper names tenants
    // through broker_, and reset() nulls it before the destructor runs.
    broker_->Shutdown();
    broker_.reset();
    keeper_.reset();
    quotas_.reset();
    ledger_.reset();
    state_.reset();
    std::filesystem::remove_all(dir_);
  }

  void OpenLedger(bool defer_recovery) {
    ledger_.reset();
    ledger::LedgerOptions o;
    o.path = dir_ + "/ledger.db";
    o.max_delay = absl::Milliseconds(1);
    o.defer_recovery = defer_recovery;
    absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> l = ledger::TenantLedger::Open(o);
    ASSERT_TRUE(l.ok()) << l.status();
    ledger_ = *std::move(l);
  }
  void OpenState(state::Snapshot* previous) {
    state_.reset();  // its flock goes with it, as with a dead daemon's
    std::string note;
    absl::StatusOr<std::unique_ptr<state::DurableState>> s =
        state::DurableState::Open(dir_ + "/state", previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
    state_ = *std::move(s);
  }
  void MakeBroker() {
    quotas_ = std::make_unique<quota::QuotaBook>(kDevices);
    tenants::Quota q;
    q.total_bytes = kQuota;
    quotas_->SetQuota(kUid, q);
    keeper_ = std::make_unique<DurableSlabKeeper>(
        state_.get(), nullptr, [this](uint32_t tenant) { return broker_->TenantName(tenant); });
    BrokerOptions o;
    o.pool.slab_size = 8 * kMiB;
    o.pool.granularity = 4096;
    o.quotas = quotas_.get();
    o.ledger = ledger_.get();
    o.state = state_.get();
    o.slab_keeper = keeper_.get();
    o.restore_grace = absl::Hours(1);  // nothing is closed during a test
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
  }

  // The daemon is killed and starts again (see the file comment).
  void Restart() {
    broker_->ShutdownForRestart();
    broker_.reset();
    keeper_.reset();
    quotas_.reset();
    OpenLedger(/*defer_recovery=*/true);
    state::Snapshot previous;
    OpenState(&previous);
    MakeBroker();
    MemoryBroker::RestoreOutcome out = broker_->Restore(previous, {});
    ASSERT_TRUE(out.closed.empty()) << out.Summary();
    for (const state::SlabRecord& r : previous.slabs) keeper_->AdoptSlabRecord(r, false);
    for (const state::HolderRecord& r : previous.holders) keeper_->AdoptHolderRecord(r);
    ledger_->Resume(out.survivors, out.closed, out.Summary(),
                    previous.adopted ? std::max<int64_t>(previous.last_change_ns, 1) : 0);
    ASSERT_TRUE(broker_->Start().ok());
  }

  uint64_t Held() { return quotas_->Holdings(kUid).total_bytes; }

  // ALLOCATE events in the ledger for allocation `id`.
  int AllocateEvents(uint64_t id) {
    EXPECT_TRUE(ledger_->Flush().ok());
    ledger::EventQuery q;
    q.limit = 100000;
    absl::StatusOr<std::vector<ledger::LedgerEvent>> events = ledger_->Query(q);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return -1;
    int n = 0;
    for (const ledger::LedgerEvent& e : *events) {
      if (e.kind == ledger::EventKind::kAllocate && e.allocation_id == id) ++n;
    }
    return n;
  }

  std::string dir_;
  SimBackend backend_{std::vector<uint64_t>(kDevices, 64 * kMiB)};
  std::unique_ptr<ledger::TenantLedger> ledger_;
  std::unique_ptr<state::DurableState> state_;
  std::unique_ptr<quota::QuotaBook> quotas_;
  std::unique_ptr<DurableSlabKeeper> keeper_;
  std::unique_ptr<MemoryBroker> broker_;
};

void ExpectSame(const AllocateResponse& a, const AllocateResponse& b) {
  ASSERT_EQ(a.allocations_size(), b.allocations_size());
  for (int i = 0; i < a.allocations_size(); ++i) {
    EXPECT_EQ(a.allocations(i).id(), b.allocations(i).id()) << "shard " << i;
    EXPECT_EQ(a.allocations(i).slab_id(), b.allocations(i).slab_id()) << "shard " << i;
    EXPECT_EQ(a.allocations(i).offset(), b.allocations(i).offset()) << "shard " << i;
    EXPECT_EQ(a.allocations(i).size_bytes(), b.allocations(i).size_bytes()) << "shard " << i;
    EXPECT_EQ(a.allocations(i).device_index(), b.allocations(i).device_index()) << "shard " << i;
    EXPECT_EQ(a.allocations(i).slab_size_bytes(), b.allocations(i).slab_size_bytes());
    EXPECT_EQ(a.allocations(i).handle_kind(), b.allocations(i).handle_kind());
  }
}

TEST_F(RestartKeyTest, RetryAfterRestartGetsTheSameAllocationChargedOnce) {
  // At the quota: 3 MiB without a key, then 1 MiB with kKey whose answer
  // "never reached the client".
  auto filler = broker_->AllocateAndWait(Self(), Request(3 * kMiB, 0));
  ASSERT_TRUE(filler.ok()) << filler.status();
  auto first = broker_->AllocateAndWait(Self(), Request(kMiB, kKey));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(Held(), kQuota);
  ASSERT_EQ(AllocateEvents(first->allocations(0).id()), 1);

  Restart();
  EXPECT_EQ(Held(), kQuota);  // the restored charge

  // Another request of this tenant is refused: it is at its quota.
  auto other = broker_->AllocateAndWait(Self(), Request(kMiB, kKey + 1));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted) << other.status();

  // The retry: the same allocation, nothing more charged, no new event.
  auto retry = broker_->AllocateAndWait(Self(), Request(kMiB, kKey));
  ASSERT_TRUE(retry.ok()) << retry.status();
  ExpectSame(*first, *retry);
  EXPECT_EQ(Held(), kQuota);
  EXPECT_EQ(broker_->live_allocations(), 2u);
  EXPECT_EQ(AllocateEvents(first->allocations(0).id()), 1);

  // Claimed once: the same key again is a new request, refused for quota.
  auto again = broker_->AllocateAndWait(Self(), Request(kMiB, kKey));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kResourceExhausted) << again.status();

  // The block is the caller's as any other: freed, its bytes come back.
  v1::FreeRequest f;
  f.set_id(retry->allocations(0).id());
  ASSERT_TRUE(broker_->Free(Self(), f).ok());
  EXPECT_EQ(Held(), 3 * kMiB);
}

TEST_F(RestartKeyTest, ShardedRetryGetsEveryShardInOrder) {
  auto filler = broker_->AllocateAndWait(Self(), Request(2 * kMiB, 0));
  ASSERT_TRUE(filler.ok()) << filler.status();
  auto first = broker_->AllocateAndWait(Self(), Request(2 * kMiB, kKey, /*shards=*/2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->allocations_size(), 2);
  ASSERT_EQ(Held(), kQuota);

  Restart();

  // Not the recorded request (one block of the same total, or the shards
  // split otherwise): nothing of it; refused for quota as a new request.
  auto unsharded = broker_->AllocateAndWait(Self(), Request(2 * kMiB, kKey));
  ASSERT_FALSE(unsharded.ok());
  EXPECT_EQ(unsharded.status().code(), absl::StatusCode::kResourceExhausted);
  AllocateRequest uneven;
  uneven.add_shard_sizes(kMiB / 2);
  uneven.add_shard_sizes(3 * kMiB / 2);
  uneven.set_request_key(kKey);
  auto split = broker_->AllocateAndWait(Self(), uneven);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kResourceExhausted);

  auto retry = broker_->AllocateAndWait(Self(), Request(2 * kMiB, kKey, /*shards=*/2));
  ASSERT_TRUE(retry.ok()) << retry.status();
  ExpectSame(*first, *retry);
  EXPECT_EQ(Held(), kQuota);
  EXPECT_EQ(broker_->live_allocations(), 3u);
  for (const v1::Allocation& a : first->allocations()) EXPECT_EQ(AllocateEvents(a.id()), 1);
}

// The other processes are forked before SetUp opens the ledger and the
// state file (a child forked later would share their locks).
class RestartKeyOtherSessionTest : public RestartKeyTest {
 protected:
  SleepingChild same_uid;   // another process of the same uid (same tenant)
  SleepingChild other_uid;  // another user's process
};

TEST_F(RestartKeyOtherSessionTest, AnotherSessionSendingTheKeyGetsNothingOfIt) {
  auto filler = broker_->AllocateAndWait(Self(), Request(3 * kMiB, 0));
  ASSERT_TRUE(filler.ok()) << filler.status();
  auto first = broker_->AllocateAndWait(Self(), Request(kMiB, kKey));
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t id = first->allocations(0).id();

  Restart();

  // Same tenant, another session: a new request, refused for the quota.
  auto mine = broker_->AllocateAndWait(same_uid.Cred(kUid, kUid), Request(kMiB, kKey));
  ASSERT_FALSE(mine.ok());
  EXPECT_EQ(mine.status().code(), absl::StatusCode::kResourceExhausted) << mine.status();
  // Another tenant (no quota): a block of its own, never the first one.
  auto theirs = broker_->AllocateAndWait(other_uid.Cred(kOtherUid, kOtherUid),
                                         Request(kMiB, kKey));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  ASSERT_EQ(theirs->allocations_size(), 1);
  EXPECT_NE(theirs->allocations(0).id(), id);
  EXPECT_FALSE(theirs->allocations(0).slab_id() == first->allocations(0).slab_id() &&
               theirs->allocations(0).offset() == first->allocations(0).offset());
  EXPECT_EQ(Held(), kQuota);

  // The owner's retry still gets its own.
  auto retry = broker_->AllocateAndWait(Self(), Request(kMiB, kKey));
  ASSERT_TRUE(retry.ok()) << retry.status();
  ExpectSame(*first, *retry);
  EXPECT_EQ(Held(), kQuota);
  EXPECT_EQ(AllocateEvents(id), 1);
}

// Without a key nothing changes: the retry is a new request (the refusal
// the key exists to prevent).
TEST_F(RestartKeyTest, WithoutAKeyTheRetryIsANewRequest) {
  auto filler = broker_->AllocateAndWait(Self(), Request(3 * kMiB, 0));
  ASSERT_TRUE(filler.ok()) << filler.status();
  auto first = broker_->AllocateAndWait(Self(), Request(kMiB, 0));
  ASSERT_TRUE(first.ok()) << first.status();
  Restart();
  auto retry = broker_->AllocateAndWait(Self(), Request(kMiB, 0));
  ASSERT_FALSE(retry.ok());
  EXPECT_EQ(retry.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace gpumem
