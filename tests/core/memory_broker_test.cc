// Tests of MemoryBroker (server/core/memory_broker.h) over SimBackend with
// four small devices. Callers are real processes: the test itself, and
// sleeping children forked before the broker's threads start, so that
// sessions really end when a child is killed.
#include "server/core/memory_broker.h"
#include "tests/core/stats_of.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/sleeping_child.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/sim_backend.h"
#include "common/refusal_payload.h"


namespace gpumem {
namespace {

using ::gpumem::v1::AllocateRequest;
using ::gpumem::v1::AllocateResponse;
using ::gpumem::v1::DeviceRefusal;
using ::gpumem::v1::FreeRequest;
using ::gpumem::v1::GetStatsResponse;
using ::gpumem::v1::PlacementRefusal;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDevice = 256 * kMiB;
constexpr uint64_t kSlab = 16 * kMiB;
constexpr int kDevices = 4;
// Forged uids for "another user" (the broker takes identity as given; the
// transport reads it from the kernel).
constexpr uid_t kUidA = 4242;
constexpr uid_t kUidB = 4243;

using testing::SleepingChild;

PeerCred Self() { return PeerCred{getpid(), getuid(), getgid()}; }
// Stats callers: root sees every session and tenant; an unprivileged uid
// (nobody, no admin group configured) sees only its own and device figures.
PeerCred Root() { return PeerCred{getpid(), 0, 0}; }
PeerCred Nobody() { return PeerCred{getpid(), 65534, 65534}; }

AllocateRequest Request(uint64_t size, std::vector<std::string> devices = {}) {
  AllocateRequest r;
  r.set_size_bytes(size);
  for (const std::string& d : devices) r.mutable_placement()->add_devices(d);
  return r;
}

FreeRequest FreeOf(uint64_t id) {
  FreeRequest r;
  r.set_id(id);
  return r;
}

uint64_t TotalUsed(const GetStatsResponse& s) {
  uint64_t used = 0;
  for (const auto& d : s.devices()) used += d.used_bytes();
  return used;
}

uint64_t TotalAllocations(const GetStatsResponse& s) {
  uint64_t n = 0;
  for (const auto& d : s.devices()) n += d.allocation_count();
  return n;
}

const v1::SessionStats* SessionOf(const GetStatsResponse& s, pid_t pid) {
  for (const auto& ss : s.sessions()) {
    if (ss.pid() == pid) return &ss;
  }
  return nullptr;
}

const v1::TenantStats* TenantIn(const GetStatsResponse& s, uint32_t tenant) {
  for (const auto& t : s.tenants()) {
    if (t.tenant() == tenant) return &t;
  }
  return nullptr;
}

uint64_t TotalRetained(const GetStatsResponse& s) {
  uint64_t retained = 0;
  for (const auto& d : s.devices()) retained += d.retained_bytes();
  return retained;
}

// Devices, sessions and tenants in a canonical text form, for before/after
// compares (tenants come sorted by id).
std::string Canonical(const GetStatsResponse& s) {
  std::string out;
  for (const auto& d : s.devices()) out += d.DebugString();
  std::vector<std::string> sessions;
  for (const auto& ss : s.sessions()) sessions.push_back(ss.DebugString());
  std::sort(sessions.begin(), sessions.end());
  for (const std::string& ss : sessions) out += ss;
  for (const auto& t : s.tenants()) out += t.DebugString();
  return out;
}

// A DeviceStats without its slab list, and one slab's figures without who
// owns and holds it: what every caller may see.
v1::DeviceStats DeviceFigures(v1::DeviceStats d) {
  d.clear_slabs();
  return d;
}
v1::SlabStats SlabFigures(v1::SlabStats s) {
  s.clear_slab_id();
  s.clear_tenant();
  s.clear_holders();
  return s;
}

class MemoryBrokerTest : public ::testing::Test {
 protected:
  // Children first: fork before any broker thread exists.
  MemoryBrokerTest() : backend_({kDevice, kDevice, kDevice, kDevice}) {}

  void SetUp() override { StartBroker(); }

  void StartBroker(absl::Duration release_after = absl::Hours(1),
                   absl::Duration maintenance = absl::Seconds(1)) {
    BrokerOptions o;
    o.pool.slab_size = kSlab;
    o.pool.min_slab_size = kSlab;  // every slab kSlab (slab_footprint_test: growth)
    o.pool.granularity = 4096;
    o.pool.empty_release_after = release_after;
    o.maintenance_interval = maintenance;
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
    ASSERT_TRUE(broker_->Start().ok());
  }

  void TearDown() override { broker_.reset(); }

  absl::StatusOr<AllocateResponse> Alloc(const PeerCred& c, uint64_t size,
                                         std::vector<std::string> devices = {}) {
    return broker_->AllocateAndWait(c, Request(size, std::move(devices)));
  }

  // Waits up to `limit` for `done`; returns how long it took, or limit+.
  template <typename F>
  absl::Duration WaitFor(F done, absl::Duration limit = absl::Seconds(1)) {
    const absl::Time start = absl::Now();
    while (!done()) {
      if (absl::Now() - start > limit) return limit + absl::Milliseconds(1);
      absl::SleepFor(absl::Milliseconds(2));
    }
    return absl::Now() - start;
  }

  SleepingChild child_a_;
  SleepingChild child_b_;
  SimBackend backend_;
  std::unique_ptr<MemoryBroker> broker_;
};

TEST_F(MemoryBrokerTest, AllocateReturnsABlockDescribedInStats) {
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), 3 * kMiB + 5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->allocations_size(), 1);
  const v1::Allocation& a = r->allocations(0);
  EXPECT_NE(a.id(), 0u);
  ASSERT_LT(a.device_index(), static_cast<uint32_t>(kDevices));
  EXPECT_EQ(a.device_uuid(), backend_.devices()[a.device_index()].uuid);
  EXPECT_EQ(a.size_bytes(), 3 * kMiB + 5);
  EXPECT_EQ(a.slab_size_bytes(), kSlab);
  EXPECT_EQ(a.offset() % 256, 0u);  // default alignment
  EXPECT_LE(a.offset() + a.size_bytes(), a.slab_size_bytes());
  EXPECT_EQ(a.handle_kind(), v1::HANDLE_KIND_POSIX_FD);

  GetStatsResponse s = StatsOf(*broker_, Root());
  EXPECT_EQ(s.backend(), "sim");
  ASSERT_EQ(s.devices_size(), kDevices);
  for (int d = 0; d < kDevices; ++d) {
    const v1::DeviceStats& ds = s.devices(d);
    EXPECT_EQ(ds.index(), static_cast<uint32_t>(d));
    EXPECT_EQ(ds.total_bytes(), kDevice);
    const bool here = static_cast<uint32_t>(d) == a.device_index();
    EXPECT_EQ(ds.used_bytes(), here ? 3 * kMiB + 5 : 0);
    EXPECT_EQ(ds.retained_bytes(), 0u);
    // Free: what another tenant could get (the slab's free range is ours).
    EXPECT_EQ(ds.free_bytes(), kDevice - ds.pooled_bytes() - ds.retained_bytes());
    EXPECT_EQ(ds.pooled_bytes(), here ? kSlab : 0);
    EXPECT_EQ(ds.slab_count(), here ? 1u : 0u);
    EXPECT_EQ(ds.allocation_count(), here ? 1u : 0u);
  }
  const v1::SessionStats* me = SessionOf(s, getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->uid(), getuid());
  EXPECT_EQ(me->gid(), getgid());
  EXPECT_EQ(me->allocation_count(), 1u);
  EXPECT_EQ(me->used_bytes(), 3 * kMiB + 5);
  EXPECT_EQ(me->retained_bytes(), 0u);
  ASSERT_EQ(s.tenants_size(), 1);
  const v1::TenantStats& t = s.tenants(0);
  EXPECT_EQ(t.tenant(), getuid());
  EXPECT_EQ(t.used_bytes(), 3 * kMiB + 5);
  EXPECT_EQ(t.retained_bytes(), 0u);
  EXPECT_EQ(t.allocation_count(), 1u);
  ASSERT_EQ(t.devices_size(), 1);
  EXPECT_EQ(t.devices(0).device_index(), a.device_index());
  EXPECT_EQ(t.devices(0).used_bytes(), 3 * kMiB + 5);
  EXPECT_EQ(t.devices(0).slab_count(), 1u);
  // With include_slabs: the one slab, its tenant and no holder yet.
  GetStatsResponse with_slabs = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  const v1::DeviceStats& here = with_slabs.devices(a.device_index());
  ASSERT_EQ(here.slabs_size(), 1);
  EXPECT_EQ(here.slabs(0).slab_id(), a.slab_id());
  EXPECT_EQ(here.slabs(0).tenant(), getuid());
  EXPECT_EQ(here.slabs(0).holders(), 0u);
  EXPECT_FALSE(here.slabs(0).retained());

  absl::StatusOr<v1::Session> session = broker_->GetSession(Self());
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->session_id(), me->session_id());
  EXPECT_EQ(session->pid(), getpid());

  absl::StatusOr<v1::FreeResponse> f = broker_->Free(Self(), FreeOf(a.id()));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->freed_bytes(), 3 * kMiB + 5);
  EXPECT_EQ(TotalUsed(StatsOf(*broker_, Root())), 0u);
}

TEST_F(MemoryBrokerTest, PlacementNamesDevicesByIndexAndUuid) {
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), kMiB, {"2"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->allocations(0).device_index(), 2u);
  std::string uuid = backend_.devices()[1].uuid;
  for (char& c : uuid) c = static_cast<char>(toupper(c));
  r = Alloc(Self(), kMiB, {uuid});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->allocations(0).device_index(), 1u);
  AllocateRequest req = Request(kMiB);
  req.mutable_placement()->add_exclude("0");
  req.mutable_placement()->add_exclude("1");
  req.mutable_placement()->add_exclude("2");
  for (int i = 0; i < 5; ++i) {
    r = broker_->AllocateAndWait(Self(), req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->allocations(0).device_index(), 3u);
  }
}

TEST_F(MemoryBrokerTest, InvalidRequestsChangeNothing) {
  ASSERT_TRUE(broker_->GetSession(Self()).ok());
  const std::string before = Canonical(StatsOf(*broker_, Root()));
  std::vector<AllocateRequest> bad;
  bad.push_back(Request(0));
  bad.push_back(Request(kMiB, {"4"}));
  bad.push_back(Request(kMiB, {""}));
  bad.push_back(Request(kMiB, {"GPU-00000000-0000-0000-0000-000000000000"}));
  bad.push_back(Request(kDevice + 1));
  bad.push_back(Request(UINT64_MAX));
  AllocateRequest r = Request(kMiB);
  r.set_alignment(3);
  bad.push_back(r);
  r = Request(kMiB);
  r.set_shard_count(5);  // only 4 devices
  bad.push_back(r);
  r = Request(0);
  r.add_shard_sizes(kMiB);
  r.add_shard_sizes(0);
  bad.push_back(r);
  for (const AllocateRequest& req : bad) {
    absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(Self(), req);
    EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument)
        << req.ShortDebugString() << ": " << res.status();
  }
  EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), before);
}

// The core's Try* calls never call the backend (what a thread serving many
// clients uses): a request that needs a new slab, on any of its shards,
// changes nothing and says so; one that fits existing slabs is served as
// usual.
TEST_F(MemoryBrokerTest, TryAllocateWithoutBackendWorkNeedsItOrChangesNothing) {
  using Kind = MemoryBroker::AllocateOutcome::Kind;
  ASSERT_TRUE(broker_->GetSession(Self()).ok());
  const std::string empty = Canonical(StatsOf(*broker_, Root()));
  MemoryBroker::AllocateOutcome r = broker_->TryAllocate(Self(), Request(kMiB, {"0"}));
  EXPECT_EQ(r.kind, Kind::kNeedsBackendWork);
  EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), empty);
  // A slab on device 0 made the usual way; the next block fits it inline.
  absl::StatusOr<AllocateResponse> first = broker_->AllocateAndWait(Self(), Request(kMiB, {"0"}));
  ASSERT_TRUE(first.ok()) << first.status();
  r = broker_->TryAllocate(Self(), Request(kMiB, {"0"}));
  ASSERT_EQ(r.kind, Kind::kAnswered);
  ASSERT_TRUE(r.answer.ok()) << r.answer.status();
  EXPECT_EQ(r.answer->allocations(0).slab_id(), first->allocations(0).slab_id());
  // Sharded over devices 0 and 1: shard 0 fits, shard 1 needs a slab, so
  // the whole request needs backend work and shard 0's block is undone.
  const std::string before = Canonical(StatsOf(*broker_, Root()));
  AllocateRequest sharded = Request(2 * kMiB, {"0", "1"});
  sharded.set_shard_count(2);
  r = broker_->TryAllocate(Self(), sharded);
  EXPECT_EQ(r.kind, Kind::kNeedsBackendWork);
  EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), before);
  // Larger than any device: the same INVALID_ARGUMENT as ever.
  r = broker_->TryAllocate(Self(), Request(kDevice + 1));
  ASSERT_EQ(r.kind, Kind::kAnswered);
  EXPECT_EQ(r.answer.status().code(), absl::StatusCode::kInvalidArgument);

  // Free: a block in a shared slab is freed inline; a dedicated slab's block
  // (its slab goes back with it) needs backend work and stays live.
  v1::FreeRequest free;
  free.set_id(first->allocations(0).id());
  std::optional<absl::StatusOr<v1::FreeResponse>> now = broker_->TryFree(Self(), free);
  ASSERT_TRUE(now.has_value());
  EXPECT_TRUE(now->ok()) << now->status();
  absl::StatusOr<AllocateResponse> big = broker_->AllocateAndWait(Self(), Request(kSlab + kMiB));
  ASSERT_TRUE(big.ok()) << big.status();
  const std::string with_big = Canonical(StatsOf(*broker_, Root()));
  free.set_id(big->allocations(0).id());
  EXPECT_FALSE(broker_->TryFree(Self(), free).has_value());
  EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), with_big);
  absl::StatusOr<v1::FreeResponse> f = broker_->Free(Self(), free);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->freed_bytes(), kSlab + kMiB);
  // A free the table refuses (another uid's) is answered as Free answers it.
  absl::StatusOr<AllocateResponse> mine = broker_->AllocateAndWait(Self(), Request(kMiB, {"0"}));
  ASSERT_TRUE(mine.ok());
  free.set_id(mine->allocations(0).id());
  now = broker_->TryFree(child_a_.Cred(kUidA, kUidA), free);
  ASSERT_TRUE(now.has_value());
  // (To a non-admin another's allocation is one that does not exist.)
  EXPECT_EQ(now->status().code(), absl::StatusCode::kNotFound);
}

TEST_F(MemoryBrokerTest, FreeRules) {
  absl::StatusOr<AllocateResponse> mine = Alloc(Self(), kMiB);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const uint64_t my_id = mine->allocations(0).id();
  const uid_t other = getuid() == kUidA ? kUidB : kUidA;

  // Another uid (not root): denied as if the id did not exist (no oracle),
  // and the block stays.
  absl::StatusOr<v1::FreeResponse> f =
      broker_->Free(PeerCred{getpid(), other, other}, FreeOf(my_id));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_EQ(TotalUsed(StatsOf(*broker_, Root())), kMiB);

  // The same uid from another process: allowed.
  f = broker_->Free(child_a_.Cred(), FreeOf(my_id));
  EXPECT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(TotalUsed(StatsOf(*broker_, Root())), 0u);

  // Double free, id 0, unknown id.
  f = broker_->Free(Self(), FreeOf(my_id));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  f = broker_->Free(Self(), FreeOf(0));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  f = broker_->Free(Self(), FreeOf(987654321));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  f = broker_->Free(Self(), FreeOf(UINT64_MAX));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
}

TEST_F(MemoryBrokerTest, UidRulesForForeignAllocations) {
  // uid A's allocation, made by child A.
  absl::StatusOr<AllocateResponse> a = Alloc(child_a_.Cred(kUidA, kUidA), 2 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t id = a->allocations(0).id();
  // uid B (child B) may not free it; uid A from another process may.
  absl::StatusOr<v1::FreeResponse> f =
      broker_->Free(child_b_.Cred(kUidB, kUidB), FreeOf(id));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  f = broker_->Free(child_b_.Cred(kUidA, kUidA), FreeOf(id));
  EXPECT_TRUE(f.ok()) << f.status();

  // Root may free anything.
  a = Alloc(child_a_.Cred(kUidA, kUidA), 2 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  f = broker_->Free(PeerCred{getpid(), 0, 0}, FreeOf(a->allocations(0).id()));
  EXPECT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->freed_bytes(), 2 * kMiB);
  EXPECT_EQ(TotalUsed(StatsOf(*broker_, Root())), 0u);
  EXPECT_EQ(TotalAllocations(StatsOf(*broker_, Root())), 0u);
}

// ---------------------------------------------------------------------------
// Sessions

TEST_F(MemoryBrokerTest, KilledProcessLosesItsMemoryWithinASecond) {
  const PeerCred child = child_a_.Cred();
  std::vector<uint64_t> ids;
  for (uint64_t size : {kMiB, 20 * kMiB, 4096 * uint64_t{3}}) {
    absl::StatusOr<AllocateResponse> r = Alloc(child, size);
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->allocations(0).id());
  }
  AllocateRequest sharded = Request(8 * kMiB);
  sharded.set_shard_count(3);
  absl::StatusOr<AllocateResponse> r = broker_->AllocateAndWait(child, sharded);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& a : r->allocations()) ids.push_back(a.id());
  // The live caller's block must survive the child's death.
  absl::StatusOr<AllocateResponse> mine = Alloc(Self(), 5 * kMiB);
  ASSERT_TRUE(mine.ok()) << mine.status();

  GetStatsResponse s = StatsOf(*broker_, Root());
  const v1::SessionStats* cs = SessionOf(s, child_a_.pid());
  ASSERT_NE(cs, nullptr);
  EXPECT_EQ(cs->allocation_count(), 6u);
  EXPECT_EQ(cs->used_bytes(), kMiB + 20 * kMiB + 3 * 4096 + 8 * kMiB);
  EXPECT_EQ(TotalUsed(s), kMiB + 20 * kMiB + 3 * 4096 + 8 * kMiB + 5 * kMiB);

  child_a_.Kill();  // a zombie until reaped; its pidfd reports the exit
  const absl::Duration took = WaitFor([&] {
    GetStatsResponse now = StatsOf(*broker_, Root());
    return TotalUsed(now) == 5 * kMiB && SessionOf(now, child_a_.pid()) == nullptr;
  });
  EXPECT_LE(took, absl::Seconds(1)) << "session not reclaimed within 1 s";
  s = StatsOf(*broker_, Root());
  EXPECT_EQ(TotalUsed(s), 5 * kMiB);
  EXPECT_EQ(TotalAllocations(s), 1u);
  EXPECT_EQ(SessionOf(s, child_a_.pid()), nullptr);
  EXPECT_NE(SessionOf(s, getpid()), nullptr);
  for (uint64_t id : ids) {
    EXPECT_EQ(broker_->Free(Self(), FreeOf(id)).status().code(),
              absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(broker_->Free(Self(), FreeOf(mine->allocations(0).id())).ok());
  child_a_.Reap();
}

TEST_F(MemoryBrokerTest, CallerThatHasExitedGetsNoMemory) {
  const PeerCred gone = child_a_.Cred();
  child_a_.Kill();
  child_a_.Reap();
  absl::StatusOr<AllocateResponse> r = Alloc(gone, kMiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  // Whatever happened, nothing stays allocated for it.
  EXPECT_LE(WaitFor([&] { return TotalUsed(StatsOf(*broker_, Root())) == 0; }),
            absl::Seconds(1));
  EXPECT_EQ(SessionOf(StatsOf(*broker_, Root()), gone.pid), nullptr);
}

TEST_F(MemoryBrokerTest, CallerWithoutPidIsDenied) {
  const std::string before = Canonical(StatsOf(*broker_, Root()));
  const PeerCred nopid{0, getuid(), getgid()};
  absl::StatusOr<AllocateResponse> r = Alloc(nopid, kMiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_EQ(broker_->GetSession(nopid).status().code(),
            absl::StatusCode::kPermissionDenied);
  const PeerCred negative{-5, getuid(), getgid()};
  EXPECT_EQ(Alloc(negative, kMiB).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(broker_->ExportSlab(nopid, 1).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(broker_->CloseSlab(nopid, 1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), before);
}

// ---------------------------------------------------------------------------
// Slab handles

TEST_F(MemoryBrokerTest, ExportSlabGivesAMappableSharedSlab) {
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), 64 * 1024);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::Allocation& a = r->allocations(0);

  absl::StatusOr<SlabFd> fd1 = broker_->ExportSlab(Self(), a.slab_id());
  absl::StatusOr<SlabFd> fd2 = broker_->ExportSlab(Self(), a.slab_id());
  ASSERT_TRUE(fd1.ok()) << fd1.status();
  ASSERT_TRUE(fd2.ok()) << fd2.status();
  EXPECT_NE(fd1->fd, fd2->fd);
  EXPECT_EQ(fd1->size, a.slab_size_bytes());
  struct stat st;
  ASSERT_EQ(fstat(fd1->fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), a.slab_size_bytes());

  void* m1 = mmap(nullptr, fd1->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd1->fd, 0);
  void* m2 = mmap(nullptr, fd2->size, PROT_READ, MAP_SHARED, fd2->fd, 0);
  ASSERT_NE(m1, MAP_FAILED);
  ASSERT_NE(m2, MAP_FAILED);
  unsigned char* w = static_cast<unsigned char*>(m1) + a.offset();
  const unsigned char* rd = static_cast<const unsigned char*>(m2) + a.offset();
  EXPECT_EQ(rd[0], 0);  // a new slab reads as zeros
  for (uint64_t i = 0; i < a.size_bytes(); ++i) w[i] = static_cast<unsigned char>(i * 7 + 1);
  bool same = true;
  for (uint64_t i = 0; i < a.size_bytes(); ++i) {
    same &= rd[i] == static_cast<unsigned char>(i * 7 + 1);
  }
  EXPECT_TRUE(same) << "bytes written through one mapping not seen through the other";
  munmap(m1, fd1->size);
  munmap(m2, fd2->size);
  close(fd1->fd);
  close(fd2->fd);

  // Another uid holding nothing there: NOT_FOUND, as an unknown slab (no
  // oracle); root is told it is another tenant's.
  const uid_t other = getuid() == kUidA ? kUidB : kUidA;
  EXPECT_EQ(broker_->ExportSlab(child_a_.Cred(other, other), a.slab_id()).status().code(),
            absl::StatusCode::kNotFound);
  if (getuid() != 0) {
    EXPECT_EQ(broker_->ExportSlab(child_a_.Cred(0, 0), a.slab_id()).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(broker_->ExportSlab(Self(), a.slab_id() + 100000).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->ExportSlab(Self(), 0).status().code(), absl::StatusCode::kNotFound);
  // Two exports, one session: one holder.
  GetStatsResponse s = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  ASSERT_EQ(s.devices(a.device_index()).slabs_size(), 1);
  EXPECT_EQ(s.devices(a.device_index()).slabs(0).holders(), 1u);

  // Once the block is freed the empty slab is still the caller's tenant's
  // (a slab never changes tenant), so its handle may still be given to it,
  // and still not to another uid.
  ASSERT_TRUE(broker_->Free(Self(), FreeOf(a.id())).ok());
  absl::StatusOr<SlabFd> again = broker_->ExportSlab(Self(), a.slab_id());
  ASSERT_TRUE(again.ok()) << again.status();
  close(again->fd);
  EXPECT_EQ(broker_->ExportSlab(child_a_.Cred(other, other), a.slab_id()).status().code(),
            absl::StatusCode::kNotFound);
  // The caller says it closed the slab: once, then there is nothing to close.
  EXPECT_TRUE(broker_->CloseSlab(Self(), a.slab_id()).ok());
  EXPECT_EQ(broker_->CloseSlab(Self(), a.slab_id()).code(), absl::StatusCode::kNotFound);
  s = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  ASSERT_EQ(s.devices(a.device_index()).slabs_size(), 1);
  EXPECT_EQ(s.devices(a.device_index()).slabs(0).holders(), 0u);
  EXPECT_EQ(s.devices(a.device_index()).slabs(0).tenant(), getuid());
}

TEST_F(MemoryBrokerTest, ExportSlabOfADedicatedSlab) {
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), 40 * kMiB + 1);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::Allocation& a = r->allocations(0);
  EXPECT_EQ(a.slab_size_bytes(), 40 * kMiB + 4096);
  const uint64_t slab_size = 40 * kMiB + 4096;
  absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Self(), a.slab_id());
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(fd->size, slab_size);
  close(fd->fd);
  ASSERT_TRUE(broker_->Free(Self(), FreeOf(a.id())).ok());
  // A dedicated slab is released with its block, but this process was
  // given its handle and has not closed it: retained, counted, not free.
  const uint32_t d = a.device_index();
  EXPECT_EQ(backend_.SlabBytes(d), slab_size);
  GetStatsResponse s = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  EXPECT_EQ(s.devices(d).used_bytes(), 0u);
  EXPECT_EQ(s.devices(d).retained_bytes(), slab_size);
  EXPECT_EQ(s.devices(d).free_bytes(), kDevice - slab_size);
  EXPECT_EQ(s.devices(d).pooled_bytes(), 0u);
  EXPECT_EQ(s.devices(d).slab_count(), 0u);
  ASSERT_EQ(s.devices(d).slabs_size(), 1);
  EXPECT_TRUE(s.devices(d).slabs(0).retained());
  EXPECT_TRUE(s.devices(d).slabs(0).dedicated());
  EXPECT_EQ(s.devices(d).slabs(0).holders(), 1u);
  const v1::SessionStats* me = SessionOf(s, getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->retained_bytes(), slab_size);
  EXPECT_EQ(me->used_bytes(), 0u);
  EXPECT_EQ(broker_->ExportSlab(Self(), a.slab_id()).status().code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(broker_->CloseSlab(Self(), a.slab_id()).ok());
  EXPECT_EQ(backend_.SlabBytes(d), 0u);  // now released
  s = StatsOf(*broker_, Root());
  EXPECT_EQ(s.devices(d).retained_bytes(), 0u);
  EXPECT_EQ(s.devices(d).free_bytes(), kDevice);
  EXPECT_EQ(SessionOf(s, getpid())->retained_bytes(), 0u);
  EXPECT_EQ(s.tenants_size(), 0);
}

// Isolation between users (DESIGN.md "Tenants, quotas, isolation"): a slab's
// handle maps the whole slab, so two uids must never have blocks in the same
// slab, or the one could read and write the other's memory.
TEST_F(MemoryBrokerTest, DifferentUidsNeverShareASlab) {
  absl::StatusOr<AllocateResponse> a = Alloc(child_a_.Cred(kUidA, kUidA), kMiB, {"0"});
  absl::StatusOr<AllocateResponse> b = Alloc(child_b_.Cred(kUidB, kUidB), kMiB, {"0"});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->allocations(0).slab_id(), b->allocations(0).slab_id())
      << "uids " << kUidA << " and " << kUidB << " got blocks in one slab";
  // uid B must not get a handle to the slab holding uid A's block.
  absl::StatusOr<SlabFd> fd =
      broker_->ExportSlab(child_b_.Cred(kUidB, kUidB), a->allocations(0).slab_id());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kNotFound) << fd.status();
  if (fd.ok()) close(fd->fd);
}

// A slab never passes from one uid to another (it would be readable through
// any fd or mapping the first uid kept): when device 0 is full of uid A's
// empty slabs, uid B gets a new slab, and nothing B writes is visible
// through A's old mapping, nor anything of A's through B's.
TEST_F(MemoryBrokerTest, MemoryOfOneUidIsNeverHandedToAnother) {
  const PeerCred a_cred = child_a_.Cred(kUidA, kUidA);
  const PeerCred b_cred = child_b_.Cred(kUidB, kUidB);
  std::vector<v1::Allocation> a_blocks;
  std::set<uint64_t> a_slabs;
  for (int i = 0; i < static_cast<int>(kDevice / kSlab); ++i) {  // device 0 full
    absl::StatusOr<AllocateResponse> a = Alloc(a_cred, kSlab, {"0"});
    ASSERT_TRUE(a.ok()) << i << ": " << a.status();
    a_blocks.push_back(a->allocations(0));
    a_slabs.insert(a->allocations(0).slab_id());
  }
  ASSERT_EQ(backend_.SlabBytes(0), kDevice);
  // uid A maps two of its slabs and writes its secret; it says it closed
  // the first (but keeps the mapping) and keeps holding the second.
  std::vector<void*> maps;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<SlabFd> fd = broker_->ExportSlab(a_cred, a_blocks[i].slab_id());
    ASSERT_TRUE(fd.ok()) << fd.status();
    void* m = mmap(nullptr, fd->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd->fd, 0);
    close(fd->fd);
    ASSERT_NE(m, MAP_FAILED);
    memset(m, 0xEE, kSlab);
    maps.push_back(m);
  }
  ASSERT_TRUE(broker_->CloseSlab(a_cred, a_blocks[0].slab_id()).ok());
  for (const v1::Allocation& blk : a_blocks) {
    ASSERT_TRUE(broker_->Free(a_cred, FreeOf(blk.id())).ok());
  }

  absl::StatusOr<AllocateResponse> b = Alloc(b_cred, kSlab, {"0"});
  ASSERT_TRUE(b.ok()) << b.status();
  const v1::Allocation& bb = b->allocations(0);
  EXPECT_EQ(a_slabs.count(bb.slab_id()), 0u)
      << "uid " << kUidB << " was given a slab of uid " << kUidA;
  EXPECT_LE(backend_.SlabBytes(0), kDevice);
  // The slab uid A still holds stays A's (empty, held, not released: that
  // would free nothing), never B's; the others went back for B's slab.
  GetStatsResponse s = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  EXPECT_EQ(s.devices(0).retained_bytes(), 0u);
  EXPECT_EQ(s.devices(0).used_bytes(), kSlab);
  bool held_kept = false;
  for (const v1::SlabStats& slab : s.devices(0).slabs()) {
    if (slab.slab_id() == a_blocks[1].slab_id()) held_kept = slab.holders() == 1;
  }
  EXPECT_TRUE(held_kept);
  for (const v1::SlabStats& slab : s.devices(0).slabs()) {
    const bool of_a = a_slabs.count(slab.slab_id()) != 0;
    EXPECT_EQ(slab.tenant(), of_a ? kUidA : kUidB) << "slab " << slab.slab_id();
    if (of_a) EXPECT_EQ(slab.live_blocks(), 0u);
  }
  EXPECT_EQ(SessionOf(s, child_a_.pid())->retained_bytes(), 0u);

  absl::StatusOr<SlabFd> bfd = broker_->ExportSlab(b_cred, bb.slab_id());
  ASSERT_TRUE(bfd.ok()) << bfd.status();
  void* bm = mmap(nullptr, bfd->size, PROT_READ | PROT_WRITE, MAP_SHARED, bfd->fd, 0);
  close(bfd->fd);
  ASSERT_NE(bm, MAP_FAILED);
  unsigned char* p = static_cast<unsigned char*>(bm);
  uint64_t nonzero = 0;
  for (uint64_t i = 0; i < bfd->size; ++i) nonzero += p[i] != 0;
  EXPECT_EQ(nonzero, 0u) << "uid " << kUidB << " reads uid " << kUidA
                         << "'s bytes (slab " << bb.slab_id() << ")";
  memset(bm, 0x11, bfd->size);  // uid B's secret
  for (void* m : maps) {
    const unsigned char* old = static_cast<const unsigned char*>(m);
    uint64_t of_b = 0, of_a = 0;
    for (uint64_t i = 0; i < kSlab; ++i) {
      of_b += old[i] == 0x11;
      of_a += old[i] == 0xEE;
    }
    EXPECT_EQ(of_b, 0u) << "uid " << kUidA << "'s old mapping shows uid " << kUidB
                        << "'s bytes";
    EXPECT_EQ(of_a, kSlab);
    munmap(m, kSlab);
  }
  munmap(bm, bfd->size);
  // uid B may not take uid A's slabs, empty or retained.
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(broker_->ExportSlab(b_cred, a_blocks[i].slab_id()).status().code(),
              absl::StatusCode::kOk);
  }
  ASSERT_TRUE(broker_->CloseSlab(a_cred, a_blocks[1].slab_id()).ok());
  EXPECT_EQ(TotalRetained(StatsOf(*broker_, Root())), 0u);
}

// A slab released (here: idle) while this process holds its handle stays
// retained, shown in every figure, until the process closes it.
TEST_F(MemoryBrokerTest, RetainedSlabIsShownUntilTheHolderClosesIt) {
  broker_.reset();
  StartBroker(/*release_after=*/absl::ZeroDuration(),
              /*maintenance=*/absl::Milliseconds(2));
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), kMiB, {"0"});
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t slab = r->allocations(0).slab_id();
  absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Self(), slab);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(fd->fd);
  ASSERT_TRUE(broker_->Free(Self(), FreeOf(r->allocations(0).id())).ok());
  EXPECT_LE(WaitFor([&] {
              return StatsOf(*broker_, Root()).devices(0).retained_bytes() == kSlab;
            }),
            absl::Seconds(1))
      << "the idle slab was not released (as retained)";

  GetStatsResponse s = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  const v1::DeviceStats& d = s.devices(0);
  EXPECT_EQ(d.used_bytes(), 0u);
  EXPECT_EQ(d.retained_bytes(), kSlab);
  EXPECT_EQ(d.free_bytes(), kDevice - kSlab);
  EXPECT_EQ(d.pooled_bytes(), 0u);
  EXPECT_EQ(d.slab_count(), 0u);
  EXPECT_EQ(d.largest_free_block_bytes(), kDevice - kSlab);
  ASSERT_EQ(d.slabs_size(), 1);
  EXPECT_EQ(d.slabs(0).slab_id(), slab);
  EXPECT_TRUE(d.slabs(0).retained());
  EXPECT_EQ(d.slabs(0).holders(), 1u);
  EXPECT_EQ(d.slabs(0).tenant(), getuid());
  const v1::SessionStats* me = SessionOf(s, getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->retained_bytes(), kSlab);
  EXPECT_EQ(me->used_bytes(), 0u);
  const v1::TenantStats* t = TenantIn(s, getuid());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->used_bytes(), 0u);
  EXPECT_EQ(t->retained_bytes(), kSlab);
  EXPECT_EQ(t->allocation_count(), 0u);
  ASSERT_EQ(t->devices_size(), 1);
  EXPECT_EQ(t->devices(0).device_index(), 0u);
  EXPECT_EQ(t->devices(0).retained_bytes(), kSlab);
  EXPECT_EQ(t->devices(0).slab_count(), 0u);
  EXPECT_EQ(backend_.SlabBytes(0), kSlab);
  // Retained: not given out again.
  EXPECT_EQ(broker_->ExportSlab(Self(), slab).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(broker_->CloseSlab(Self(), slab).ok());
  EXPECT_EQ(backend_.SlabBytes(0), 0u);
  s = StatsOf(*broker_, Root());
  EXPECT_EQ(s.devices(0).retained_bytes(), 0u);
  EXPECT_EQ(s.devices(0).free_bytes(), kDevice);
  EXPECT_EQ(SessionOf(s, getpid())->retained_bytes(), 0u);
  EXPECT_EQ(TenantIn(s, getuid()), nullptr);
  EXPECT_EQ(broker_->CloseSlab(Self(), slab).code(), absl::StatusCode::kNotFound);
}

// A process that dies holding a released slab's handle lets go of it.
TEST_F(MemoryBrokerTest, RetainedSlabIsReturnedWhenTheHolderExits) {
  const PeerCred a = child_a_.Cred(kUidA, kUidA);
  absl::StatusOr<AllocateResponse> r = Alloc(a, 40 * kMiB + 1, {"1"});  // dedicated
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t slab_size = r->allocations(0).slab_size_bytes();
  absl::StatusOr<SlabFd> fd = broker_->ExportSlab(a, r->allocations(0).slab_id());
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(fd->fd);
  ASSERT_TRUE(broker_->Free(a, FreeOf(r->allocations(0).id())).ok());
  GetStatsResponse s = StatsOf(*broker_, Root());
  EXPECT_EQ(s.devices(1).retained_bytes(), slab_size);
  EXPECT_EQ(s.devices(1).free_bytes(), kDevice - slab_size);
  ASSERT_NE(SessionOf(s, child_a_.pid()), nullptr);
  EXPECT_EQ(SessionOf(s, child_a_.pid())->retained_bytes(), slab_size);
  ASSERT_NE(TenantIn(s, kUidA), nullptr);
  EXPECT_EQ(TenantIn(s, kUidA)->retained_bytes(), slab_size);
  EXPECT_EQ(backend_.SlabBytes(1), slab_size);

  child_a_.Kill();
  EXPECT_LE(WaitFor([&] { return backend_.SlabBytes(1) == 0; }), absl::Seconds(1))
      << "retained slab not returned after its holder exited";
  s = StatsOf(*broker_, Root());
  EXPECT_EQ(s.devices(1).retained_bytes(), 0u);
  EXPECT_EQ(s.devices(1).free_bytes(), kDevice);
  EXPECT_EQ(TenantIn(s, kUidA), nullptr);
  child_a_.Reap();
}

TEST_F(MemoryBrokerTest, CloseSlabOfASlabNeverGivenIsNotFound) {
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), kMiB, {"0"});
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t slab = r->allocations(0).slab_id();
  EXPECT_EQ(broker_->CloseSlab(Self(), slab).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->CloseSlab(Self(), 987654321).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->CloseSlab(Self(), 0).code(), absl::StatusCode::kNotFound);
  absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Self(), slab);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(fd->fd);
  // Given to this process, not to another one of the same uid.
  EXPECT_EQ(broker_->CloseSlab(child_a_.Cred(), slab).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(broker_->CloseSlab(PeerCred{0, getuid(), getgid()}, slab).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(broker_->CloseSlab(Self(), slab).ok());
}

// Stats: device figures for everyone; sessions, tenants and slab owners only
// for the caller's own uid, unless it is root.
TEST_F(MemoryBrokerTest, StatsShowAnotherUidOnlyDeviceFigures) {
  const PeerCred a = child_a_.Cred(kUidA, kUidA);
  const PeerCred b = child_b_.Cred(kUidB, kUidB);
  ASSERT_TRUE(Alloc(a, 3 * kMiB, {"0"}).ok());
  absl::StatusOr<AllocateResponse> rb = Alloc(b, 5 * kMiB, {"1"});
  ASSERT_TRUE(rb.ok()) << rb.status();
  absl::StatusOr<SlabFd> fd = broker_->ExportSlab(b, rb->allocations(0).slab_id());
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(fd->fd);
  ASSERT_TRUE(broker_->GetSession(Self()).ok());

  const GetStatsResponse all = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  EXPECT_EQ(all.sessions_size(), 3);
  ASSERT_EQ(all.tenants_size(), 2);
  EXPECT_EQ(all.tenants(0).tenant(), kUidA);  // sorted by id
  EXPECT_EQ(all.tenants(1).tenant(), kUidB);
  EXPECT_EQ(all.tenants(1).used_bytes(), 5 * kMiB);
  ASSERT_EQ(all.devices(1).slabs_size(), 1);
  EXPECT_EQ(all.devices(1).slabs(0).tenant(), kUidB);
  EXPECT_EQ(all.devices(1).slabs(0).holders(), 1u);

  // uid 65534 (nobody, no admin group): every device figure, nobody's
  // sessions or tenants, and no slab's owner or holders.
  const GetStatsResponse n = StatsOf(*broker_, Nobody(), /*include_slabs=*/true);
  EXPECT_EQ(n.backend(), "sim");
  EXPECT_EQ(n.sessions_size(), 0);
  EXPECT_EQ(n.tenants_size(), 0);
  ASSERT_EQ(n.devices_size(), kDevices);
  for (int d = 0; d < kDevices; ++d) {
    EXPECT_EQ(DeviceFigures(n.devices(d)).DebugString(),
              DeviceFigures(all.devices(d)).DebugString())
        << "device " << d;
    ASSERT_EQ(n.devices(d).slabs_size(), all.devices(d).slabs_size());
    for (int i = 0; i < n.devices(d).slabs_size(); ++i) {
      const v1::SlabStats& slab = n.devices(d).slabs(i);
      EXPECT_EQ(slab.tenant(), 0u) << "slab owner shown to another uid";
      EXPECT_EQ(slab.holders(), 0u) << "slab holders shown to another uid";
      EXPECT_EQ(slab.slab_id(), 0u) << "another tenant's slab id shown to another uid";
      EXPECT_EQ(SlabFigures(slab).DebugString(),
                SlabFigures(all.devices(d).slabs(i)).DebugString());
    }
  }
  EXPECT_EQ(TotalUsed(n), 8 * kMiB);
  EXPECT_EQ(TotalAllocations(n), 2u);

  // uid B: its own session and tenant, its own slab's owner and holders.
  const GetStatsResponse own = StatsOf(*broker_, PeerCred{getpid(), kUidB, kUidB}, true);
  ASSERT_EQ(own.sessions_size(), 1);
  EXPECT_EQ(own.sessions(0).pid(), child_b_.pid());
  EXPECT_EQ(own.sessions(0).used_bytes(), 5 * kMiB);
  ASSERT_EQ(own.tenants_size(), 1);
  EXPECT_EQ(own.tenants(0).tenant(), kUidB);
  EXPECT_EQ(own.tenants(0).used_bytes(), 5 * kMiB);
  EXPECT_EQ(own.devices(1).slabs(0).tenant(), kUidB);
  EXPECT_EQ(own.devices(1).slabs(0).holders(), 1u);
  ASSERT_EQ(own.devices(0).slabs_size(), 1);
  EXPECT_EQ(own.devices(0).slabs(0).tenant(), 0u);  // uid A's: not shown
  EXPECT_EQ(TotalUsed(own), 8 * kMiB);

  // Asking for stats opens no session.
  EXPECT_EQ(StatsOf(*broker_, Root()).sessions_size(), 3);
}

// ---------------------------------------------------------------------------
// Shutdown

TEST_F(MemoryBrokerTest, ShutdownReleasesEverySlabAndRefusesCalls) {
  std::vector<uint64_t> ids;
  uint64_t slab = 0;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<AllocateResponse> r = Alloc(Self(), (i + 1) * 3 * kMiB);
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->allocations(0).id());
    slab = r->allocations(0).slab_id();
  }
  ASSERT_TRUE(Alloc(child_a_.Cred(), kMiB).ok());
  // A retained slab (dedicated, freed while this process holds its handle)
  // goes back at shutdown too.
  absl::StatusOr<AllocateResponse> held = Alloc(Self(), 40 * kMiB);
  ASSERT_TRUE(held.ok()) << held.status();
  absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Self(), held->allocations(0).slab_id());
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(fd->fd);
  ASSERT_TRUE(broker_->Free(Self(), FreeOf(held->allocations(0).id())).ok());
  ASSERT_EQ(TotalRetained(StatsOf(*broker_, Root())), 40 * kMiB);
  broker_->Shutdown();
  for (int d = 0; d < kDevices; ++d) {
    EXPECT_EQ(backend_.SlabBytes(d), 0u) << "device " << d;
  }
  EXPECT_EQ(broker_->CloseSlab(Self(), held->allocations(0).slab_id()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Alloc(Self(), kMiB).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(broker_->Free(Self(), FreeOf(ids[0])).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(broker_->Free(Self(), FreeOf(0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(broker_->ExportSlab(Self(), slab).status().code(),
            absl::StatusCode::kFailedPrecondition);
  GetStatsResponse s = StatsOf(*broker_, Root());
  EXPECT_EQ(TotalUsed(s), 0u);
  for (const auto& d : s.devices()) {
    EXPECT_EQ(d.pooled_bytes(), 0u);
    EXPECT_EQ(d.slab_count(), 0u);
    EXPECT_EQ(d.retained_bytes(), 0u);
    EXPECT_EQ(d.free_bytes(), d.total_bytes());
  }
  EXPECT_EQ(s.tenants_size(), 0);
  broker_->Shutdown();  // idempotent
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(backend_.SlabBytes(d), 0u);
}

TEST_F(MemoryBrokerTest, EveryCallAfterShutdownIsFailedPrecondition) {
  broker_->Shutdown();
  EXPECT_EQ(broker_->GetSession(Self()).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "GetSession after Shutdown";
  EXPECT_EQ(Alloc(Self(), UINT64_MAX).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "oversized Allocate after Shutdown";
  EXPECT_EQ(Alloc(PeerCred{0, getuid(), getgid()}, kMiB).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "Allocate without pid after Shutdown";
  // No new sessions are opened by a shut-down broker.
  EXPECT_EQ(StatsOf(*broker_, Root()).sessions_size(), 0);
}

TEST_F(MemoryBrokerTest, ShutdownWithReservationReturnsIt) {
  broker_.reset();
  BrokerOptions o;
  o.pool.slab_size = kSlab;
  o.pool.granularity = 4096;
  o.pool.reserve_fraction = 0.5;
  broker_ = std::make_unique<MemoryBroker>(&backend_, o);
  ASSERT_TRUE(broker_->Start().ok());
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(backend_.SlabBytes(d), kDevice / 2);
  ASSERT_TRUE(Alloc(Self(), kMiB).ok());
  broker_->Shutdown();
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(backend_.SlabBytes(d), 0u);
}

// ---------------------------------------------------------------------------
// Sharding and refusals

TEST_F(MemoryBrokerTest, ShardedAllocationLandsOnDistinctDevices) {
  AllocateRequest r = Request(4 * kMiB + 3);
  r.set_shard_count(4);
  absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(Self(), r);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->allocations_size(), 4);
  std::set<uint32_t> devices;
  for (int i = 0; i < 4; ++i) {
    devices.insert(res->allocations(i).device_index());
    EXPECT_EQ(res->allocations(i).size_bytes(), i == 3 ? kMiB + 3 : kMiB);
  }
  EXPECT_EQ(devices.size(), 4u);

  AllocateRequest e;
  e.add_shard_sizes(3 * kMiB);
  e.add_shard_sizes(1 * kMiB);
  e.add_shard_sizes(40 * kMiB);  // dedicated slab
  res = broker_->AllocateAndWait(Self(), e);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->allocations_size(), 3);
  devices.clear();
  const uint64_t want[] = {3 * kMiB, 1 * kMiB, 40 * kMiB};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(res->allocations(i).size_bytes(), want[i]);
    devices.insert(res->allocations(i).device_index());
  }
  EXPECT_EQ(devices.size(), 3u);
  EXPECT_EQ(TotalUsed(StatsOf(*broker_, Root())), 4 * kMiB + 3 + 44 * kMiB);
  EXPECT_EQ(TotalAllocations(StatsOf(*broker_, Root())), 7u);
}

TEST_F(MemoryBrokerTest, FailingShardedRequestLeavesStatsIdentical) {
  // Device 3 is full; devices 0..2 hold no slab yet.
  absl::StatusOr<AllocateResponse> full = Alloc(Self(), kDevice, {"3"});
  ASSERT_TRUE(full.ok()) << full.status();
  {
    SCOPED_TRACE("largest shard refused first: nothing carved");
    const std::string before = Canonical(StatsOf(*broker_, Root()));
    AllocateRequest r;
    r.add_shard_sizes(kMiB);
    r.add_shard_sizes(kDevice + 1);  // fits on no device
    absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(Self(), r);
    ASSERT_EQ(res.status().code(), absl::StatusCode::kResourceExhausted) << res.status();
    EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), before);
  }
  {
    SCOPED_TRACE("three shards carved on new slabs, the fourth refused");
    const std::string before = Canonical(StatsOf(*broker_, Root()));
    AllocateRequest r = Request(4 * kMiB);
    r.set_shard_count(4);
    absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(Self(), r);
    ASSERT_EQ(res.status().code(), absl::StatusCode::kResourceExhausted) << res.status();
    std::optional<PlacementRefusal> refusal = RefusalFromStatus(res.status());
    ASSERT_TRUE(refusal.has_value()) << res.status();
    EXPECT_EQ(refusal->shard_count(), 4u);
    EXPECT_EQ(refusal->total_bytes(), 4 * kMiB);
    EXPECT_EQ(refusal->size_bytes(), kMiB);
    ASSERT_EQ(refusal->devices_size(), 4);
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(refusal->devices(d).reason(), DeviceRefusal::REASON_HOLDS_SHARD);
    }
    EXPECT_EQ(refusal->devices(3).device_index(), 3u);
    EXPECT_EQ(refusal->devices(3).reason(), DeviceRefusal::REASON_CAPACITY);
    EXPECT_EQ(Canonical(StatsOf(*broker_, Root())), before);
  }
}

TEST_F(MemoryBrokerTest, RefusalCarriesThePlacementRefusal) {
  ASSERT_TRUE(Alloc(Self(), kDevice, {"3"}).ok());
  ASSERT_TRUE(Alloc(Self(), kDevice - kMiB, {"2"}).ok());
  AllocateRequest r = Request(2 * kMiB, {"3", "2", "1"});
  r.mutable_placement()->add_exclude("1");
  absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(Self(), r);
  ASSERT_EQ(res.status().code(), absl::StatusCode::kResourceExhausted) << res.status();
  EXPECT_THAT(std::string(res.status().message()), HasSubstr("capacity"));
  std::optional<PlacementRefusal> refusal = RefusalFromStatus(res.status());
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->size_bytes(), 2 * kMiB);
  EXPECT_EQ(refusal->shard_count(), 0u);
  ASSERT_EQ(refusal->devices_size(), 3);
  EXPECT_EQ(refusal->devices(0).device_index(), 1u);
  EXPECT_EQ(refusal->devices(0).reason(), DeviceRefusal::REASON_EXCLUDED);
  EXPECT_EQ(refusal->devices(1).device_index(), 2u);
  EXPECT_EQ(refusal->devices(1).reason(), DeviceRefusal::REASON_CAPACITY);
  EXPECT_EQ(refusal->devices(1).free_bytes(), kMiB);
  EXPECT_EQ(refusal->devices(2).device_index(), 3u);
  EXPECT_EQ(refusal->devices(2).reason(), DeviceRefusal::REASON_CAPACITY);
  EXPECT_EQ(refusal->devices(2).free_bytes(), 0u);
  EXPECT_EQ(refusal->devices(2).device_uuid(), backend_.devices()[3].uuid);
  // Devices 0 (outside the named set) is not listed.
  for (const auto& d : refusal->devices()) EXPECT_NE(d.device_index(), 0u);
}

TEST_F(MemoryBrokerTest, FragmentationRefusalThroughTheBroker) {
  // Device 0: 16 slabs each with one live 8 MiB block and 8 MiB free.
  std::vector<uint64_t> drop;
  for (int i = 0; i < 32; ++i) {
    absl::StatusOr<AllocateResponse> r = Alloc(Self(), 8 * kMiB, {"0"});
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    if (i % 2) drop.push_back(r->allocations(0).id());
  }
  for (uint64_t id : drop) ASSERT_TRUE(broker_->Free(Self(), FreeOf(id)).ok());
  GetStatsResponse s = StatsOf(*broker_, Root());
  // Every byte of device 0 is in this tenant's slabs: nothing is free for
  // another tenant, and this one can carve 8 MiB at most.
  EXPECT_EQ(s.devices(0).free_bytes(), 0u);
  EXPECT_EQ(s.devices(0).largest_free_block_bytes(), 8 * kMiB);
  EXPECT_DOUBLE_EQ(s.devices(0).fragmentation(), 1.0 - 8.0 / 128.0);
  absl::StatusOr<AllocateResponse> r = Alloc(Self(), 9 * kMiB, {"0"});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  std::optional<PlacementRefusal> refusal = RefusalFromStatus(r.status());
  ASSERT_TRUE(refusal.has_value());
  ASSERT_EQ(refusal->devices_size(), 1);
  EXPECT_EQ(refusal->devices(0).reason(), DeviceRefusal::REASON_FRAGMENTATION);
  EXPECT_EQ(refusal->devices(0).largest_free_bytes(), 8 * kMiB);
  // With a fallback to any device it is served elsewhere.
  AllocateRequest fb = Request(9 * kMiB, {"0"});
  fb.mutable_placement()->add_fallback();
  absl::StatusOr<AllocateResponse> ok = broker_->AllocateAndWait(Self(), fb);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_NE(ok->allocations(0).device_index(), 0u);
}

// Calls from a process that exited while its session was live: the session
// registry ends the stale session inside Attach (on the calling thread), and
// the broker must cope with that while it serves the call: every call
// answers, and the process's memory and session are gone soon after.
TEST_F(MemoryBrokerTest, CallsFromAnExitedProcessEndItsSessionCleanly) {
  const PeerCred gone = child_a_.Cred();
  ASSERT_TRUE(Alloc(gone, kMiB).ok());
  child_a_.Kill();  // a zombie until reaped: its pid is not reused meanwhile
  siginfo_t info;
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child_a_.pid()), &info, WEXITED | WNOWAIT), 0);
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<AllocateResponse> r = Alloc(gone, kMiB);
    EXPECT_TRUE(r.ok() || absl::IsFailedPrecondition(r.status())) << r.status();
    absl::StatusOr<v1::Session> s = broker_->GetSession(gone);
    EXPECT_TRUE(s.ok() || absl::IsFailedPrecondition(s.status())) << s.status();
  }
  EXPECT_LE(WaitFor([&] {
              GetStatsResponse s = StatsOf(*broker_, Root());
              return TotalUsed(s) == 0 && SessionOf(s, child_a_.pid()) == nullptr;
            }),
            absl::Seconds(1));
  child_a_.Reap();
}

// ---------------------------------------------------------------------------
// Concurrency (the TSan target)

TEST_F(MemoryBrokerTest, ConcurrentAllocateFreeEndsWithNothingUsed) {
  // Idle slabs are released by the maintenance thread while we run.
  broker_.reset();
  StartBroker(/*release_after=*/absl::ZeroDuration(),
              /*maintenance=*/absl::Milliseconds(2));
  constexpr int kThreads = 4;
  constexpr int kOps = 1500;
  std::atomic<int> bad{0};
  std::atomic<int> allocated{0};
  auto worker = [&](int t) {
    // Thread 3 is child B, killed halfway through; the others are us.
    const PeerCred cred = t == 3 ? child_b_.Cred() : Self();
    std::mt19937_64 rng(1000 + t);
    std::vector<v1::Allocation> live;
    std::vector<uint64_t> held;  // slabs whose handle we kept
    for (int op = 0; op < kOps; ++op) {
      const int dice = rng() % 100;
      if (dice < 55 || live.empty()) {
        AllocateRequest r;
        const int kind = rng() % 20;
        r.set_size_bytes(kind < 14 ? 1 + rng() % (256 * 1024)
                         : kind < 19 ? 1 + rng() % (4 * kMiB)
                                     : kSlab + 1 + rng() % (24 * kMiB));
        if (rng() % 8 == 0) {
          r.set_size_bytes(r.size_bytes() + 2);
          r.set_shard_count(2);
        } else if (rng() % 4 == 0) {
          r.mutable_placement()->add_devices(std::to_string(rng() % 4));
        }
        absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(cred, r);
        if (res.ok()) {
          allocated.fetch_add(1);
          for (const auto& a : res->allocations()) live.push_back(a);
        } else if (!absl::IsResourceExhausted(res.status()) &&
                   !(t == 3 && absl::IsFailedPrecondition(res.status()))) {
          ADD_FAILURE() << "thread " << t << ": " << res.status();
          bad.fetch_add(1);
        }
      } else if (dice < 95) {
        const size_t k = rng() % live.size();
        absl::StatusOr<v1::FreeResponse> f = broker_->Free(cred, FreeOf(live[k].id()));
        if (!f.ok() && !(t == 3 && absl::IsNotFound(f.status()))) {
          ADD_FAILURE() << "thread " << t << ": " << f.status();
          bad.fetch_add(1);
        }
        live[k] = live.back();
        live.pop_back();
      } else if (dice < 98) {
        // Thread 3 fetches handles only while child B lives: a handle given
        // to a process as it dies is not what this test is about.
        if (t == 3 && op > kOps / 2) continue;
        const uint64_t slab = live[rng() % live.size()].slab_id();
        absl::StatusOr<SlabFd> fd = broker_->ExportSlab(cred, slab);
        if (fd.ok()) {
          close(fd->fd);
          // Mostly closed at once; otherwise held until the end.
          if (rng() % 4 != 0) {
            // Threads 0..2 are one process, one session: another of them
            // may have closed the slab for it already.
            absl::Status c = broker_->CloseSlab(cred, slab);
            if (!c.ok() && !(t != 3 && absl::IsNotFound(c))) {
              ADD_FAILURE() << "thread " << t << ": " << c;
              bad.fetch_add(1);
            }
          } else {
            held.push_back(slab);
          }
        } else if (t != 3) {
          ADD_FAILURE() << "thread " << t << ": " << fd.status();
          bad.fetch_add(1);
        }
      } else {
        GetStatsResponse s = StatsOf(*broker_, t % 2 == 0 ? Root() : Nobody(), rng() % 2 == 0);
        for (const auto& d : s.devices()) {
          if (d.used_bytes() > d.total_bytes() || d.pooled_bytes() > d.total_bytes() ||
              d.used_bytes() + d.retained_bytes() > d.total_bytes() ||
              d.free_bytes() + d.used_bytes() + d.retained_bytes() > d.total_bytes()) {
            ADD_FAILURE() << "thread " << t << ": " << d.ShortDebugString();
            bad.fetch_add(1);
          }
        }
      }
      if (t == 3 && op == kOps / 2) child_b_.Kill();
    }
    if (t != 3) {
      for (const auto& a : live) {
        absl::Status s = broker_->Free(cred, FreeOf(a.id())).status();
        if (!s.ok()) {
          ADD_FAILURE() << s;
          bad.fetch_add(1);
        }
      }
      // Threads 0..2 share one process (one session): the first CloseSlab
      // of a slab lets it go, later ones find nothing to close.
      for (uint64_t slab : held) {
        absl::Status s = broker_->CloseSlab(cred, slab);
        if (!s.ok() && !absl::IsNotFound(s)) {
          ADD_FAILURE() << "thread " << t << ": " << s;
          bad.fetch_add(1);
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(allocated.load(), 1000);
  EXPECT_LE(WaitFor([&] {
              GetStatsResponse s = StatsOf(*broker_, Root());
              return TotalUsed(s) == 0 && SessionOf(s, child_b_.pid()) == nullptr;
            }),
            absl::Seconds(1));
  GetStatsResponse s = StatsOf(*broker_, Root());
  EXPECT_EQ(TotalUsed(s), 0u);
  EXPECT_EQ(TotalAllocations(s), 0u);
  for (const auto& ss : s.sessions()) {
    EXPECT_EQ(ss.allocation_count(), 0u);
    EXPECT_EQ(ss.used_bytes(), 0u);
    EXPECT_EQ(ss.retained_bytes(), 0u);
  }
  // Idle slabs go back to the devices (release_after is 0), retained ones
  // too: every handle was closed or its process ended.
  EXPECT_LE(WaitFor([&] {
              for (int d = 0; d < kDevices; ++d) {
                if (backend_.SlabBytes(d) != 0) return false;
              }
              return true;
            }),
            absl::Seconds(1));
}

// A client's usage report (UsageReport) is kept per session and shown in
// SessionStats, never above what the session holds; a report that
// contradicts itself is refused before anything is allocated or freed.
TEST_F(MemoryBrokerTest, UsageReportsAreShownPerSessionAndChecked) {
  auto session_of = [&](const GetStatsResponse& s) -> const v1::SessionStats* {
    for (const v1::SessionStats& ss : s.sessions()) {
      if (ss.pid() == getpid()) return &ss;
    }
    return nullptr;
  };
  AllocateRequest lease = Request(8 * kMiB);
  lease.mutable_usage()->set_leased_bytes(8 * kMiB);
  lease.mutable_usage()->set_in_use_bytes(4096);
  absl::StatusOr<AllocateResponse> a = broker_->AllocateAndWait(Self(), lease);
  ASSERT_TRUE(a.ok()) << a.status();
  GetStatsResponse s = StatsOf(*broker_, Self());
  const v1::SessionStats* ss = session_of(s);
  ASSERT_NE(ss, nullptr);
  EXPECT_EQ(ss->used_bytes(), 8 * kMiB);
  EXPECT_EQ(ss->leased_bytes(), 8 * kMiB);
  EXPECT_EQ(ss->in_use_bytes(), 4096u);

  // in_use > leased: INVALID_ARGUMENT naming both, nothing allocated.
  AllocateRequest bad = Request(kMiB);
  bad.mutable_usage()->set_leased_bytes(10);
  bad.mutable_usage()->set_in_use_bytes(11);
  absl::StatusOr<AllocateResponse> refused = broker_->AllocateAndWait(Self(), bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("in_use_bytes 11"), std::string::npos);
  v1::FreeRequest bad_free;
  bad_free.set_id(a->allocations(0).id());
  *bad_free.mutable_usage() = bad.usage();
  EXPECT_EQ(broker_->Free(Self(), bad_free).status().code(),
            absl::StatusCode::kInvalidArgument);
  s = StatsOf(*broker_, Self());
  ss = session_of(s);
  ASSERT_NE(ss, nullptr);
  EXPECT_EQ(ss->used_bytes(), 8 * kMiB);  // the bad Free freed nothing
  EXPECT_EQ(ss->leased_bytes(), 8 * kMiB);

  // A report claiming more than the session holds is shown capped.
  AllocateRequest liar = Request(kMiB);
  liar.mutable_usage()->set_leased_bytes(1000 * kMiB);
  liar.mutable_usage()->set_in_use_bytes(999 * kMiB);
  ASSERT_TRUE(broker_->AllocateAndWait(Self(), liar).ok());
  s = StatsOf(*broker_, Self());
  ss = session_of(s);
  ASSERT_NE(ss, nullptr);
  EXPECT_EQ(ss->leased_bytes(), 9 * kMiB);
  EXPECT_EQ(ss->in_use_bytes(), 9 * kMiB);

  // A Free carrying a report updates it.
  v1::FreeRequest give_back;
  give_back.set_id(a->allocations(0).id());
  give_back.mutable_usage()->set_leased_bytes(0);
  give_back.mutable_usage()->set_in_use_bytes(0);
  ASSERT_TRUE(broker_->Free(Self(), give_back).ok());
  s = StatsOf(*broker_, Self());
  ss = session_of(s);
  ASSERT_NE(ss, nullptr);
  EXPECT_EQ(ss->used_bytes(), kMiB);
  EXPECT_EQ(ss->leased_bytes(), 0u);
  EXPECT_EQ(ss->in_use_bytes(), 0u);
}


// A capacity refusal asks each other session with idle leased bytes on the
// refused device, and nobody else: not the requester, not a session whose
// report shows no idle bytes, not one without a report, and nobody at all
// for a quota-free request that simply cannot fit anywhere else.
TEST_F(MemoryBrokerTest, CapacityRefusalAsksSessionsWithIdleLeases) {
  std::vector<std::pair<uint64_t, v1::ReclaimRequest>> asked;
  broker_->SetReclaimSender([&](uint64_t session, const v1::ReclaimRequest& r) {
    asked.emplace_back(session, r);
    return true;
  });
  auto session_of = [&](const PeerCred& c) {
    absl::StatusOr<v1::Session> s = broker_->GetSession(c);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->session_id() : 0;
  };
  // Self: idle leases on device 0. child A: a lease fully in use on device 0.
  AllocateRequest idle = Request(8 * kMiB, {"0"});
  idle.mutable_usage()->set_leased_bytes(8 * kMiB);
  idle.mutable_usage()->set_in_use_bytes(kMiB);
  ASSERT_TRUE(broker_->AllocateAndWait(Self(), idle).ok());
  AllocateRequest busy = Request(8 * kMiB, {"0"});
  busy.mutable_usage()->set_leased_bytes(8 * kMiB);
  busy.mutable_usage()->set_in_use_bytes(8 * kMiB);
  ASSERT_TRUE(broker_->AllocateAndWait(child_a_.Cred(), busy).ok());
  // A request that fits is nobody's business.
  ASSERT_TRUE(Alloc(child_b_.Cred(), kMiB, {"1"}).ok());
  EXPECT_TRUE(asked.empty());

  // child B asks device 0 for more than is left there: Self is asked.
  absl::StatusOr<AllocateResponse> refused =
      Alloc(child_b_.Cred(), kDevice - 8 * kMiB, {"0"});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].first, session_of(Self()));
  EXPECT_EQ(asked[0].second.bytes_wanted(), kDevice - 8 * kMiB);
  ASSERT_EQ(asked[0].second.devices_size(), 1);
  EXPECT_EQ(asked[0].second.devices(0), 0u);

  // Refused on device 1 only, where Self holds nothing: nobody is asked.
  asked.clear();
  refused = Alloc(child_b_.Cred(), kDevice, {"1"});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(asked.empty());

  // Self's own refusal does not ask Self.
  refused = Alloc(Self(), kDevice - 8 * kMiB, {"0"});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(asked.empty());
  broker_->SetReclaimSender(nullptr);
}

}  // namespace
}  // namespace gpumem
