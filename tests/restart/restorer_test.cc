// The restore window's answers about slabs whose handle has not come back
// (server/restart/restorer.h), in-process: the daemon stops for a restart
// (ShutdownForRestart), its state file is reopened and a new broker
// Restores it with no kept handles, so every slab waits for a client to give
// its handle back. This process is the client: its session comes back, as a
// client's does after kill -9.
//  - A slab the session holds open is asked for (Resume's needs_handle)
//    while it waits, and no longer once it has left the pool (its last
//    holder closed it): it cannot be given back either.
//  - A slab whose handle is given back keeps its blocks at the end of the
//    grace time; the blocks of one whose handle never came back are closed.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/restart/durable_slab_keeper.h"
#include "server/state/durable_state.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint32_t kDevices = 2;
constexpr uint64_t kSlab = 8 * kMiB;

PeerCred Self() { return PeerCred{getpid(), getuid(), getgid()}; }

v1::AllocateRequest OnDevice(uint64_t size, int device) {
  v1::AllocateRequest r;
  r.set_size_bytes(size);
  r.mutable_placement()->add_devices(std::to_string(device));
  return r;
}

std::vector<uint64_t> NeedsHandle(const v1::ResumeResponse& r) {
  std::vector<uint64_t> out(r.needs_handle().begin(), r.needs_handle().end());
  std::sort(out.begin(), out.end());
  return out;
}

class RestorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/restorer-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    state::Snapshot none;
    OpenState(&none);
    MakeBroker(absl::Hours(1));
    ASSERT_TRUE(broker_->Start().ok());
  }
  void TearDown() override {
    broker_->Shutdown();  // while broker_ still names tenants for the keeper
    broker_.reset();
    keeper_.reset();
    state_.reset();
    std::filesystem::remove_all(dir_);
  }

  void OpenState(state::Snapshot* previous) {
    state_.reset();
    std::string note;
    absl::StatusOr<std::unique_ptr<state::DurableState>> s =
        state::DurableState::Open(dir_ + "/state", previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
    state_ = *std::move(s);
  }
  void MakeBroker(absl::Duration grace) {
    keeper_ = std::make_unique<DurableSlabKeeper>(
        state_.get(), nullptr, [this](uint32_t tenant) { return broker_->TenantName(tenant); });
    BrokerOptions o;
    o.pool.slab_size = kSlab;
    o.pool.granularity = 4096;
    o.state = state_.get();
    o.slab_keeper = keeper_.get();
    o.restore_grace = grace;
    o.maintenance_interval = absl::Milliseconds(20);
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
  }
  // The daemon stops for a restart and a new one takes back what it kept,
  // with no handle kept: every slab waits for its handle.
  void Restart(absl::Duration grace) {
    broker_->ShutdownForRestart();
    broker_.reset();
    keeper_.reset();
    state::Snapshot previous;
    OpenState(&previous);
    MakeBroker(grace);
    ASSERT_TRUE(broker_->Start().ok());
    MemoryBroker::RestoreOutcome out = broker_->Restore(previous, {});
    ASSERT_TRUE(out.closed.empty()) << out.Summary();
    ASSERT_EQ(out.slabs_awaiting_handle, out.slabs) << out.Summary();
    for (const state::SlabRecord& r : previous.slabs) keeper_->AdoptSlabRecord(r, false);
    for (const state::HolderRecord& r : previous.holders) keeper_->AdoptHolderRecord(r);
  }
  v1::ResumeResponse Resume(const std::vector<v1::Allocation>& claims) {
    v1::ResumeRequest request;
    for (const v1::Allocation& a : claims) *request.add_allocations() = a;
    absl::StatusOr<v1::ResumeResponse> r = broker_->Resume(Self(), request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::ResumeResponse();
  }
  // A new fd for the slab's handle (this process keeps it, as a client
  // keeps its mapping).
  int Export(uint64_t slab_id) {
    absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Self(), slab_id);
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? fd->fd : -1;
  }

  std::string dir_;
  SimBackend backend_{std::vector<uint64_t>(kDevices, 64 * kMiB)};
  std::unique_ptr<state::DurableState> state_;
  std::unique_ptr<DurableSlabKeeper> keeper_;
  std::unique_ptr<MemoryBroker> broker_;
};

TEST_F(RestorerTest, AHeldSlabIsAskedForUntilItLeavesThePool) {
  // A block in a slab of its own: freed, its slab stays retained for this
  // session, which holds its handle.
  absl::StatusOr<v1::AllocateResponse> big =
      broker_->AllocateAndWait(Self(), OnDevice(2 * kSlab, 0));
  ASSERT_TRUE(big.ok()) << big.status();
  const uint64_t slab = big->allocations(0).slab_id();
  const int fd = Export(slab);
  ASSERT_GE(fd, 0);
  v1::FreeRequest free;
  free.set_id(big->allocations(0).id());
  ASSERT_TRUE(broker_->Free(Self(), free).ok());

  ASSERT_NO_FATAL_FAILURE(Restart(absl::Hours(1)));
  EXPECT_EQ(NeedsHandle(Resume({})), std::vector<uint64_t>{slab});

  // Its last holder closes it: the retained slab leaves the pool, and is
  // neither asked for nor taken back any more.
  ASSERT_TRUE(broker_->CloseSlab(Self(), slab).ok());
  EXPECT_TRUE(NeedsHandle(Resume({})).empty());
  const absl::Status given = broker_->AcceptSlabHandle(Self(), slab, dup(fd));
  EXPECT_EQ(given.code(), absl::StatusCode::kNotFound) << given;
  close(fd);
}

TEST_F(RestorerTest, AGivenBackSlabKeepsItsBlocksAndTheOtherLosesThemAtTheGraceEnd) {
  absl::StatusOr<v1::AllocateResponse> a = broker_->AllocateAndWait(Self(), OnDevice(kMiB, 0));
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<v1::AllocateResponse> b = broker_->AllocateAndWait(Self(), OnDevice(kMiB, 1));
  ASSERT_TRUE(b.ok()) << b.status();
  const v1::Allocation& block_a = a->allocations(0);
  const v1::Allocation& block_b = b->allocations(0);
  ASSERT_NE(block_a.slab_id(), block_b.slab_id());
  const int fd_a = Export(block_a.slab_id());
  const int fd_b = Export(block_b.slab_id());
  ASSERT_GE(fd_a, 0);
  ASSERT_GE(fd_b, 0);

  ASSERT_NO_FATAL_FAILURE(Restart(absl::Seconds(2)));
  v1::ResumeResponse first = Resume({block_a, block_b});
  EXPECT_EQ(first.kept_size(), 2);
  std::vector<uint64_t> both = {block_a.slab_id(), block_b.slab_id()};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(NeedsHandle(first), both);

  ASSERT_TRUE(broker_->AcceptSlabHandle(Self(), block_a.slab_id(), dup(fd_a)).ok());
  EXPECT_EQ(NeedsHandle(Resume({})), std::vector<uint64_t>{block_b.slab_id()});

  // The grace time ends: b's slab never got its handle back.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (broker_->live_allocations() > 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(broker_->live_allocations(), 1u);
  v1::ResumeResponse after = Resume({block_a, block_b});
  ASSERT_EQ(after.kept_size(), 1);
  EXPECT_EQ(after.kept(0), block_a.id());
  ASSERT_EQ(after.lost_size(), 1);
  EXPECT_EQ(after.lost(0).id(), block_b.id());
  EXPECT_EQ(after.lost(0).status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(NeedsHandle(after).empty());
  close(fd_a);
  close(fd_b);
}

}  // namespace
}  // namespace gpumem
