// SlabPool: the memory of one device, as slabs (large backend allocations
// that clients import whole) carved into blocks with one OffsetAllocator per
// slab, and the record of which sessions were given each slab's handle.
// Invariants: a slab belongs to one tenant for life (a handle a client was
// given may be kept forever, so a slab is never reused by another tenant;
// only a reserved slab nobody was given is claimed by its first carver); a
// slab released while a session given its handle lives is *retained* (kept,
// counted, not carvable but by its own tenant) until each such session ends
// or closes it; a slab has one HandleKind for life; slabs are sized per
// tenant and, with a budget (slab_budget.h), a tenant's footprint on the
// device stays within it plus one granule (else a kQuota refusal naming the footprint); live slab bytes
// never exceed the device's capacity nor Backend::NewSlabRoom; a failed
// Carve leaves the pool as it was, and TryCarve never calls the backend.
// Every method may be called from any thread: one mutex guards the books,
// and backend work runs outside it.
#ifndef GPUMEMD_SERVER_POOL_SLAB_POOL_H_
#define GPUMEMD_SERVER_POOL_SLAB_POOL_H_

#include <cstdint>
#include <map>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/alloc/offset_allocator.h"
#include "common/refusal.h"
#include "server/backend/backend.h"
#include "server/defaults/defaults.h"
#include "server/pool/slab_budget.h"
#include "server/pool/slab_keeper.h"

namespace gpumem {

// The tenant of a reserved slab nobody has carved from yet.
inline constexpr uint32_t kNoTenant = UINT32_MAX;

struct PoolOptions {
  uint64_t slab_size = defaults::kSlabSize;
  // The smallest new slab (rounded up to the granularity, at most
  // slab_size): a tenant's first slab on a device, for a small block.
  uint64_t min_slab_size = defaults::kMinSlabSize;
  // Slab sizes are rounded up to this (CUDA VMM granularity is 2 MiB).
  uint64_t granularity = uint64_t{2} << 20;
  absl::Duration empty_release_after = defaults::kEmptySlabRelease;
  // Fraction of the device taken as slabs at start and kept (0 = none).
  double reserve_fraction = defaults::kReserveFraction;
};

// A carved block. `handle` is the allocator's, for O(1) release;
// `new_slab` says the carve created the slab (Uncarve then removes it),
// `claimed_slab` that it claimed a reserved one (Uncarve gives it back),
// `dedicated` that the slab is the block's alone (its Release gives the slab
// back to the backend).
struct PoolBlock {
  uint64_t slab_id = 0;
  uint64_t slab_size = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t handle = 0;
  uint32_t tenant = 0;
  bool new_slab = false;
  bool claimed_slab = false;  // the carve claimed a reserved slab
  bool dedicated = false;
  HandleKind kind = HandleKind::kMemfd;
};

// What Carve did: exactly one of block (ok), refusal (refused), error, or
// (TryCarve only) that serving it needs backend work.
struct CarveResult {
  enum class Kind { kBlock, kRefused, kError, kNeedsBackendWork };
  Kind kind = Kind::kError;
  PoolBlock block;
  // Why the pool could not carve a block for a tenant (common/refusal.h),
  // with the figures the tenant could reach at that moment: its reachable
  // free bytes, the largest block it could get, and the same in words
  // naming the device. kQuota is its footprint: the tenant's budget (its
  // quota) allows no slab that could hold the block (its own slabs have no
  // room for it); only then are the words its detail too, and for
  // kCapacity on a device that keeps headroom, the headroom's words.
  Refusal refusal;
  absl::Status error;
};

// 1 - largest free range / free bytes (0 when nothing is free).
double Fragmentation(uint64_t largest_free, uint64_t free_bytes);

struct SlabStats {
  uint64_t slab_id = 0;
  uint32_t tenant = 0;
  uint64_t size = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  double fragmentation = 0.0;  // Fragmentation(largest_free, free_bytes)
  uint64_t live_blocks = 0;
  uint32_t holders = 0;  // live sessions that were given its handle
  bool dedicated = false;
  bool reserved = false;
  bool retained = false;  // released, but a holder may still map it
};

struct PoolStats {
  uint64_t total_bytes = 0;      // device capacity
  uint64_t pooled_bytes = 0;     // bytes in carvable slabs
  uint64_t used_bytes = 0;       // bytes in live blocks, as asked
  uint64_t retained_bytes = 0;   // released slabs a live session may hold
  uint64_t pooled_free_bytes = 0;
  // What a tenant that holds nothing on the device could get: capacity in
  // no slab (within Backend::NewSlabRoom) plus empty slabs nobody holds.
  // Free ranges in a tenant's slabs are not in it: only that tenant can
  // carve them (TenantPoolStats, LargestReachable).
  uint64_t free_bytes = 0;
  uint64_t largest_pooled_free = 0;
  uint64_t largest_carvable = 0;  // see SlabPool::largest_carvable()
  uint64_t live_blocks = 0;
  uint32_t slab_count = 0;        // carvable slabs (retained not counted)
  uint32_t retained_slab_count = 0;
  // 1 - largest_pooled_free / pooled_free_bytes (0 when nothing is free).
  double fragmentation = 0.0;
};

// One tenant's figures on this device.
struct TenantPoolStats {
  uint64_t used_bytes = 0;
  uint64_t retained_bytes = 0;
  uint64_t slab_bytes = 0;  // bytes of its carvable slabs
  // What the tenant pins on the device: slab_bytes + retained_bytes.
  uint64_t footprint_bytes() const { return slab_bytes + retained_bytes; }
  uint64_t live_blocks = 0;
  uint32_t slab_count = 0;
};

class SlabPool {
 public:
  SlabPool(Backend* backend, uint32_t device, PoolOptions options);
  ~SlabPool();  // releases every slab, retained ones too
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // Makes the start-time reservation; call once.
  absl::Status Reserve();
  // Where the pool keeps what a restart needs (may be null: nothing kept).
  // Before the pool is used; it must outlive the pool.
  void SetKeeper(SlabKeeper* keeper) { keeper_ = keeper; }
  // What bounds each tenant's slab bytes here (may be null: no bound but the
  // device). Before the pool is used; it must outlive the pool.
  void SetBudget(SlabBudget* budget) { budget_ = budget; }

  // A restart takes back what a previous daemon kept:
  //  - AdoptSlab: a slab as it was (`slab` its handle, or null while the
  //    handle has not come back: nothing is carved from it nor exported
  //    until CompleteSlab, but its bytes count as held);
  //  - AdoptBlock: a live block of an adopted slab, exactly where it was
  //    (INVALID_ARGUMENT, nothing taken, if it overlaps another or lies
  //    outside);
  //  - AdoptHolder: a live session was given the slab's handle;
  //  - FindSlab: a slab as it is now, and whether its handle has yet to
  //    come back;
  //  - CompleteSlab: a client gave back the handle of a slab adopted
  //    without one (checked by the caller to be that slab's);
  //  - DropAwaitingSlab: a slab whose handle never came back and that holds
  //    no live block goes.
  // New slabs get ids above every adopted one.
  absl::Status AdoptSlab(const SlabFacts& facts, std::unique_ptr<Slab> slab);
  absl::StatusOr<PoolBlock> AdoptBlock(uint64_t slab_id, uint64_t offset, uint64_t size);
  // `record`: tell the keeper (a holder new since the restart).
  void AdoptHolder(uint64_t slab_id, uint64_t session, bool record = false);
  // Whether `session` was given slab `slab_id`'s handle.
  bool IsHolder(uint64_t slab_id, uint64_t session) const;
  struct SlabState {
    SlabFacts facts;
    bool awaiting_handle = false;  // adopted without its handle, not given back yet
  };
  // Slab `slab_id` (carvable or retained); nullopt when the pool has none.
  std::optional<SlabState> FindSlab(uint64_t slab_id) const;
  absl::Status CompleteSlab(uint64_t slab_id, std::unique_ptr<Slab> slab);
  void DropAwaitingSlab(uint64_t slab_id);
  // Slab ids are unique for the daemon's life and across restarts.
  static void AdvanceSlabIdsPast(uint64_t id);

  // A block of `size` bytes at `alignment` (power of two) for `tenant`, in
  // a slab of `kind` (one the backend makes). May call the backend (create
  // a slab; release empty ones to make room for it), which on CUDA takes
  // milliseconds; never waits for anything else.
  CarveResult Carve(uint64_t size, uint64_t alignment, uint32_t tenant, HandleKind kind);
  // The same from existing slabs only, never calling the backend: where
  // Carve would, the answer is kNeedsBackendWork and nothing changed.
  CarveResult TryCarve(uint64_t size, uint64_t alignment, uint32_t tenant, HandleKind kind);
  // The same, in the backend's default kind.
  CarveResult Carve(uint64_t size, uint64_t alignment, uint32_t tenant) {
    return Carve(size, alignment, tenant, backend_->handle_kinds().front());
  }
  // Returns a carved block. Calls the backend when the block's slab is
  // dedicated (the slab goes back with it); otherwise only takes the lock.
  void Release(const PoolBlock& block);
  // Undoes a Carve that its caller abandons (a sharded request that failed
  // elsewhere): like Release, and a slab the carve created goes back to the
  // device at once, so the pool's slabs are as before the Carve.
  void Uncarve(const PoolBlock& block);

  // A new fd for a slab's handle, recorded as given to `session`. NOT_FOUND
  // if the pool has no such carvable slab, PERMISSION_DENIED if `tenant`
  // does not own it, the backend's error (naming device and slab) otherwise.
  struct Export {
    int fd = -1;        // the caller owns and closes it
    uint64_t size = 0;  // the slab's size, what an importer maps
  };
  absl::StatusOr<Export> ExportSlab(uint64_t slab_id, uint32_t tenant,
                                    uint64_t session);
  // The 64 legacy IPC handle bytes of a HandleKind::kCudaIpc slab, recorded
  // as given to `session` exactly like ExportSlab (same errors).
  absl::StatusOr<std::string> IpcHandle(uint64_t slab_id, uint32_t tenant,
                                        uint64_t session);
  // `session` says it closed the slab (or never will use it again). NOT_FOUND
  // when the pool has no record of giving it that slab.
  absl::Status CloseExport(uint64_t slab_id, uint64_t session);
  // `session` ended: it holds no handle any more.
  void ForgetSession(uint64_t session);
  // Whether the pool has the slab (carvable or retained).
  bool HasSlab(uint64_t slab_id) const;

  // Gives back slabs empty since before now - empty_release_after.
  int ReleaseIdleSlabs(absl::Time now);
  // Changes empty_release_after from now on (config reload).
  void SetEmptyReleaseAfter(absl::Duration after) {
    absl::MutexLock lock(&mu_);
    options_.empty_release_after = after;  // read only under mu_
  }
  // Gives back every slab now (daemon shutdown), retained ones too.
  void ReleaseAll();
  // `tenant` is gone for good (a socket tenant deleted): its empty slabs,
  // which no other tenant may ever carve from, go back now (reserved ones
  // too), and each of its slabs still holding a block (one being freed at
  // this moment) goes back as soon as it is empty; one still held by a
  // live session becomes retained as usual. Calls the backend. Returns how
  // many slabs were released now.
  int ReleaseTenantSlabs(uint32_t tenant);

  uint32_t device() const { return device_; }
  // Bytes in live blocks.
  uint64_t used_bytes() const;
  // The largest block Carve could serve now for some tenant (a pooled range
  // or a new slab made of unpooled capacity and empty, unheld slabs).
  uint64_t largest_carvable() const;
  // The largest block Carve could serve now for `tenant` in slabs of
  // `kind`: a free range in its own (or unclaimed reserved) slabs, or a new
  // slab made of unpooled capacity and empty, unheld slabs. What fair
  // waiting keeps for a reserving request (reserving_carver.h).
  uint64_t LargestReachable(uint32_t tenant, HandleKind kind) const;
  PoolStats Stats() const;
  std::vector<SlabStats> Slabs() const;
  absl::flat_hash_map<uint32_t, TenantPoolStats> TenantStats() const;
  // Bytes `tenant` has retained on this device (what quotas count besides
  // live blocks).
  uint64_t TenantRetained(uint32_t tenant) const;
  // Retained bytes each session may still hold (sessions with none absent).
  absl::flat_hash_map<uint64_t, uint64_t> SessionRetained() const;
  // Checks each slab's allocator, the pool's counters and the export books.
  absl::Status Validate() const;

 private:
  struct SlabEntry {
    std::shared_ptr<Slab> slab;  // null: adopted, its handle not back yet
    uint64_t size = 0;
    SlabIdentity identity;       // of an adopted slab's handle
    std::unique_ptr<OffsetAllocator> allocator;
    uint32_t tenant = kNoTenant;
    HandleKind kind = HandleKind::kMemfd;
    bool dedicated = false;
    bool reserved = false;
    bool retained = false;  // released: not carvable, kept for its holders
    absl::Time empty_since = absl::InfinitePast();
    absl::flat_hash_set<uint64_t> holders;  // sessions given its handle
  };
  using Graveyard = std::vector<std::shared_ptr<Slab>>;

  // ExportSlab and IpcHandle: records `session` as given the slab's handle,
  // runs `give` on the slab outside the lock, and undoes the record if it
  // fails. `what` names the operation in errors.
  CarveResult CarveIn(uint64_t size, uint64_t alignment, uint32_t tenant, HandleKind kind,
                      bool may_call_backend);
  template <typename T>
  absl::StatusOr<T> GiveHandle(uint64_t slab_id, uint32_t tenant, uint64_t session,
                               const char* what,
                               absl::StatusOr<T> (*give)(const Slab& slab));

  SlabEntry* FindLocked(uint64_t slab_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a slab the backend made, owned by `tenant`; counts it.
  std::pair<uint64_t, SlabEntry*> AddSlabLocked(uint64_t id, std::unique_ptr<Slab> slab,
                                                HandleKind kind, uint32_t tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new slab's id, told to the keeper (outside the lock: it may export
  // the handle) before the slab joins the pool.
  uint64_t MadeSlab(const Slab& slab, HandleKind kind, uint32_t tenant, bool dedicated,
                    bool reserved);
  SlabFacts FactsLocked(uint64_t id, const SlabEntry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A backend failure, naming the device and what the pool was doing.
  absl::Status BackendError(const absl::Status& s, absl::string_view doing,
                            uint64_t bytes) const;
  // Takes a block out of `e` if it fits; counts it.
  bool TakeLocked(uint64_t id, SlabEntry& e, uint64_t size, uint64_t alignment,
                  bool new_slab, PoolBlock* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases an empty slab: retained if it has holders, else to `dead`.
  void ReleaseSlabLocked(std::map<uint64_t, SlabEntry>::iterator it,
                         Graveyard* dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropHolderLocked(uint64_t slab_id, uint64_t session, Graveyard* dead)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty, not retained and held by nobody: may go back to the device.
  static bool Releasable(const SlabEntry& e);
  // Bytes of releasable slabs (of any tenant).
  uint64_t ReleasableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Refusal RefuseLocked(uint64_t size, uint64_t alignment, uint32_t tenant) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t LargestCarvableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t RoundUp(uint64_t v) const;
  // The size of a new (not dedicated) slab for `tenant` holding a block of
  // `need` bytes (rounded), before the budget and the device cut it down.
  uint64_t GrownSlabSizeLocked(uint32_t tenant, uint64_t need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The budget's room for `tenant` (UINT64_MAX without a budget).
  uint64_t BudgetRoomLocked(uint32_t tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes of `tenant`'s own releasable slabs.
  uint64_t OwnReleasableLocked(uint32_t tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A slab of `bytes` becomes (or stops being) one of `tenant`'s carvable
  // slabs; Disown does not give the budget back (a retained slab still
  // counts): GiveBudgetLocked does, when the slab leaves.
  void OwnLocked(uint32_t tenant, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DisownLocked(uint32_t tenant, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GiveBudgetLocked(uint32_t tenant, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t RoundDown(uint64_t v) const { return v - v % options_.granularity; }
  // Capacity for new slabs: by total_bytes alone, and within the backend's
  // NewSlabRoom too.
  uint64_t UnpooledByTotalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t UnpooledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What is free on the device (PoolStats::free_bytes), the one rule: room
  // for new slabs (`unpooled`: UnpooledLocked unless given) plus releasable
  // slabs, rounded down to the granularity.
  uint64_t FreeBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t FreeBytesLocked(uint64_t unpooled) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same on `tenant`'s budget: its room plus its own releasable slabs,
  // rounded down (without a budget, no bound).
  uint64_t BudgetFreeLocked(uint32_t tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend* const backend_;
  const uint32_t device_;
  PoolOptions options_;
  const uint64_t total_bytes_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, SlabEntry> slabs_ ABSL_GUARDED_BY(mu_);  // oldest first
  SlabKeeper* keeper_ = nullptr;  // set before use, then read only
  SlabBudget* budget_ = nullptr;  // set before use, then read only
  // Capacity promised to slabs being created outside the lock.
  uint64_t creating_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Adopted slabs whose handle has not come back: held, not in the backend.
  uint64_t awaiting_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;    // carvable slabs
  uint64_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // retained slabs
  absl::flat_hash_map<uint32_t, TenantPoolStats> tenants_ ABSL_GUARDED_BY(mu_);
  // Tenants gone for good (ReleaseTenantSlabs): their slabs go back once empty.
  absl::flat_hash_set<uint32_t> gone_ ABSL_GUARDED_BY(mu_);
  // session -> slabs whose handle it was given (carvable or retained).
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> exports_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_SLAB_POOL_H_
