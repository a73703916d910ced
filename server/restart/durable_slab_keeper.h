// DurableSlabKeeper: the SlabKeeper (server/pool/slab_keeper.h) that makes
// slabs outlive the daemon: each slab's record, and the records of who holds
// its handle, go to the DurableState file (server/state/), and its handle to
// systemd's fd store (server/systemd/fd_store.h) as "gpumemd-slab-<id>".
//
// Without an fd store (outside systemd, or a store that refuses) a slab's
// record is kept all the same: after a restart the slab waits for a client
// that has it open to give its handle back.
//
// Freeze() makes every call a no-op from then on: a daemon stopping for a
// restart leaves what it kept to the next one.
// Thread-safe.
#ifndef GPUMEMD_SERVER_RESTART_DURABLE_SLAB_KEEPER_H_
#define GPUMEMD_SERVER_RESTART_DURABLE_SLAB_KEEPER_H_

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/pool/slab_keeper.h"
#include "server/state/durable_state.h"
#include "server/systemd/fd_store.h"

namespace gpumem {

// "gpumemd-slab-<id>", and back (nullopt: not such a name).
std::string SlabFdName(uint64_t slab_id);
std::optional<uint64_t> SlabIdOfFdName(const std::string& name);

class DurableSlabKeeper final : public SlabKeeper {
 public:
  // `fds` may be null (no fd store); `tenant_name` names tenant ids in
  // records. All must outlive the keeper.
  DurableSlabKeeper(state::DurableState* state, FdStore* fds,
                    std::function<std::string(uint32_t tenant)> tenant_name);

  void SlabMade(const SlabFacts& facts, const Slab* slab) override;
  void SlabChanged(const SlabFacts& facts) override;
  void SlabGone(uint64_t slab_id) override;
  void HolderAdded(uint64_t slab_id, uint64_t session) override;
  void HolderGone(uint64_t slab_id, uint64_t session) override;

  // A restart: records a previous daemon made, kept as they are; and that
  // slab `slab_id`'s handle is in the fd store already.
  void AdoptSlabRecord(const state::SlabRecord& record, bool handle_stored);
  void AdoptHolderRecord(const state::HolderRecord& record);

  void Freeze() override { frozen_.store(true); }

 private:
  void Record(const SlabFacts& facts, const SlabIdentity& identity)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  state::DurableState* const state_;
  FdStore* const fds_;
  const std::function<std::string(uint32_t)> tenant_name_;
  std::atomic<bool> frozen_{false};
  absl::Mutex mu_;
  struct Kept {
    uint32_t slot = state::kNoSlot;
    SlabIdentity identity;
    bool stored = false;  // its handle is in the fd store
  };
  absl::flat_hash_map<uint64_t, Kept> slabs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint32_t> holders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_RESTART_DURABLE_SLAB_KEEPER_H_
