// Tests of SlabPool (server/pool/slab_pool.h) over the memfd-backed SimBackend:
// tenants own slabs for life (an empty slab is never handed to another
// tenant), dedicated slabs, idle release and the reservation, capacity /
// fragmentation refusals with their figures, export tracking and retained
// slabs, statistics, concurrent callers, and a randomized sequence checked
// against a model after every step.
#include "server/pool/slab_pool.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "tests/backend/faulty_backend.h"

namespace gpumem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDevice = 256 * kMiB;
constexpr uint64_t kSlab = 16 * kMiB;
constexpr uint64_t kGran = 4096;

PoolOptions Options(absl::Duration release_after = absl::Seconds(10),
                    double reserve = 0.0) {
  PoolOptions o;
  o.slab_size = kSlab;
  // Every slab of these cases is kSlab (slab_footprint_test covers growth).
  o.min_slab_size = kSlab;
  o.granularity = kGran;
  o.empty_release_after = release_after;
  o.reserve_fraction = reserve;
  return o;
}

uint64_t RoundUp(uint64_t v, uint64_t g) { return (v + g - 1) / g * g; }

// Checks what every refusal promises: the reason agrees with the figures and
// the message, and the message names the device.
void CheckRefusal(const ::gpumem::Refusal& p, uint64_t size) {
  const bool capacity = p.reason == RefusalReason::kCapacity;
  EXPECT_EQ(capacity, p.free_bytes < size)
      << "free " << p.free_bytes << ", asked " << size << ": " << p.message;
  EXPECT_LE(p.largest_free_bytes, p.free_bytes) << p.message;
  EXPECT_THAT(p.message, HasSubstr(capacity ? "capacity" : "fragmentation"));
  EXPECT_THAT(p.message, Not(HasSubstr(capacity ? "fragmentation" : "capacity")));
  EXPECT_THAT(p.message, HasSubstr("device "));
}

// Carve in the old absl::StatusOr<PoolBlock> shape: a refusal becomes
// RESOURCE_EXHAUSTED with the refusal's message, an error stays itself.
absl::StatusOr<PoolBlock> Carve(SlabPool& pool, uint64_t size, uint64_t alignment,
                                uint32_t tenant) {
  CarveResult r = pool.Carve(size, alignment, tenant);
  switch (r.kind) {
    case CarveResult::Kind::kBlock:
      EXPECT_EQ(r.block.tenant, tenant);
      EXPECT_EQ(r.block.size, size);
      return r.block;
    case CarveResult::Kind::kRefused:
      CheckRefusal(r.refusal, size);
      return absl::ResourceExhaustedError(r.refusal.message);
    case CarveResult::Kind::kError:
      break;
    case CarveResult::Kind::kNeedsBackendWork:
      return absl::InternalError("kNeedsBackendWork from Carve, which may call the backend");
  }
  if (r.error.ok()) return absl::InternalError("CarveResult::kError with an OK status");
  return r.error;
}

// A refused Carve's refusal (fails the test for anything else).
std::optional<::gpumem::Refusal> Refusal(SlabPool& pool, uint64_t size, uint64_t alignment,
                                   uint32_t tenant) {
  CarveResult r = pool.Carve(size, alignment, tenant);
  EXPECT_EQ(r.kind, CarveResult::Kind::kRefused)
      << "size " << size << " tenant " << tenant << ": " << r.error;
  if (r.kind != CarveResult::Kind::kRefused) return std::nullopt;
  CheckRefusal(r.refusal, size);
  return r.refusal;
}

// A copy of one slab's figures, or nullopt.
std::optional<SlabStats> FindSlab(const std::vector<SlabStats>& slabs, uint64_t id) {
  for (const SlabStats& s : slabs) {
    if (s.slab_id == id) return s;
  }
  return std::nullopt;
}

std::optional<uint32_t> SlabTenant(const SlabPool& pool, uint64_t id) {
  std::optional<SlabStats> s = FindSlab(pool.Slabs(), id);
  if (!s.has_value()) return std::nullopt;
  return s->tenant;
}

// Exports a slab and closes the fd at once; the session stays a holder.
absl::Status ExportAndClose(SlabPool& pool, uint64_t slab_id, uint32_t tenant,
                            uint64_t session) {
  absl::StatusOr<SlabPool::Export> e = pool.ExportSlab(slab_id, tenant, session);
  if (!e.ok()) return e.status();
  close(e->fd);
  return absl::OkStatus();
}

// A shared mapping of a slab, through a fresh fd from ExportSlab (which
// records `session` as a holder). The fd is closed; the mapping stays until
// the Mapping is destroyed, whatever the pool does meanwhile.
class Mapping {
 public:
  Mapping(SlabPool& pool, uint64_t slab_id, uint32_t tenant, uint64_t session,
          uint64_t size)
      : size_(size) {
    absl::StatusOr<SlabPool::Export> e = pool.ExportSlab(slab_id, tenant, session);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return;
    EXPECT_EQ(e->size, size);
    struct stat st;
    EXPECT_EQ(fstat(e->fd, &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
    close(e->fd);
    EXPECT_NE(p, MAP_FAILED);
    if (p != MAP_FAILED) base_ = static_cast<unsigned char*>(p);
  }
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  unsigned char* data() const { return base_; }
  bool ok() const { return base_ != nullptr; }

 private:
  uint64_t size_;
  unsigned char* base_ = nullptr;
};

bool AllZero(const unsigned char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

uint64_t CountByte(const unsigned char* p, uint64_t n, unsigned char b) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) count += p[i] == b;
  return count;
}

#define EXPECT_VALID(pool)                                  \
  do {                                                      \
    absl::Status v_ = (pool).Validate();                    \
    EXPECT_TRUE(v_.ok()) << v_;                             \
  } while (0)

// ---------------------------------------------------------------------------
// Tenants: one tenant per slab, for the slab's whole life

TEST(SlabPoolTest, TenantsNeverShareASlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, /*tenant=*/1);
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, /*tenant=*/2);
  absl::StatusOr<PoolBlock> a2 = Carve(pool, kMiB, kGran, /*tenant=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_NE(a->slab_id, b->slab_id);
  // Tenant 1's second block shares tenant 1's slab (it has room).
  EXPECT_EQ(a2->slab_id, a->slab_id);
  EXPECT_EQ(SlabTenant(pool, a->slab_id), 1u);
  EXPECT_EQ(SlabTenant(pool, b->slab_id), 2u);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  absl::flat_hash_map<uint32_t, TenantPoolStats> t = pool.TenantStats();
  EXPECT_EQ(t[1].used_bytes, 2 * kMiB);
  EXPECT_EQ(t[1].live_blocks, 2u);
  EXPECT_EQ(t[1].slab_count, 1u);
  EXPECT_EQ(t[2].used_bytes, kMiB);
  EXPECT_EQ(t[2].slab_count, 1u);
  EXPECT_VALID(pool);
}

// A tenant gone for good (a socket tenant deleted): its empty slabs go back
// at once, a slab still holding a block as soon as it is empty; other
// tenants' slabs stay.
TEST(SlabPoolTest, GoneTenantsSlabsGoBackAsSoonAsEmpty) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, /*tenant=*/1);
  absl::StatusOr<PoolBlock> big = Carve(pool, kSlab, kGran, /*tenant=*/1);  // a second slab
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, /*tenant=*/2);
  ASSERT_TRUE(a.ok() && big.ok() && b.ok());
  ASSERT_NE(a->slab_id, big->slab_id);
  pool.Release(*a);  // tenant 1's first slab is empty now, its second is not
  EXPECT_EQ(pool.ReleaseTenantSlabs(1), 1);
  EXPECT_FALSE(pool.HasSlab(a->slab_id));
  EXPECT_TRUE(pool.HasSlab(big->slab_id));
  pool.Release(*big);  // the block being freed while the tenant went
  EXPECT_FALSE(pool.HasSlab(big->slab_id));
  EXPECT_EQ(pool.TenantStats().count(1), 0u);
  EXPECT_TRUE(pool.HasSlab(b->slab_id));
  pool.Release(*b);
  EXPECT_TRUE(pool.HasSlab(b->slab_id)) << "another tenant's empty slab waits as usual";
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, ManyTenantsEachBlockInOwnSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Milliseconds(1)));
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint32_t, PoolBlock>> live;
  std::map<uint64_t, uint32_t> first_tenant;  // slab -> tenant when first seen
  for (int i = 0; i < 300; ++i) {
    const uint32_t tenant = 1 + rng() % 5;
    const uint64_t size = 1 + rng() % (2 * kMiB);
    absl::StatusOr<PoolBlock> b = Carve(pool, size, 256, tenant);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    } else {
      live.emplace_back(tenant, *b);
    }
    if (!live.empty() && rng() % 3 == 0) {
      size_t k = rng() % live.size();
      pool.Release(live[k].second);
      live.erase(live.begin() + k);
    }
    if (i % 50 == 49) pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(1));
    std::map<uint64_t, std::set<uint32_t>> owners;
    for (const auto& [t, blk] : live) {
      owners[blk.slab_id].insert(t);
      EXPECT_EQ(SlabTenant(pool, blk.slab_id), t);
    }
    for (const auto& [slab, tenants] : owners) {
      EXPECT_EQ(tenants.size(), 1u) << "slab " << slab << " shared by tenants";
    }
    // A slab, empty or not, never changes tenant.
    for (const SlabStats& s : pool.Slabs()) {
      auto [it, inserted] = first_tenant.emplace(s.slab_id, s.tenant);
      EXPECT_EQ(it->second, s.tenant) << "slab " << s.slab_id << " changed tenant";
    }
    ASSERT_TRUE(pool.Validate().ok()) << pool.Validate();
  }
}

// Replaces the old "empty slab is scrubbed and handed over" rule: an empty
// slab stays its tenant's; another tenant gets a slab of its own.
TEST(SlabPoolTest, EmptySlabOfAnotherTenantIsNeverReused) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, /*tenant=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t slab_a = a->slab_id;
  pool.Release(*a);
  ASSERT_EQ(pool.Stats().slab_count, 1u);  // tenant 1's slab, empty

  absl::StatusOr<PoolBlock> b = Carve(pool, 2 * kMiB, kGran, /*tenant=*/2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slab_id, slab_a) << "tenant 2 was given tenant 1's empty slab";
  EXPECT_TRUE(b->new_slab);
  EXPECT_EQ(SlabTenant(pool, slab_a), 1u);
  EXPECT_EQ(SlabTenant(pool, b->slab_id), 2u);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  EXPECT_EQ(backend.SlabBytes(0), 2 * kSlab);

  // Tenant 2 cannot export tenant 1's (empty) slab either.
  EXPECT_EQ(pool.ExportSlab(slab_a, 2, /*session=*/20).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Tenant 1 gets its own empty slab back; tenant 3 a third slab.
  absl::StatusOr<PoolBlock> a2 = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_EQ(a2->slab_id, slab_a);
  EXPECT_FALSE(a2->new_slab);
  pool.Release(*a2);
  pool.Release(*b);
  absl::StatusOr<PoolBlock> c = Carve(pool, kMiB, kGran, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->slab_id, slab_a);
  EXPECT_NE(c->slab_id, b->slab_id);
  EXPECT_EQ(SlabTenant(pool, slab_a), 1u);
  EXPECT_EQ(SlabTenant(pool, b->slab_id), 2u);
  EXPECT_VALID(pool);
}

// When the device is full and the capacity sits in another tenant's empty
// (unheld) slabs, those are released and a new slab is made: the new
// tenant's block is never in one of them.
TEST(SlabPoolTest, FullDeviceReleasesAnotherTenantsEmptySlabsForANewSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  std::vector<PoolBlock> blocks;
  std::set<uint64_t> slabs_of_1;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<PoolBlock> b = Carve(pool, kSlab, 1, /*tenant=*/1);
    ASSERT_TRUE(b.ok()) << b.status();
    blocks.push_back(*b);
    slabs_of_1.insert(b->slab_id);
  }
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  for (size_t i = 1; i < blocks.size(); ++i) pool.Release(blocks[i]);
  ASSERT_EQ(pool.Stats().slab_count, 16u);  // 15 of them empty

  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, /*tenant=*/2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(slabs_of_1.count(b->slab_id), 0u) << "tenant 2 got a slab of tenant 1";
  EXPECT_TRUE(b->new_slab);
  EXPECT_EQ(b->slab_size, kSlab);
  EXPECT_LE(backend.SlabBytes(0), kDevice);
  int of_2 = 0;
  for (const SlabStats& s : pool.Slabs()) {
    if (slabs_of_1.count(s.slab_id) != 0) {
      EXPECT_EQ(s.tenant, 1u) << "slab " << s.slab_id;
    } else {
      EXPECT_EQ(s.slab_id, b->slab_id);
      EXPECT_EQ(s.tenant, 2u);
      ++of_2;
    }
  }
  EXPECT_EQ(of_2, 1);
  // Tenant 1's slab with a live block is kept.
  EXPECT_TRUE(pool.HasSlab(blocks[0].slab_id));
  EXPECT_EQ(SlabTenant(pool, blocks[0].slab_id), 1u);
  EXPECT_VALID(pool);
}

// The device has less room than total_bytes says (memory of other
// processes): new slabs are planned within it, the free figure shows it, a
// carve that needs more is refused with figures (after asking the backend
// again: others may have freed memory), and TryCarve (which never calls
// the backend, not even to ask it again) answers kNeedsBackendWork rather
// than refusing on an old figure.
TEST(SlabPoolTest, NewSlabsFitTheRoomTheDeviceHas) {
  testing::FaultyBackend backend(std::make_unique<SimBackend>(std::vector<uint64_t>{4 * kSlab}));
  backend.SetDeviceFree(kSlab + kSlab / 2);
  backend.RefreshNewSlabRoom(0);
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  const HandleKind kind = backend.handle_kinds().front();
  absl::StatusOr<PoolBlock> a = Carve(pool, kSlab, kGran, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(pool.Stats().free_bytes, kSlab / 2);  // not 4 slabs - 1
  const int refreshes = backend.refreshes();
  EXPECT_EQ(pool.TryCarve(kSlab, kGran, 1, kind).kind, CarveResult::Kind::kNeedsBackendWork);
  EXPECT_EQ(backend.refreshes(), refreshes);
  CarveResult r = pool.Carve(kSlab, kGran, 1, kind);
  ASSERT_EQ(r.kind, CarveResult::Kind::kRefused);
  EXPECT_EQ(r.refusal.reason, RefusalReason::kCapacity);
  EXPECT_EQ(r.refusal.free_bytes, kSlab / 2);
  CheckRefusal(r.refusal, kSlab);
  EXPECT_GT(backend.refreshes(), refreshes);
  // A smaller block still gets a slab cut to the room that is left.
  absl::StatusOr<PoolBlock> b = Carve(pool, kSlab / 4, kGran, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(pool.Slabs().back().size, kSlab / 2);
  // Others give memory back: learnt when it is needed.
  backend.SetDeviceFree(2 * kSlab);
  absl::StatusOr<PoolBlock> c = Carve(pool, kSlab, kGran, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  pool.Release(*a);
  pool.Release(*b);
  pool.Release(*c);
  EXPECT_TRUE(pool.Validate().ok());
}

// Without backend work a carve serves from existing slabs only: where it
// would create a slab, or release empty slabs to make room, it says so and
// leaves the pool (and the backend) exactly as they were; refusals and
// blocks are the answers it gives with backend work allowed.
TEST(SlabPoolTest, CarveWithoutBackendWorkUsesExistingSlabsOnly) {
  SimBackend backend({4 * kSlab});
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  const HandleKind kind = backend.handle_kinds().front();
  // Nothing pooled: a slab would have to be made.
  CarveResult r = pool.TryCarve(kMiB, kGran, 1, kind);
  EXPECT_EQ(r.kind, CarveResult::Kind::kNeedsBackendWork);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  // One slab made with backend work; the next block fits in it inline.
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  r = pool.TryCarve(kMiB, kGran, 1, kind);
  ASSERT_EQ(r.kind, CarveResult::Kind::kBlock);
  const PoolBlock inline_block = r.block;
  EXPECT_EQ(inline_block.slab_id, a->slab_id);
  EXPECT_FALSE(inline_block.new_slab);
  // Another tenant, or a block larger than the slab (dedicated): new slab.
  EXPECT_EQ(pool.TryCarve(kMiB, kGran, 2, kind).kind, CarveResult::Kind::kNeedsBackendWork);
  EXPECT_EQ(pool.TryCarve(kSlab + kMiB, kGran, 1, kind).kind,
            CarveResult::Kind::kNeedsBackendWork);
  // More than the device: the same refusal either way, no backend needed.
  r = pool.TryCarve(4 * kSlab, kGran, 1, kind);
  ASSERT_EQ(r.kind, CarveResult::Kind::kRefused);
  CheckRefusal(r.refusal, 4 * kSlab);
  // Fill the device with tenant 2's slabs, then empty them: room for tenant
  // 3 now means releasing them, which is backend work.
  std::vector<PoolBlock> twos;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<PoolBlock> b = Carve(pool, kSlab, kGran, 2);
    ASSERT_TRUE(b.ok()) << b.status();
    twos.push_back(*b);
  }
  for (const PoolBlock& b : twos) pool.Release(b);
  const uint64_t slabs = pool.Stats().slab_count;
  const uint64_t bytes = backend.SlabBytes(0);
  EXPECT_EQ(pool.TryCarve(kMiB, kGran, 3, kind).kind, CarveResult::Kind::kNeedsBackendWork);
  EXPECT_EQ(pool.Stats().slab_count, slabs);
  EXPECT_EQ(backend.SlabBytes(0), bytes);
  absl::StatusOr<PoolBlock> c = Carve(pool, kMiB, kGran, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->new_slab);
  pool.Release(*a);
  pool.Release(inline_block);
  pool.Release(*c);
  EXPECT_VALID(pool);
}

// Replaces "scrub is seen by a mapping made before the handover": tenant 1
// keeps a mapping of its slab (it said it closed the slab, but a process may
// keep an fd or a mapping as long as it likes). Tenant 2's memory comes from
// a different slab, so nothing tenant 2 writes ever appears in that mapping,
// and tenant 2 never sees tenant 1's bytes.
TEST(SlabPoolTest, MappingKeptByTheOldTenantNeverShowsTheNextTenantsBytes) {
  SimBackend backend({kSlab});  // a device of exactly one slab
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  absl::StatusOr<PoolBlock> a = Carve(pool, kSlab, kGran, /*tenant=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t slab_a = a->slab_id;
  Mapping old_map(pool, slab_a, 1, /*session=*/10, kSlab);
  ASSERT_TRUE(old_map.ok());
  memset(old_map.data(), 0xAB, kSlab);  // tenant 1's secret, the whole slab
  ASSERT_TRUE(pool.CloseExport(slab_a, 10).ok());
  pool.Release(*a);
  EXPECT_VALID(pool);

  // The device is full: tenant 1's empty, unheld slab goes back to the
  // device and tenant 2 gets a new one.
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, /*tenant=*/2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slab_id, slab_a);
  EXPECT_TRUE(b->new_slab);
  EXPECT_FALSE(pool.HasSlab(slab_a));
  EXPECT_EQ(backend.SlabBytes(0), kSlab);
  EXPECT_EQ(pool.ExportSlab(slab_a, 1, 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.ExportSlab(b->slab_id, 1, 10).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_VALID(pool);

  Mapping new_map(pool, b->slab_id, 2, /*session=*/20, kSlab);
  ASSERT_TRUE(new_map.ok());
  EXPECT_TRUE(AllZero(new_map.data(), kSlab)) << "tenant 2 sees tenant 1's bytes";
  memset(new_map.data(), 0xCD, kSlab);  // tenant 2's secret
  EXPECT_EQ(CountByte(old_map.data(), kSlab, 0xCD), 0u)
      << "tenant 1's old mapping shows tenant 2's bytes";
  EXPECT_EQ(CountByte(old_map.data(), kSlab, 0xAB), kSlab);
  ASSERT_TRUE(pool.CloseExport(b->slab_id, 20).ok());
  EXPECT_VALID(pool);
}

// Tenant 1 still holds its empty slab's handle when the device fills up:
// the slab cannot go back to the device, and it is never given to tenant 2.
TEST(SlabPoolTest, HeldEmptySlabIsNeverHandedToAnotherTenant) {
  SimBackend backend({kSlab});
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  absl::StatusOr<PoolBlock> a = Carve(pool, kSlab, kGran, /*tenant=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t slab_a = a->slab_id;
  Mapping old_map(pool, slab_a, 1, /*session=*/10, kSlab);
  ASSERT_TRUE(old_map.ok());
  memset(old_map.data(), 0xAB, kSlab);
  pool.Release(*a);

  std::optional<::gpumem::Refusal> r = Refusal(pool, kMiB, kGran, /*tenant=*/2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RefusalReason::kCapacity);
  EXPECT_EQ(r->free_bytes, 0u);
  EXPECT_EQ(r->largest_free_bytes, 0u);
  EXPECT_TRUE(pool.HasSlab(slab_a));
  EXPECT_EQ(backend.SlabBytes(0), kSlab);
  for (const SlabStats& s : pool.Slabs()) EXPECT_EQ(s.tenant, 1u);
  EXPECT_EQ(pool.TenantStats().count(2), 0u);
  EXPECT_VALID(pool);

  // Once tenant 1's session lets go, tenant 2 gets a new slab.
  ASSERT_TRUE(pool.CloseExport(slab_a, 10).ok());
  EXPECT_VALID(pool);
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slab_id, slab_a);
  EXPECT_FALSE(pool.HasSlab(slab_a));
  EXPECT_EQ(SlabTenant(pool, b->slab_id), 2u);
  Mapping new_map(pool, b->slab_id, 2, 20, kSlab);
  ASSERT_TRUE(new_map.ok());
  EXPECT_TRUE(AllZero(new_map.data(), kSlab));
  memset(new_map.data(), 0xCD, kSlab);
  EXPECT_EQ(CountByte(old_map.data(), kSlab, 0xCD), 0u);
  ASSERT_TRUE(pool.CloseExport(b->slab_id, 20).ok());
  EXPECT_VALID(pool);
}

// Reserved slabs belong to nobody until the first tenant carves from one;
// then it is that tenant's for good.
TEST(SlabPoolTest, ReservedSlabIsClaimedForGoodByItsFirstTenant) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Seconds(1), /*reserve=*/0.25));
  ASSERT_TRUE(pool.Reserve().ok());
  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 4u);
  for (const SlabStats& s : slabs) EXPECT_EQ(s.tenant, kNoTenant);
  EXPECT_TRUE(pool.TenantStats().empty());
  // Nobody may export an unclaimed reserved slab.
  EXPECT_EQ(pool.ExportSlab(slabs[0].slab_id, 7, 70).status().code(),
            absl::StatusCode::kPermissionDenied);

  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, 256, /*tenant=*/7);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->new_slab);
  EXPECT_EQ(SlabTenant(pool, a->slab_id), 7u);
  pool.Release(*a);
  EXPECT_EQ(SlabTenant(pool, a->slab_id), 7u);  // still 7's, empty

  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, 256, /*tenant=*/8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slab_id, a->slab_id);
  EXPECT_FALSE(b->new_slab);  // another reserved slab
  EXPECT_EQ(SlabTenant(pool, b->slab_id), 8u);
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);

  absl::StatusOr<PoolBlock> a2 = Carve(pool, kMiB, 256, 7);
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_EQ(a2->slab_id, a->slab_id);
  absl::flat_hash_map<uint32_t, TenantPoolStats> t = pool.TenantStats();
  EXPECT_EQ(t[7].slab_count, 1u);
  EXPECT_EQ(t[8].slab_count, 1u);
  int unclaimed = 0;
  for (const SlabStats& s : pool.Slabs()) {
    EXPECT_TRUE(s.reserved);
    unclaimed += s.tenant == kNoTenant;
  }
  EXPECT_EQ(unclaimed, 2);
  EXPECT_VALID(pool);
}

// ---------------------------------------------------------------------------
// Dedicated slabs

TEST(SlabPoolTest, LargeBlockGetsDedicatedSlabOfRoundedSize) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  const uint64_t size = 20 * kMiB + 1;
  absl::StatusOr<PoolBlock> b = Carve(pool, size, 256, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->slab_size, RoundUp(size, kGran));
  EXPECT_EQ(b->offset, 0u);
  EXPECT_EQ(b->size, size);
  EXPECT_EQ(backend.SlabBytes(0), RoundUp(size, kGran));
  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 1u);
  EXPECT_TRUE(slabs[0].dedicated);
  EXPECT_EQ(slabs[0].size, RoundUp(size, kGran));

  // The dedicated slab's slack is never used for another block.
  absl::StatusOr<PoolBlock> small = Carve(pool, 100, 1, 1);
  ASSERT_TRUE(small.ok());
  EXPECT_NE(small->slab_id, b->slab_id);

  pool.Release(*b);
  EXPECT_EQ(pool.ExportSlab(b->slab_id, 1, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(pool.HasSlab(b->slab_id));
  EXPECT_EQ(backend.SlabBytes(0), kSlab);  // only the small block's slab left
  EXPECT_EQ(pool.Stats().slab_count, 1u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ExactSlabSizeIsNotDedicated) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> b = Carve(pool, kSlab, 256, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->slab_size, kSlab);
  ASSERT_EQ(pool.Slabs().size(), 1u);
  EXPECT_FALSE(pool.Slabs()[0].dedicated);
  pool.Release(*b);
  EXPECT_EQ(pool.Stats().slab_count, 1u);  // standard slab stays, empty
}

// A slab's offset 0 is aligned to any power of two, so a large alignment
// must not make a dedicated slab larger than the rounded size.
TEST(SlabPoolTest, DedicatedSlabIsExactlyRoundedSizeEvenWithLargeAlignment) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> b = Carve(pool, 20 * kMiB, 64 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->offset % (64 * kMiB), 0u);
  EXPECT_EQ(b->slab_size, 20 * kMiB);
  EXPECT_EQ(backend.SlabBytes(0), 20 * kMiB);
}

// Same for a standard slab: on an empty device a fresh slab serves any
// alignment at offset 0.
TEST(SlabPoolTest, AlignmentLargerThanSlabServedByAFreshSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, 32 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->offset % (32 * kMiB), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// size + alignment - 1 wraps around 2^64; the refusal must leave no slab.
TEST(SlabPoolTest, OverflowingSizePlusAlignmentIsRefusedCleanly) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  const uint64_t align = uint64_t{1} << 63;
  for (uint64_t size : {align + 4096, align + 1, align, UINT64_MAX}) {
    absl::StatusOr<PoolBlock> b = Carve(pool, size, align, 1);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted)
        << size << ": " << b.status();
    EXPECT_THAT(b.status().message(), HasSubstr("capacity"));
    EXPECT_TRUE(pool.Validate().ok()) << "size " << size << ": " << pool.Validate();
    EXPECT_EQ(pool.Stats().slab_count, 0u) << "size " << size;
    EXPECT_EQ(backend.SlabBytes(0), 0u) << "size " << size;
  }
}

// ---------------------------------------------------------------------------
// Idle release and reservation

TEST(SlabPoolTest, ReleaseIdleSlabsHonoursEmptyReleaseAfter) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> full = Carve(pool, kSlab, 1, 1);  // fills slab A
  absl::StatusOr<PoolBlock> other = Carve(pool, kMiB, 1, 1);  // slab B
  ASSERT_TRUE(full.ok() && other.ok());
  ASSERT_NE(full->slab_id, other->slab_id);

  const absl::Time before_release = absl::Now();
  pool.Release(*full);
  // Not empty for `after` yet.
  EXPECT_EQ(pool.ReleaseIdleSlabs(before_release), 0);
  EXPECT_EQ(pool.ReleaseIdleSlabs(before_release + after - absl::Milliseconds(1)), 0);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  // Empty for at least `after`: released; slab B (live block) is kept.
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_EQ(pool.Stats().slab_count, 1u);
  EXPECT_EQ(pool.ExportSlab(full->slab_id, 1, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(pool.HasSlab(full->slab_id));
  EXPECT_TRUE(ExportAndClose(pool, other->slab_id, 1, 1).ok());
  ASSERT_TRUE(pool.CloseExport(other->slab_id, 1).ok());
  EXPECT_EQ(backend.SlabBytes(0), kSlab);
  // Far in the future a slab with a live block is still kept.
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(1000)), 0);

  pool.Release(*other);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after - absl::Seconds(1)), 0);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ReuseResetsTheEmptyClock) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, 1, 1);
  ASSERT_TRUE(a.ok());
  pool.Release(*a);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, 1, 1);  // same slab, in use
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->slab_id, a->slab_id);
  EXPECT_EQ(pool.ReleaseIdleSlabs(t0 + absl::Hours(1)), 0);
  pool.Release(*b);
  const absl::Time t1 = absl::Now();
  EXPECT_EQ(pool.ReleaseIdleSlabs(t1 + after - absl::Milliseconds(100)), 0);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
}

TEST(SlabPoolTest, ReserveTakesTheFractionAndIsNeverReleasedWhenIdle) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Seconds(1), /*reserve=*/0.25));
  ASSERT_TRUE(pool.Reserve().ok());
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);
  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 4u);
  for (const SlabStats& s : slabs) {
    EXPECT_TRUE(s.reserved);
    EXPECT_FALSE(s.dedicated);
    EXPECT_EQ(s.size, kSlab);
    EXPECT_EQ(s.live_blocks, 0u);
  }
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.pooled_bytes, kDevice / 4);
  EXPECT_EQ(st.retained_bytes, 0u);
  // Empty reserved slabs can be released for a new slab: all is carvable.
  EXPECT_EQ(st.largest_carvable, kDevice);
  EXPECT_EQ(st.used_bytes, 0u);

  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(24)), 0);
  EXPECT_EQ(pool.Stats().slab_count, 4u);

  // A block comes from the reservation (no new slab), and after it is freed
  // the slab is still reserved and still kept.
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, 256, 7);
  ASSERT_TRUE(b.ok()) << b.status();
  std::optional<SlabStats> s = FindSlab(pool.Slabs(), b->slab_id);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->reserved);
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);
  pool.Release(*b);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(24)), 0);
  EXPECT_EQ(backend.SlabBytes(0), kDevice / 4);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, ReserveRoundsToWholeSlabsAndCapsAtTheDevice) {
  {
    SimBackend backend({kDevice});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 0.1));
    ASSERT_TRUE(pool.Reserve().ok());
    const uint64_t target = static_cast<uint64_t>(0.1 * kDevice);
    EXPECT_GE(backend.SlabBytes(0), target);
    EXPECT_LT(backend.SlabBytes(0), target + kSlab);
  }
  {
    SimBackend backend({kDevice});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 1.0));
    ASSERT_TRUE(pool.Reserve().ok());
    EXPECT_EQ(backend.SlabBytes(0), kDevice);
    EXPECT_EQ(pool.Stats().slab_count, kDevice / kSlab);
  }
  {
    // Fraction > 1 and an uneven device: the device, in granularity units.
    const uint64_t dev = 40 * kMiB + 3 * kGran + 17;
    SimBackend backend({dev});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 5.0));
    ASSERT_TRUE(pool.Reserve().ok());
    EXPECT_EQ(backend.SlabBytes(0), dev - dev % kGran);
    EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
  }
  {
    SimBackend backend({kDevice});
    SlabPool pool(&backend, 0, Options(absl::Seconds(1), 0.0));
    ASSERT_TRUE(pool.Reserve().ok());
    EXPECT_EQ(backend.SlabBytes(0), 0u);
  }
}

// ---------------------------------------------------------------------------
// Capacity and refusals

TEST(SlabPoolTest, PooledBytesNeverExceedTheDevice) {
  const uint64_t dev = 100 * kMiB + 8192;
  SimBackend backend({dev});
  SlabPool pool(&backend, 0, Options());
  std::vector<PoolBlock> blocks;
  for (;;) {
    absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, 1, 1);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
      break;
    }
    blocks.push_back(*b);
    ASSERT_LE(backend.SlabBytes(0), dev);
    ASSERT_LE(blocks.size(), 200u);
  }
  EXPECT_EQ(blocks.size(), 100u);
  EXPECT_EQ(backend.SlabBytes(0), dev);  // the last slab is cut to the rest
  EXPECT_EQ(pool.Stats().pooled_bytes, dev);
  EXPECT_EQ(pool.Stats().slab_count, 7u);
  // 8192 bytes are left in the last slab.
  absl::StatusOr<PoolBlock> tail = Carve(pool, 8192, 1, 1);
  ASSERT_TRUE(tail.ok()) << tail.status();
  absl::StatusOr<PoolBlock> none = Carve(pool, 1, 1, 1);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("capacity"));
  std::optional<::gpumem::Refusal> r = Refusal(pool, 1, 1, 1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RefusalReason::kCapacity);
  EXPECT_EQ(r->free_bytes, 0u);
  EXPECT_EQ(r->largest_free_bytes, 0u);
  EXPECT_EQ(pool.largest_carvable(), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, RefusalSaysCapacityWhenFreeBytesAreShort) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> big = Carve(pool, kDevice - kMiB, 1, 1);
  ASSERT_TRUE(big.ok()) << big.status();
  absl::StatusOr<PoolBlock> b = Carve(pool, 2 * kMiB, 1, 1);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("capacity"));
  EXPECT_THAT(b.status().message(), Not(HasSubstr("fragmentation")));
  std::optional<::gpumem::Refusal> r = Refusal(pool, 2 * kMiB, 1, 1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RefusalReason::kCapacity);
  EXPECT_EQ(r->free_bytes, kMiB);  // the dedicated slab has no slack
  EXPECT_EQ(r->largest_free_bytes, kMiB);
  // Too big for the device at all.
  absl::StatusOr<PoolBlock> c = Carve(pool, kDevice + 1, 1, 2);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("capacity"));
  absl::StatusOr<PoolBlock> d = Carve(pool, UINT64_MAX, 1, 2);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(d.status().message(), HasSubstr("capacity"));
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, RefusalSaysFragmentationWhenNoRangeHoldsTheBlock) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  // 16 slabs, each holding two 8 MiB blocks; free the second of each.
  std::vector<PoolBlock> keep, drop;
  for (int i = 0; i < 32; ++i) {
    absl::StatusOr<PoolBlock> b = Carve(pool, 8 * kMiB, kGran, 1);
    ASSERT_TRUE(b.ok()) << i << ": " << b.status();
    (i % 2 == 0 ? keep : drop).push_back(*b);
  }
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  for (const PoolBlock& b : drop) pool.Release(b);
  std::set<uint64_t> slabs;
  for (const PoolBlock& b : keep) slabs.insert(b.slab_id);
  ASSERT_EQ(slabs.size(), 16u);

  PoolStats st = pool.Stats();
  EXPECT_EQ(st.pooled_free_bytes, 128 * kMiB);
  EXPECT_EQ(st.largest_pooled_free, 8 * kMiB);
  EXPECT_DOUBLE_EQ(st.fragmentation, 1.0 - 8.0 / 128.0);
  EXPECT_EQ(pool.largest_carvable(), 8 * kMiB);

  for (uint64_t size : {8 * kMiB + 1, 9 * kMiB, 16 * kMiB, 64 * kMiB, 128 * kMiB}) {
    absl::StatusOr<PoolBlock> b = Carve(pool, size, 1, 1);
    ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << size;
    EXPECT_THAT(b.status().message(), HasSubstr("fragmentation")) << size;
  }
  absl::StatusOr<PoolBlock> b = Carve(pool, 128 * kMiB + 1, 1, 1);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("capacity"));
  // The structured refusal carries the figures tenant 1 could reach.
  std::optional<::gpumem::Refusal> r = Refusal(pool, 9 * kMiB, 1, 1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RefusalReason::kFragmentation);
  EXPECT_EQ(r->free_bytes, 128 * kMiB);
  EXPECT_EQ(r->largest_free_bytes, 8 * kMiB);
  // Tenant 1's free ranges are not tenant 2's: for it the device is full.
  r = Refusal(pool, 1, 1, 2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RefusalReason::kCapacity);
  EXPECT_EQ(r->free_bytes, 0u);
  EXPECT_EQ(r->largest_free_bytes, 0u);
  // 8 MiB still fits.
  absl::StatusOr<PoolBlock> fits = Carve(pool, 8 * kMiB, 1, 1);
  EXPECT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, AlignmentCanCauseFragmentationRefusal) {
  SimBackend backend({kSlab});  // a device of exactly one slab
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = Carve(pool, kGran, 1, 1);  // [0, 4 KiB)
  ASSERT_TRUE(a.ok());
  // 8 MiB at 8 MiB alignment fits at 8 MiB; a second cannot (only
  // [4 KiB, 8 MiB) is left).
  absl::StatusOr<PoolBlock> b = Carve(pool, 8 * kMiB, 8 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->offset, 8 * kMiB);
  std::optional<::gpumem::Refusal> c = Refusal(pool, 4 * kMiB, 8 * kMiB, 1);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->reason, RefusalReason::kFragmentation);
  EXPECT_THAT(c->message, HasSubstr("alignment"));
  EXPECT_EQ(c->free_bytes, 8 * kMiB - kGran);
  EXPECT_EQ(c->largest_free_bytes, 8 * kMiB - kGran);
  absl::StatusOr<PoolBlock> d = Carve(pool, 4 * kMiB, 4 * kMiB, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->offset, 4 * kMiB);
}

TEST(SlabPoolTest, EmptySlabsAreReleasedToMakeADedicatedSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Hours(1)));
  std::vector<PoolBlock> blocks;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<PoolBlock> b = Carve(pool, kSlab, 1, 1 + i % 3);
    ASSERT_TRUE(b.ok()) << b.status();
    blocks.push_back(*b);
  }
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  // Keep one, free the rest: 240 MiB sit in empty slabs.
  for (size_t i = 1; i < blocks.size(); ++i) pool.Release(blocks[i]);
  EXPECT_EQ(pool.Stats().slab_count, 16u);
  EXPECT_EQ(pool.largest_carvable(), kDevice - kSlab);

  absl::StatusOr<PoolBlock> big = Carve(pool, kDevice - kSlab, 1, 9);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->slab_size, kDevice - kSlab);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  EXPECT_EQ(backend.SlabBytes(0), kDevice);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
  pool.Release(*big);
  pool.Release(blocks[0]);
  EXPECT_EQ(backend.SlabBytes(0), kSlab);  // the standard slab, empty
}

TEST(SlabPoolTest, EmptyReservedSlabsAreReleasedForADedicatedSlab) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Hours(1), 1.0));
  ASSERT_TRUE(pool.Reserve().ok());
  ASSERT_EQ(backend.SlabBytes(0), kDevice);
  absl::StatusOr<PoolBlock> big = Carve(pool, 100 * kMiB, 1, 3);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_LE(backend.SlabBytes(0), kDevice);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// ---------------------------------------------------------------------------
// Statistics

TEST(SlabPoolTest, StatsMatchHandComputedFigures) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.total_bytes, kDevice);
  EXPECT_EQ(st.pooled_bytes, 0u);
  EXPECT_EQ(st.retained_bytes, 0u);
  EXPECT_EQ(st.slab_count, 0u);
  EXPECT_EQ(st.retained_slab_count, 0u);
  EXPECT_EQ(st.fragmentation, 0.0);
  EXPECT_EQ(st.largest_carvable, kDevice);
  EXPECT_EQ(pool.largest_carvable(), kDevice);

  absl::StatusOr<PoolBlock> a1 = Carve(pool, 1 * kMiB, kGran, 1);  // slab 1 [0,1)
  absl::StatusOr<PoolBlock> a3 = Carve(pool, 3 * kMiB, kGran, 1);  // slab 1 [1,4)
  absl::StatusOr<PoolBlock> b2 = Carve(pool, 2 * kMiB, kGran, 2);  // slab 2 [0,2)
  ASSERT_TRUE(a1.ok() && a3.ok() && b2.ok());
  ASSERT_EQ(a1->slab_id, a3->slab_id);
  EXPECT_EQ(a1->offset, 0u);
  EXPECT_EQ(a3->offset, 1 * kMiB);

  st = pool.Stats();
  EXPECT_EQ(st.pooled_bytes, 32 * kMiB);
  EXPECT_EQ(st.used_bytes, 6 * kMiB);
  EXPECT_EQ(st.pooled_free_bytes, 26 * kMiB);
  EXPECT_EQ(st.largest_pooled_free, 14 * kMiB);
  EXPECT_EQ(st.retained_bytes, 0u);
  EXPECT_EQ(st.live_blocks, 3u);
  EXPECT_EQ(st.slab_count, 2u);
  EXPECT_DOUBLE_EQ(st.fragmentation, 1.0 - 14.0 / 26.0);
  EXPECT_EQ(st.largest_carvable, kDevice - 32 * kMiB);
  EXPECT_EQ(pool.largest_carvable(), kDevice - 32 * kMiB);
  EXPECT_EQ(pool.used_bytes(), 6 * kMiB);
  // What each tenant could reach: free space in its own slabs plus a new
  // slab of the unpooled capacity; other tenants' free space is not theirs.
  // (A refusal with no empty slab changes nothing.)
  for (uint32_t tenant : {1u, 2u, 3u}) {
    std::optional<::gpumem::Refusal> r = Refusal(pool, kDevice + 1, 1, tenant);
    ASSERT_TRUE(r.has_value());
    const uint64_t own = tenant == 1 ? 12 * kMiB : tenant == 2 ? 14 * kMiB : 0;
    EXPECT_EQ(r->reason, RefusalReason::kCapacity);
    EXPECT_EQ(r->free_bytes, own + kDevice - 32 * kMiB) << "tenant " << tenant;
    EXPECT_EQ(r->largest_free_bytes, kDevice - 32 * kMiB) << "tenant " << tenant;
  }
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  absl::flat_hash_map<uint32_t, TenantPoolStats> t = pool.TenantStats();
  EXPECT_EQ(t[1].used_bytes, 4 * kMiB);
  EXPECT_EQ(t[1].live_blocks, 2u);
  EXPECT_EQ(t[1].slab_count, 1u);
  EXPECT_EQ(t[2].used_bytes, 2 * kMiB);
  EXPECT_EQ(t[2].live_blocks, 1u);
  EXPECT_EQ(t[2].slab_count, 1u);

  std::vector<SlabStats> slabs = pool.Slabs();
  ASSERT_EQ(slabs.size(), 2u);
  std::optional<SlabStats> s1 = FindSlab(slabs, a1->slab_id);
  std::optional<SlabStats> s2 = FindSlab(slabs, b2->slab_id);
  ASSERT_TRUE(s1.has_value() && s2.has_value());
  EXPECT_EQ(s1->tenant, 1u);
  EXPECT_EQ(s1->size, kSlab);
  EXPECT_EQ(s1->used_bytes, 4 * kMiB);
  EXPECT_EQ(s1->free_bytes, 12 * kMiB);
  EXPECT_EQ(s1->largest_free, 12 * kMiB);
  EXPECT_EQ(s1->live_blocks, 2u);
  EXPECT_EQ(s2->tenant, 2u);
  EXPECT_EQ(s2->used_bytes, 2 * kMiB);
  EXPECT_EQ(s2->free_bytes, 14 * kMiB);
  EXPECT_EQ(s2->largest_free, 14 * kMiB);
  EXPECT_EQ(s2->live_blocks, 1u);

  // A hole at the start of slab 1: 13 MiB free, largest still 12 MiB there.
  pool.Release(*a1);
  st = pool.Stats();
  EXPECT_EQ(st.used_bytes, 5 * kMiB);
  EXPECT_EQ(st.pooled_free_bytes, 27 * kMiB);
  EXPECT_EQ(st.largest_pooled_free, 14 * kMiB);
  EXPECT_EQ(st.live_blocks, 2u);
  EXPECT_DOUBLE_EQ(st.fragmentation, 1.0 - 14.0 / 27.0);
  s1 = FindSlab(pool.Slabs(), a3->slab_id);
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(s1->free_bytes, 13 * kMiB);
  EXPECT_EQ(s1->largest_free, 12 * kMiB);

  // used counts the asked size, not alignment padding.
  absl::StatusOr<PoolBlock> odd = Carve(pool, 1000, kGran, 2);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(pool.Stats().used_bytes, 5 * kMiB + 1000);
  EXPECT_EQ(pool.Stats().pooled_free_bytes, 27 * kMiB - 1000);

  // Slab 2 becomes empty, slab 1 keeps a3: an empty slab counts towards a
  // new slab in largest_carvable.
  pool.Release(*b2);
  pool.Release(*odd);
  EXPECT_EQ(pool.largest_carvable(), kDevice - 16 * kMiB);
  EXPECT_EQ(pool.Stats().slab_count, 2u);
  EXPECT_EQ(pool.Stats().used_bytes, 3 * kMiB);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// ---------------------------------------------------------------------------
// Arguments and alignment

TEST(SlabPoolTest, InvalidArguments) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  EXPECT_EQ(Carve(pool, 0, 256, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (uint64_t align : {uint64_t{0}, uint64_t{3}, uint64_t{6}, uint64_t{4097},
                         uint64_t{3} << 20, UINT64_MAX}) {
    EXPECT_EQ(Carve(pool, kMiB, align, 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << align;
  }
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_EQ(pool.ExportSlab(123456789, 1, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.CloseExport(123456789, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(pool.HasSlab(123456789));
  // A tenant of kNoTenant is not a tenant.
  EXPECT_EQ(pool.Carve(kMiB, 256, kNoTenant).kind, CarveResult::Kind::kError);
  EXPECT_EQ(pool.Carve(kMiB, 256, kNoTenant).error.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
}

TEST(SlabPoolTest, AlignmentIsHonoured) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  std::vector<PoolBlock> blocks;
  for (int shift = 0; shift <= 22; ++shift) {
    const uint64_t align = uint64_t{1} << shift;
    for (uint64_t size : {uint64_t{1}, uint64_t{1000}, uint64_t{4097}}) {
      absl::StatusOr<PoolBlock> b = Carve(pool, size, align, 1);
      ASSERT_TRUE(b.ok()) << align << " " << b.status();
      EXPECT_EQ(b->offset % align, 0u) << "alignment " << align;
      EXPECT_LE(b->offset + b->size, b->slab_size);
      blocks.push_back(*b);
    }
  }
  // A dedicated block is at offset 0, aligned to anything.
  absl::StatusOr<PoolBlock> d = Carve(pool, 17 * kMiB, 1 * kMiB, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->offset % kMiB, 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}
// ---------------------------------------------------------------------------
// Export tracking and retained slabs

TEST(SlabPoolTest, ExportSlabRecordsTheSessionAndChecksTheTenant) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<SlabPool::Export> e1 = pool.ExportSlab(a->slab_id, 1, 10);
  absl::StatusOr<SlabPool::Export> e2 = pool.ExportSlab(a->slab_id, 1, 10);
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_TRUE(e2.ok()) << e2.status();
  EXPECT_NE(e1->fd, e2->fd);  // a new fd each call
  EXPECT_EQ(e1->size, kSlab);
  close(e1->fd);
  close(e2->fd);
  ASSERT_TRUE(ExportAndClose(pool, a->slab_id, 1, 11).ok());
  std::optional<SlabStats> s = FindSlab(pool.Slabs(), a->slab_id);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->holders, 2u);  // sessions 10 and 11, each once
  EXPECT_FALSE(s->retained);
  EXPECT_TRUE(pool.SessionRetained().empty());  // nothing released yet
  // Another tenant: denied, and not recorded.
  EXPECT_EQ(pool.ExportSlab(a->slab_id, 2, 20).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(FindSlab(pool.Slabs(), a->slab_id)->holders, 2u);
  EXPECT_EQ(pool.CloseExport(a->slab_id, 20).code(), absl::StatusCode::kNotFound);
  EXPECT_VALID(pool);
  // One CloseExport per session, whatever the number of exports.
  ASSERT_TRUE(pool.CloseExport(a->slab_id, 10).ok());
  EXPECT_EQ(pool.CloseExport(a->slab_id, 10).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSlab(pool.Slabs(), a->slab_id)->holders, 1u);
  // ForgetSession of a holder of a live slab: the slab stays, unheld.
  pool.ForgetSession(11);
  pool.ForgetSession(12345);  // never given anything: harmless
  s = FindSlab(pool.Slabs(), a->slab_id);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->holders, 0u);
  EXPECT_FALSE(s->retained);
  EXPECT_EQ(pool.Stats().slab_count, 1u);
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, SlabReleasedWhileHeldIsRetainedAfterIdleRelease) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = Carve(pool, 3 * kMiB, kGran, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t slab = a->slab_id;
  ASSERT_TRUE(ExportAndClose(pool, slab, 1, 10).ok());
  pool.Release(*a);
  EXPECT_VALID(pool);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_VALID(pool);

  // Retained: kept on the device, counted, neither carvable nor exportable.
  EXPECT_TRUE(pool.HasSlab(slab));
  EXPECT_EQ(backend.SlabBytes(0), kSlab);
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.retained_bytes, kSlab);
  EXPECT_EQ(st.retained_slab_count, 1u);
  EXPECT_EQ(st.slab_count, 0u);
  EXPECT_EQ(st.pooled_bytes, 0u);
  EXPECT_EQ(st.pooled_free_bytes, 0u);
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.largest_carvable, kDevice - kSlab);
  std::optional<SlabStats> s = FindSlab(pool.Slabs(), slab);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->retained);
  EXPECT_EQ(s->holders, 1u);
  EXPECT_EQ(s->tenant, 1u);
  EXPECT_EQ(s->free_bytes, 0u);
  EXPECT_EQ(s->largest_free, 0u);
  absl::flat_hash_map<uint32_t, TenantPoolStats> t = pool.TenantStats();
  EXPECT_EQ(t[1].retained_bytes, kSlab);
  EXPECT_EQ(t[1].slab_count, 0u);
  EXPECT_EQ(t[1].used_bytes, 0u);
  absl::flat_hash_map<uint64_t, uint64_t> by_session = pool.SessionRetained();
  ASSERT_EQ(by_session.size(), 1u);
  EXPECT_EQ(by_session[10], kSlab);
  EXPECT_EQ(pool.ExportSlab(slab, 1, 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.ExportSlab(slab, 1, 11).status().code(), absl::StatusCode::kNotFound);
  // Idle release again does nothing to it.
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Hours(100)), 0);
  // Another tenant's next block comes from a new slab; the tenant's own
  // comes from its retained slab, carvable again (no new slab beside it).
  absl::StatusOr<PoolBlock> other = Carve(pool, kMiB, kGran, 2);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->slab_id, slab);
  EXPECT_TRUE(other->new_slab);
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->slab_id, slab);
  EXPECT_FALSE(b->new_slab);
  EXPECT_FALSE(FindSlab(pool.Slabs(), slab)->retained);
  EXPECT_EQ(pool.TenantStats()[1].retained_bytes, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 2 * kSlab);
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, RetainedSlabIsReturnedAfterForgetSession) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t slab = a->slab_id;
  ASSERT_TRUE(ExportAndClose(pool, slab, 1, 10).ok());
  ASSERT_TRUE(ExportAndClose(pool, slab, 1, 11).ok());
  pool.Release(*a);
  ASSERT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_EQ(pool.Stats().retained_bytes, kSlab);
  EXPECT_EQ(pool.SessionRetained().size(), 2u);
  EXPECT_VALID(pool);

  pool.ForgetSession(10);  // session 11 may still map it
  EXPECT_TRUE(pool.HasSlab(slab));
  EXPECT_EQ(pool.Stats().retained_bytes, kSlab);
  EXPECT_EQ(FindSlab(pool.Slabs(), slab)->holders, 1u);
  EXPECT_EQ(pool.SessionRetained().count(10), 0u);
  EXPECT_EQ(pool.SessionRetained()[11], kSlab);
  EXPECT_EQ(pool.CloseExport(slab, 10).code(), absl::StatusCode::kNotFound);
  EXPECT_VALID(pool);

  pool.ForgetSession(11);
  EXPECT_FALSE(pool.HasSlab(slab));
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.retained_bytes, 0u);
  EXPECT_EQ(st.retained_slab_count, 0u);
  EXPECT_EQ(st.largest_carvable, kDevice);
  EXPECT_TRUE(pool.SessionRetained().empty());
  absl::flat_hash_map<uint32_t, TenantPoolStats> t = pool.TenantStats();
  EXPECT_TRUE(t.find(1) == t.end() || t[1].retained_bytes == 0);
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, RetainedSlabIsReturnedAfterCloseExport) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, 1);
  absl::StatusOr<PoolBlock> other = Carve(pool, kMiB, kGran, 2);
  ASSERT_TRUE(a.ok() && other.ok());
  const uint64_t slab = a->slab_id;
  ASSERT_TRUE(ExportAndClose(pool, slab, 1, 10).ok());
  ASSERT_TRUE(ExportAndClose(pool, other->slab_id, 2, 20).ok());
  pool.Release(*a);
  ASSERT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_TRUE(FindSlab(pool.Slabs(), slab)->retained);
  EXPECT_EQ(pool.TenantStats()[1].retained_bytes, kSlab);
  EXPECT_EQ(pool.TenantStats()[2].retained_bytes, 0u);
  EXPECT_VALID(pool);

  ASSERT_TRUE(pool.CloseExport(slab, 10).ok());
  EXPECT_FALSE(pool.HasSlab(slab));
  EXPECT_EQ(backend.SlabBytes(0), kSlab);  // tenant 2's slab only
  EXPECT_EQ(pool.Stats().retained_bytes, 0u);
  EXPECT_TRUE(pool.SessionRetained().empty());
  // Closing again: the pool no longer has a record of it.
  EXPECT_EQ(pool.CloseExport(slab, 10).code(), absl::StatusCode::kNotFound);
  // Session 20 still holds tenant 2's live slab.
  EXPECT_EQ(FindSlab(pool.Slabs(), other->slab_id)->holders, 1u);
  EXPECT_VALID(pool);
}

// A slab closed by its only holder before it is released is not retained.
TEST(SlabPoolTest, ClosedExportIsNotRetained) {
  SimBackend backend({kDevice});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(ExportAndClose(pool, a->slab_id, 1, 10).ok());
  ASSERT_TRUE(pool.CloseExport(a->slab_id, 10).ok());
  pool.Release(*a);
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_FALSE(pool.HasSlab(a->slab_id));
  EXPECT_EQ(pool.Stats().retained_bytes, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, DedicatedSlabFreedWhileHeldIsRetained) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  const uint64_t size = 20 * kMiB + 1;
  const uint64_t slab_size = RoundUp(size, kGran);
  absl::StatusOr<PoolBlock> d = Carve(pool, size, 256, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->slab_size, slab_size);
  ASSERT_TRUE(ExportAndClose(pool, d->slab_id, 1, 10).ok());
  pool.Release(*d);  // a dedicated slab is released with its block...
  EXPECT_VALID(pool);
  // ...but session 10 may still map it.
  std::optional<SlabStats> s = FindSlab(pool.Slabs(), d->slab_id);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->retained);
  EXPECT_TRUE(s->dedicated);
  EXPECT_EQ(s->live_blocks, 0u);
  EXPECT_EQ(backend.SlabBytes(0), slab_size);
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.retained_bytes, slab_size);
  EXPECT_EQ(st.retained_slab_count, 1u);
  EXPECT_EQ(st.slab_count, 0u);
  EXPECT_EQ(st.largest_carvable, kDevice - slab_size);
  EXPECT_EQ(pool.TenantStats()[1].retained_bytes, slab_size);
  EXPECT_EQ(pool.SessionRetained()[10], slab_size);
  EXPECT_EQ(pool.ExportSlab(d->slab_id, 1, 10).status().code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(pool.CloseExport(d->slab_id, 10).ok());
  EXPECT_FALSE(pool.HasSlab(d->slab_id));
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_EQ(pool.Stats().retained_bytes, 0u);
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, CloseExportOfASlabNeverGivenIsNotFound) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options());
  absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, kGran, 1);
  absl::StatusOr<PoolBlock> b = Carve(pool, kMiB, kGran, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  // The slab exists but was never given to anyone.
  EXPECT_EQ(pool.CloseExport(a->slab_id, 10).code(), absl::StatusCode::kNotFound);
  // Given to session 10, not to session 11; and session 10 was given a, not b.
  ASSERT_TRUE(ExportAndClose(pool, a->slab_id, 1, 10).ok());
  EXPECT_EQ(pool.CloseExport(a->slab_id, 11).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.CloseExport(b->slab_id, 10).code(), absl::StatusCode::kNotFound);
  // No such slab at all.
  EXPECT_EQ(pool.CloseExport(987654321, 10).code(), absl::StatusCode::kNotFound);
  // A refused export (wrong tenant) records nothing to close.
  EXPECT_EQ(pool.ExportSlab(b->slab_id, 1, 10).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(pool.CloseExport(b->slab_id, 10).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSlab(pool.Slabs(), a->slab_id)->holders, 1u);
  EXPECT_EQ(FindSlab(pool.Slabs(), b->slab_id)->holders, 0u);
  EXPECT_VALID(pool);
  EXPECT_TRUE(pool.CloseExport(a->slab_id, 10).ok());
  EXPECT_VALID(pool);
}

// Retained slabs are device memory someone may still hold: they count
// against the device's capacity until they are let go.
TEST(SlabPoolTest, RetainedBytesCountAgainstCapacity) {
  SimBackend backend({2 * kSlab});
  const absl::Duration after = absl::Seconds(10);
  SlabPool pool(&backend, 0, Options(after));
  absl::StatusOr<PoolBlock> a = Carve(pool, kSlab, kGran, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(ExportAndClose(pool, a->slab_id, 1, 10).ok());
  pool.Release(*a);
  ASSERT_EQ(pool.ReleaseIdleSlabs(absl::Now() + after), 1);
  EXPECT_EQ(pool.largest_carvable(), kSlab);

  absl::StatusOr<PoolBlock> b = Carve(pool, kSlab, kGran, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slab_id, a->slab_id);
  EXPECT_EQ(pool.largest_carvable(), 0u);
  // Tenant 3 (tenant 1 could carve its own retained slab again).
  std::optional<::gpumem::Refusal> r = Refusal(pool, 1, 1, 3);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RefusalReason::kCapacity);
  EXPECT_EQ(r->free_bytes, 0u);
  EXPECT_THAT(r->message, HasSubstr("retained"));
  EXPECT_TRUE(FindSlab(pool.Slabs(), a->slab_id)->retained);
  EXPECT_VALID(pool);

  pool.ForgetSession(10);
  EXPECT_EQ(backend.SlabBytes(0), kSlab);
  EXPECT_EQ(pool.largest_carvable(), kSlab);
  absl::StatusOr<PoolBlock> c = Carve(pool, kMiB, kGran, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->slab_id, a->slab_id);
  EXPECT_VALID(pool);
}

TEST(SlabPoolTest, DestroyingThePoolReturnsRetainedSlabsToo) {
  SimBackend backend({kDevice});
  {
    SlabPool pool(&backend, 0, Options());
    absl::StatusOr<PoolBlock> d = Carve(pool, 20 * kMiB, 256, 1);
    absl::StatusOr<PoolBlock> a = Carve(pool, kMiB, 256, 1);
    ASSERT_TRUE(d.ok() && a.ok());
    ASSERT_TRUE(ExportAndClose(pool, d->slab_id, 1, 10).ok());
    ASSERT_TRUE(ExportAndClose(pool, a->slab_id, 1, 10).ok());
    pool.Release(*d);
    ASSERT_EQ(pool.Stats().retained_slab_count, 1u);
    EXPECT_EQ(backend.SlabBytes(0), 20 * kMiB + kSlab);
  }
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  {
    SlabPool pool(&backend, 0, Options());
    absl::StatusOr<PoolBlock> d = Carve(pool, 20 * kMiB, 256, 1);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(ExportAndClose(pool, d->slab_id, 1, 10).ok());
    pool.Release(*d);
    pool.ReleaseAll();
    EXPECT_EQ(backend.SlabBytes(0), 0u);
    EXPECT_FALSE(pool.HasSlab(d->slab_id));
    EXPECT_EQ(pool.Stats().retained_bytes, 0u);
    EXPECT_TRUE(pool.SessionRetained().empty());
    EXPECT_VALID(pool);
  }
}

// ---------------------------------------------------------------------------
// Randomized sequence against a model

TEST(SlabPoolTest, RandomizedSequenceKeepsInvariants) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::Seconds(5)));
  std::mt19937_64 rng(0x5eed);
  struct Live {
    uint32_t tenant;
    uint64_t alignment;
    PoolBlock block;
  };
  std::vector<Live> live;
  std::map<uint32_t, uint64_t> used_by_tenant;
  uint64_t used = 0;
  int refusals = 0, carves = 0, exports = 0, closes = 0, retained_seen = 0;
  // The export books as the model sees them: slab -> sessions given its
  // handle that have neither closed it nor ended.
  std::map<uint64_t, std::set<uint64_t>> holders;
  // Each slab's tenant when first seen: a slab never changes tenant.
  std::map<uint64_t, uint32_t> owner;
  // Two sessions per tenant: tenant t has sessions 100 t and 100 t + 1.
  auto session_of = [](uint32_t tenant, uint64_t k) { return uint64_t{tenant} * 100 + k; };
  auto pick_size = [&]() -> uint64_t {
    switch (rng() % 10) {
      case 0: return 1 + rng() % 64;
      case 1: case 2: case 3: return 1 + rng() % (64 * kKiB);
      case 4: case 5: case 6: return 1 + rng() % (2 * kMiB);
      case 7: case 8: return 1 + rng() % kSlab;
      default: return kSlab + 1 + rng() % (40 * kMiB);  // dedicated
    }
  };
  for (int step = 0; step < 4000; ++step) {
    const int op = rng() % 100;
    if (op < 52) {
      const uint32_t tenant = 1 + rng() % 4;
      const uint64_t size = pick_size();
      const uint64_t align = uint64_t{1} << (rng() % 21);
      // Oracle: with alignment <= granularity, a block is always served when
      // unpooled capacity plus empty, unheld slabs (of any tenant) can hold
      // a new slab for it. Retained and held slabs do not count.
      uint64_t fresh = kDevice - backend.SlabBytes(0);
      for (const SlabStats& s : pool.Slabs()) {
        if (s.live_blocks == 0 && !s.retained && s.holders == 0) fresh += s.size;
      }
      const bool must_fit = align <= kGran && fresh >= RoundUp(size, kGran);
      CarveResult r = pool.Carve(size, align, tenant);
      ASSERT_NE(r.kind, CarveResult::Kind::kError) << "step " << step << ": " << r.error;
      if (r.kind == CarveResult::Kind::kBlock) {
        const PoolBlock& b = r.block;
        ++carves;
        EXPECT_EQ(b.size, size);
        EXPECT_EQ(b.tenant, tenant);
        EXPECT_EQ(b.offset % align, 0u);
        EXPECT_LE(b.offset + b.size, b.slab_size);
        auto o = owner.find(b.slab_id);
        if (o != owner.end()) {
          ASSERT_EQ(o->second, tenant)
              << "step " << step << ": slab " << b.slab_id << " of tenant " << o->second
              << " carved for tenant " << tenant;
          EXPECT_FALSE(b.new_slab);
        }
        if (size > kSlab) {
          EXPECT_EQ(b.offset, 0u);
          EXPECT_GE(b.slab_size, RoundUp(size, kGran));
          EXPECT_TRUE(b.new_slab);
        }
        live.push_back({tenant, align, b});
        used_by_tenant[tenant] += size;
        used += size;
      } else {
        ++refusals;
        EXPECT_FALSE(must_fit) << "step " << step << ": refused " << size << " with "
                               << fresh << " fresh bytes: " << r.refusal.message;
        CheckRefusal(r.refusal, size);
      }
    } else if (op < 85) {
      if (live.empty()) continue;
      const size_t k = rng() % live.size();
      pool.Release(live[k].block);
      used_by_tenant[live[k].tenant] -= live[k].block.size;
      used -= live[k].block.size;
      live[k] = live.back();
      live.pop_back();
    } else if (op < 91) {
      // A session of the block's tenant is given the slab's handle; now
      // and then a session of another tenant asks and is denied.
      if (live.empty()) continue;
      const Live& l = live[rng() % live.size()];
      if (rng() % 8 == 0) {
        const uint32_t wrong = 1 + l.tenant % 4;
        EXPECT_EQ(pool.ExportSlab(l.block.slab_id, wrong, session_of(wrong, 0))
                      .status()
                      .code(),
                  absl::StatusCode::kPermissionDenied);
        continue;
      }
      const uint64_t session = session_of(l.tenant, rng() % 2);
      ASSERT_TRUE(ExportAndClose(pool, l.block.slab_id, l.tenant, session).ok())
          << "step " << step;
      holders[l.block.slab_id].insert(session);
      ++exports;
    } else if (op < 95) {
      // A holder closes a slab (retained or not); or a session closes a
      // slab it was never given.
      std::vector<std::pair<uint64_t, uint64_t>> held;
      for (const auto& [slab, sessions] : holders) {
        for (uint64_t s : sessions) held.emplace_back(slab, s);
      }
      if (held.empty() || rng() % 6 == 0) {
        const uint64_t slab = live.empty() ? 1 : live[rng() % live.size()].block.slab_id;
        const uint64_t session = 900 + rng() % 3;  // never given anything
        EXPECT_EQ(pool.CloseExport(slab, session).code(), absl::StatusCode::kNotFound);
        continue;
      }
      const auto [slab, session] = held[rng() % held.size()];
      ASSERT_TRUE(pool.CloseExport(slab, session).ok()) << "step " << step;
      holders[slab].erase(session);
      ++closes;
    } else if (op < 97) {
      const uint64_t session = session_of(1 + rng() % 4, rng() % 2);
      pool.ForgetSession(session);
      for (auto& [slab, sessions] : holders) sessions.erase(session);
    } else {
      pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(rng() % 10));
    }

    absl::Status v = pool.Validate();
    ASSERT_TRUE(v.ok()) << "step " << step << ": " << v;
    PoolStats st = pool.Stats();
    ASSERT_EQ(st.used_bytes, used) << "step " << step;
    ASSERT_EQ(st.live_blocks, live.size()) << "step " << step;
    ASSERT_LE(backend.SlabBytes(0), kDevice);
    ASSERT_EQ(st.pooled_bytes + st.retained_bytes, backend.SlabBytes(0)) << "step " << step;
    ASSERT_LE(st.largest_carvable, kDevice - backend.SlabBytes(0) + st.pooled_bytes);
    // Per-tenant usage from the slabs equals the model; each slab with live
    // blocks belongs to the tenant of those blocks; slabs keep their tenant;
    // the holders are the model's.
    std::map<uint32_t, uint64_t> by_tenant, retained_by_tenant;
    std::map<uint64_t, uint64_t> retained_by_session;
    std::map<uint64_t, uint32_t> slab_tenant;
    uint64_t retained = 0;
    uint32_t retained_count = 0;
    for (const SlabStats& s : pool.Slabs()) {
      by_tenant[s.tenant] += s.used_bytes;
      slab_tenant[s.slab_id] = s.tenant;
      auto [o, inserted] = owner.emplace(s.slab_id, s.tenant);
      ASSERT_EQ(o->second, s.tenant) << "step " << step << ": slab " << s.slab_id
                                     << " changed tenant";
      ASSERT_NE(s.tenant, kNoTenant);  // no reservation in this test
      ASSERT_EQ(s.used_bytes == 0, s.live_blocks == 0);
      ASSERT_LE(s.free_bytes + s.used_bytes, s.size);
      ASSERT_LE(s.largest_free, s.free_bytes);
      const std::set<uint64_t>& h = holders[s.slab_id];
      ASSERT_EQ(s.holders, h.size()) << "step " << step << ": slab " << s.slab_id;
      if (s.retained) {
        ASSERT_EQ(s.live_blocks, 0u);
        ASSERT_GT(s.holders, 0u);
        retained += s.size;
        ++retained_count;
        retained_by_tenant[s.tenant] += s.size;
        for (uint64_t session : h) retained_by_session[session] += s.size;
      }
    }
    // A slab someone holds never goes back to the device; a slab nobody
    // holds any more and that is gone is forgotten by the model.
    for (auto it = holders.begin(); it != holders.end();) {
      if (slab_tenant.count(it->first) == 0) {
        ASSERT_TRUE(it->second.empty())
            << "step " << step << ": slab " << it->first << " released while held";
        it = holders.erase(it);
      } else {
        ++it;
      }
    }
    retained_seen += retained_count > 0;
    ASSERT_EQ(st.retained_bytes, retained) << "step " << step;
    ASSERT_EQ(st.retained_slab_count, retained_count) << "step " << step;
    for (const Live& l : live) {
      ASSERT_EQ(slab_tenant.at(l.block.slab_id), l.tenant) << "step " << step;
    }
    absl::flat_hash_map<uint32_t, TenantPoolStats> tenants = pool.TenantStats();
    for (uint32_t t = 1; t <= 4; ++t) {
      ASSERT_EQ(by_tenant[t], used_by_tenant[t]) << "tenant " << t << " step " << step;
      const uint64_t pool_used = tenants.count(t) ? tenants[t].used_bytes : 0;
      const uint64_t pool_retained = tenants.count(t) ? tenants[t].retained_bytes : 0;
      ASSERT_EQ(pool_used, used_by_tenant[t]) << "tenant " << t << " step " << step;
      ASSERT_EQ(pool_retained, retained_by_tenant[t]) << "tenant " << t << " step " << step;
    }
    absl::flat_hash_map<uint64_t, uint64_t> session_retained = pool.SessionRetained();
    ASSERT_EQ(session_retained.size(), retained_by_session.size()) << "step " << step;
    for (const auto& [session, bytes] : retained_by_session) {
      ASSERT_EQ(session_retained[session], bytes) << "session " << session << " step " << step;
    }
    if (step % 250 == 0) {
      // No two live blocks overlap.
      std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
      for (const Live& l : live) {
        ranges[l.block.slab_id].push_back({l.block.offset, l.block.size});
      }
      for (auto& [slab, r] : ranges) {
        std::sort(r.begin(), r.end());
        for (size_t i = 1; i < r.size(); ++i) {
          ASSERT_LE(r[i - 1].first + r[i - 1].second, r[i].first);
        }
      }
    }
  }
  EXPECT_GT(carves, 1000);
  EXPECT_GT(refusals, 0);  // the sequence does reach the device's limits
  EXPECT_GT(exports, 100);
  EXPECT_GT(closes, 50);
  EXPECT_GT(retained_seen, 0);  // and does retain slabs
  for (const Live& l : live) pool.Release(l.block);
  EXPECT_EQ(pool.Stats().used_bytes, 0u);
  EXPECT_EQ(pool.Stats().live_blocks, 0u);
  const int slab_count = static_cast<int>(pool.Stats().slab_count);
  // Every carvable slab is released (held ones become retained) ...
  EXPECT_EQ(pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(5)), slab_count);
  EXPECT_EQ(pool.Stats().slab_count, 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
  // ... and goes back to the device once every session has ended.
  for (uint32_t t = 1; t <= 4; ++t) {
    for (uint64_t k = 0; k < 2; ++k) pool.ForgetSession(session_of(t, k));
  }
  EXPECT_EQ(pool.Stats().retained_bytes, 0u);
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

// ---------------------------------------------------------------------------
// Concurrency: the pool locks itself

TEST(SlabPoolTest, ConcurrentCallersKeepThePoolConsistent) {
  SimBackend backend({kDevice});
  SlabPool pool(&backend, 0, Options(absl::ZeroDuration()));
  constexpr int kThreads = 4;
  constexpr int kOps = 600;
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> seen(kThreads);
  std::vector<int> failures(kThreads, 0);
  auto worker = [&](int t) {
    const uint32_t tenant = 1 + t % 2;  // two threads per tenant
    const uint64_t session = 10 + t;
    std::mt19937_64 rng(77 + t);
    std::vector<PoolBlock> live;
    for (int op = 0; op < kOps; ++op) {
      const int dice = rng() % 100;
      if (dice < 50 || live.empty()) {
        const uint64_t size = rng() % 10 == 0 ? kSlab + 1 + rng() % (8 * kMiB)
                                              : 1 + rng() % (4 * kMiB);
        CarveResult r = pool.Carve(size, uint64_t{1} << (rng() % 13), tenant);
        if (r.kind == CarveResult::Kind::kBlock) {
          if (r.block.tenant != tenant) ++failures[t];
          seen[t].emplace_back(r.block.slab_id, tenant);
          live.push_back(r.block);
        } else if (r.kind == CarveResult::Kind::kError) {
          ++failures[t];
        }
      } else if (dice < 85) {
        const size_t k = rng() % live.size();
        pool.Release(live[k]);
        live[k] = live.back();
        live.pop_back();
      } else if (dice < 93) {
        // The slab of a live block of ours is ours and still there.
        const uint64_t slab = live[rng() % live.size()].slab_id;
        if (!ExportAndClose(pool, slab, tenant, session).ok()) ++failures[t];
        if (rng() % 2 == 0 && !pool.CloseExport(slab, session).ok()) ++failures[t];
      } else if (dice < 97) {
        pool.ReleaseIdleSlabs(absl::Now());
      } else {
        const PoolStats st = pool.Stats();
        if (st.used_bytes > st.total_bytes ||
            st.pooled_bytes + st.retained_bytes > st.total_bytes) {
          ++failures[t];
        }
        pool.Slabs();
        pool.TenantStats();
        pool.SessionRetained();
      }
    }
    for (const PoolBlock& b : live) pool.Release(b);
    pool.ForgetSession(session);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  // No slab was ever carved for two tenants.
  std::map<uint64_t, uint32_t> owner;
  for (const auto& v : seen) {
    for (const auto& [slab, tenant] : v) {
      auto [it, inserted] = owner.emplace(slab, tenant);
      EXPECT_EQ(it->second, tenant) << "slab " << slab;
    }
  }
  EXPECT_GT(owner.size(), 2u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.retained_bytes, 0u);  // every session ended
  pool.ReleaseIdleSlabs(absl::Now() + absl::Seconds(1));
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_TRUE(pool.Validate().ok()) << pool.Validate();
}

TEST(SlabPoolTest, DestroyingThePoolReturnsEverySlab) {
  SimBackend backend({kDevice, kDevice});
  {
    SlabPool pool(&backend, 1, Options());
    ASSERT_TRUE(Carve(pool, kMiB, 1, 1).ok());
    ASSERT_TRUE(Carve(pool, 30 * kMiB, 1, 2).ok());
    EXPECT_EQ(backend.SlabBytes(1), kSlab + 30 * kMiB);
    EXPECT_EQ(backend.SlabBytes(0), 0u);
    EXPECT_EQ(pool.device(), 1u);
  }
  EXPECT_EQ(backend.SlabBytes(1), 0u);
}

}  // namespace
}  // namespace gpumem
