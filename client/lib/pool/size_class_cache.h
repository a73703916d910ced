// SizeClassCache: which block serves a request. A request up to max_request
// bytes is rounded up to its size class (size_classes.h) and carved, with
// the project's OffsetAllocator, out of one of its arena's leases: blocks of
// lease_bytes taken from the LeaseSource (its upstream) when no lease has
// room. Larger requests, and any request when the daemon has no room for a
// whole lease, pass upstream as whole blocks. A lease with no block out
// goes back when ReleaseEmpty says so (GiveBack drives it).
//
// Invariants: a block comes only from a lease of the request's arena; a
// lease is given back only with no block out (live, cached above or
// waiting in the free queue); the daemon is told the leased and in-use
// bytes with every lease taken or given back; a lease lost at a daemon
// restart is never carved again, stays mapped while the program holds a
// block of it, and is then abandoned with its addresses reserved.
// Thread-safe; mu_ is held across the daemon call that takes or gives back
// a lease (one at a time), and before whatever `parked_bytes` takes.
#ifndef GPUMEMD_CLIENT_LIB_POOL_SIZE_CLASS_CACHE_H_
#define GPUMEMD_CLIENT_LIB_POOL_SIZE_CLASS_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/lib/pool/block_resource.h"
#include "client/lib/pool/lease.h"
#include "client/lib/pool/lease_source.h"
#include "client/lib/pool/lease_table.h"
#include "client/lib/pool/lost_blocks.h"

namespace gpumem {
namespace client {

class SizeClassCache final : public BlockResource {
 public:
  struct Options {
    uint64_t lease_bytes = 64ull << 20;  // >= 64 KiB, a multiple of 256
    uint64_t max_request = 16ull << 20;  // <= lease_bytes
    // Bytes of carved blocks parked above this layer (thread caches): not
    // in use, though not returned either. Called with mu_ held.
    std::function<uint64_t()> parked_bytes;
  };

  // `source` and `lost` must outlive the cache.
  SizeClassCache(LeaseSource* source, LostBlocks* lost, Options options);
  ~SizeClassCache() override;  // gives every lease back (lost ones are abandoned)
  SizeClassCache(const SizeClassCache&) = delete;
  SizeClassCache& operator=(const SizeClassCache&) = delete;

  absl::StatusOr<Block> Allocate(uint64_t size, const Arena& arena) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // A block of a lost lease answers GPUMEM_E_LOST (it is not reused).
  absl::Status Free(Block block, const ReuseAfter& after) override ABSL_LOCKS_EXCLUDED(mu_);

  // The current lease holding `p`, or null. Any thread, no lock.
  Lease* FindLease(uintptr_t p) const { return table_.Find(p); }

  // Gives back every lease that has had no block out for `min_idle`.
  // Bytes given back.
  uint64_t ReleaseEmpty(absl::Duration min_idle) ABSL_LOCKS_EXCLUDED(mu_);

  // Daemon restarts. MarkLost: the leases among `ids` are lost (false if
  // none was). ForgetCached: `blocks`, cached above and dropped there since
  // their leases are lost, are not coming back; lost leases with no block
  // out are then abandoned.
  bool MarkLost(const absl::flat_hash_set<uint64_t>& ids) ABSL_LOCKS_EXCLUDED(mu_);
  void ForgetCached(const std::vector<Block>& blocks) ABSL_LOCKS_EXCLUDED(mu_);
  // The program frees `p` in a lost lease (false if `p` is in none).
  bool FreeLost(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);
  bool InLostLease(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);

  struct Figures {
    uint64_t leases = 0, leased_bytes = 0;
    // Bytes of class blocks carved and not returned (blocks of leases lost
    // at a restart stay counted once the program frees them).
    uint64_t carved_bytes = 0;
    uint64_t lost_bytes = 0;  // leases lost at restarts, ever
    struct Row {
      int device;
      uint64_t bytes, used_bytes, blocks_out;
    };
    std::vector<Row> rows;  // one per current lease
  };
  Figures Stats() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Carves a `cls` block for `arena`, taking a lease if none has room.
  // *no_lease: the daemon had no room for a whole lease (ResourceExhausted).
  absl::StatusOr<Block> CarveLocked(uint32_t cls, const Arena& arena, bool* no_lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Lease*> TakeLeaseLocked(uint64_t first_block, const Arena& arena)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnLocked(Lease* lease, const Block& block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LostBlockBackLocked(Lease* lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbandonLocked(Lease* lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool's figures for the daemon, with a lease about to be taken or
  // given back counted in.
  v1::UsageReport UsageLocked(int64_t leased_delta, int64_t in_use_delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  LeaseSource* const source_;
  LostBlocks* const lost_;
  const Options options_;
  LeaseTable table_;  // published under mu_

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Lease>> all_ ABSL_GUARDED_BY(mu_);    // every lease ever taken
  std::vector<std::vector<Lease*>> by_arena_ ABSL_GUARDED_BY(mu_);  // current, by Arena::index
  std::vector<Lease*> lost_leases_ ABSL_GUARDED_BY(mu_);  // lost, still held by the program
  uint64_t carved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lost_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_SIZE_CLASS_CACHE_H_
