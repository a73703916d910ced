// Restorer: a restart that loses nothing. It takes back what a previous
// daemon kept (its sessions whose processes still run, its slabs with their
// handles from systemd's fd store or waiting for a client to give one back,
// every allocation of those in its exact place and charge, with its id)
// before anything is served, then owns the restore window: the grace time,
// the allocations no client has claimed yet, and the answers to Resume, to
// handles given back and to a retried Allocate.
//
// It drives narrow adopt calls on the rooms that own the state (sessions,
// device pools, the allocation table) and keeps only the window's own
// books. Invariants: nothing is taken on trust beyond what the records and
// the handles prove; anything that does not fit is closed, saying why; a
// restored allocation is claimed at most once (Resume or RetakeByKey), and
// those none claims within the grace time are freed then. Thread-safe; its
// owner (the broker) calls it inside its call gate, and never while holding
// a lock of the rooms.
#ifndef GPUMEMD_SERVER_RESTART_RESTORER_H_
#define GPUMEMD_SERVER_RESTART_RESTORER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/backend.h"
#include "server/allocations/allocation_table.h"
#include "server/ledger/ledger_event.h"
#include "server/pool/device_pools.h"
#include "server/quota/quota_book.h"
#include "server/session/admin_group.h"
#include "server/session/session_registry.h"
#include "server/session/session_tenants.h"
#include "server/state/durable_state.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {

// What a restore did.
struct RestoreOutcome {
  size_t sessions = 0, sessions_gone = 0;
  size_t slabs = 0, slabs_awaiting_handle = 0, slabs_dropped = 0;
  size_t allocations = 0, allocations_closed = 0;
  std::vector<uint64_t> dropped_slabs;  // their records (and stored fds) go
  std::vector<std::pair<uint64_t, uint64_t>> dropped_holders;  // (slab, session)
  std::vector<uint64_t> refused_handles;  // kept handles the backend refused
  // For the ledger (TenantLedger::Resume): the allocations that survived,
  // as ALLOCATE events at their own time, and why the others were closed.
  std::vector<ledger::LedgerEvent> survivors;
  std::map<uint64_t, std::string> closed;
  std::vector<std::string> notes;  // what was dropped and why, a line each
  std::string Summary() const;
};

class Restorer {
 public:
  // The rooms it drives; each must outlive it. `quotas` and `state` may be
  // null. `give_back` returns records taken out of the table (their blocks
  // to their pools, their charges to their quotas).
  struct Rooms {
    Backend* backend = nullptr;
    DevicePools* pools = nullptr;
    SessionRegistry* sessions = nullptr;
    SessionTenants* session_tenants = nullptr;
    const AdminGroup* admins = nullptr;
    AllocationTable* table = nullptr;
    const tenants::TenantDirectoryHolder* directory = nullptr;
    quota::QuotaBook* quotas = nullptr;
    state::DurableState* state = nullptr;
    std::function<void(const std::vector<AllocationRecord>&)> give_back;
  };
  // `grace`: how long after a restore clients have to come back (claim
  // their allocations, rebind a connection-bound session, give back a
  // slab's handle).
  Restorer(Rooms rooms, absl::Duration grace);
  Restorer(const Restorer&) = delete;
  Restorer& operator=(const Restorer&) = delete;

  // Once, before serving: takes back what `previous` recorded, with the
  // slab handles of `slab_fds` (taken: each is adopted or closed), and
  // starts the grace time.
  RestoreOutcome Restore(const state::Snapshot& previous, std::map<uint64_t, int> slab_fds);

  // A client re-presents what it held (proto ResumeRequest): each claim is
  // kept if it is the caller's session's and just where the daemon has it,
  // or lost saying why; the answer names the slabs whose handle the client
  // should give back. Costs one table lookup per claim.
  absl::StatusOr<v1::ResumeResponse> Resume(const PeerCred& caller,
                                            const v1::ResumeRequest& request);
  // A client gives back the handle of a slab waiting for it (`fd` taken).
  // Accepted only from a session of the slab's tenant that the last daemon
  // gave the slab's handle to, and only if it is that slab's handle
  // (Backend::AdoptSlab checks).
  absl::Status AcceptSlabHandle(const PeerCred& caller, uint64_t slab_id, int fd);
  // A client of a restored connection-bound session binds its new slab
  // channel to it with the session's token.
  absl::StatusOr<std::shared_ptr<Session>> RebindConnection(const PeerCred& caller,
                                                            absl::string_view token);
  // An Allocate retried with the request_key of one the previous daemon
  // carried out but whose answer was lost: the restored allocations of
  // `session` it made, not claimed yet and just as the retry asks (one per
  // size of `sizes`, each charged that size, of `kind`, at `alignment`), are
  // claimed and returned, charged nothing more; nullopt (nothing changed)
  // when there are none or they do not match.
  std::optional<std::vector<std::pair<uint64_t, AllocationRecord>>> RetakeByKey(
      const Session& session, uint64_t request_key, const std::vector<uint64_t>& sizes,
      HandleKind kind, uint64_t alignment);

  // Allocations of the previous daemon's that this one did not keep: closed
  // by the restore (their session or slab gone, their range not free) or at
  // the grace time's end (their slab's handle or their claim never came
  // back). Read without a lock.
  uint64_t LostAllocations() const { return lost_.load(std::memory_order_relaxed); }

  // The name of a restored tenant the directory no longer has (restored
  // under an id of its own), if `id` is one.
  std::optional<std::string> RestoredTenantName(uint32_t id) const;

  // The end of the grace time, in three steps its owner runs in order:
  // GraceOver is true once, the first time it is called at or after the
  // deadline; then the blocks of slabs whose handle did not come back are
  // closed and the slabs dropped; then connection-bound sessions nobody
  // rebound end (each end calls back into the owner: call it holding
  // nothing); then the allocations no client claimed are freed.
  bool GraceOver(absl::Time now);
  void CloseSlabsWithoutHandle();
  void EndUnboundSessions();
  void FreeUnclaimed();

 private:
  // A slab adopted without its handle: its device and the allocations
  // restored in it (no other block can be carved from it).
  struct AwaitingSlab {
    uint32_t device = 0;
    std::vector<uint64_t> allocations;
  };

  // Restore's steps, in dependency order, over one Pass (restorer.cc).
  struct Pass;
  void RestoreSessions(Pass& pass);
  void RestoreSlabs(Pass& pass, std::map<uint64_t, int> slab_fds);
  void RestoreAllocations(Pass& pass);
  void RestoreHolders(Pass& pass);
  // The tenant a record names, as the directory in force numbers it now.
  std::optional<tenants::TenantRef> TenantNamed(Pass& pass, const std::string& name);

  const Rooms rooms_;
  const absl::Duration grace_;
  std::atomic<uint64_t> lost_{0};

  mutable absl::Mutex mu_;
  // Restored tenants the directory no longer has, by the ids given here.
  absl::flat_hash_map<uint32_t, std::string> restored_names_ ABSL_GUARDED_BY(mu_);
  // Whether restored_names_ is non-empty: read without mu_ (tenants are
  // named for every ledger event).
  std::atomic<bool> any_restored_names_{false};
  // Why each allocation the restore closed was closed.
  std::map<uint64_t, std::string> closed_ ABSL_GUARDED_BY(mu_);
  // The session each closed allocation was of: only it (or an admin) is
  // told why; anyone else hears "no such allocation".
  std::map<uint64_t, uint64_t> closed_session_ ABSL_GUARDED_BY(mu_);
  // The restored allocations of each session not yet claimed.
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> unconfirmed_
      ABSL_GUARDED_BY(mu_);
  // Restored allocations with a request_key, by (session, key), ids in
  // increasing order (a sharded request's shards in shard order): what a
  // retried Allocate may claim while they are unconfirmed.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>> restored_keys_
      ABSL_GUARDED_BY(mu_);
  // Whether restored_keys_ may be non-empty: read without mu_, so that an
  // Allocate (which always carries a key from the client library) takes
  // that lock only while a restore's keys are still unclaimed.
  std::atomic<bool> any_restored_keys_{false};
  // Slabs adopted without their handle and not given back through
  // AcceptSlabHandle (the pool says whether each still waits), by slab id.
  absl::flat_hash_map<uint64_t, AwaitingSlab> awaiting_ ABSL_GUARDED_BY(mu_);
  // The slabs of awaiting_ each session was given the handle of.
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> awaiting_held_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_RESTART_RESTORER_H_
