// SlabKeeper: where a SlabPool keeps what a restart needs of its slabs, so
// that slabs and the blocks in them outlive the daemon: a durable record of
// each slab and of each session given its handle, and the handle itself,
// somewhere that outlives the process (systemd's fd store). An adaptor on
// the pool, like the quota carver on placement: the pool says what happened,
// the keeper decides where it is kept (server/restart/ implements it). A
// pool without a keeper keeps nothing, and its slabs die with the daemon.
//
// Called under the pool's lock: implementations must be quick and must not
// call back into the pool.
#ifndef GPUMEMD_SERVER_POOL_SLAB_KEEPER_H_
#define GPUMEMD_SERVER_POOL_SLAB_KEEPER_H_

#include <cstdint>

#include "server/backend/backend.h"

namespace gpumem {

// What a pool knows of one slab.
struct SlabFacts {
  uint64_t slab_id = 0;
  uint32_t device = 0;
  uint64_t size = 0;
  uint32_t tenant = 0;  // kNoTenant for an unclaimed reserved slab
  HandleKind kind = HandleKind::kMemfd;
  bool dedicated = false;
  bool reserved = false;
  bool retained = false;
  SlabIdentity identity;  // of its handle (Slab::Identity()), where known
};

class SlabKeeper {
 public:
  virtual ~SlabKeeper() = default;
  // A new slab (`slab` is its handle, to be kept where it outlives the
  // daemon), or a slab taken back after a restart (`slab` null when its
  // handle is kept already).
  virtual void SlabMade(const SlabFacts& facts, const Slab* slab) = 0;
  // A slab's facts changed (claimed by a tenant, retained).
  virtual void SlabChanged(const SlabFacts& facts) = 0;
  // A slab goes back to the backend: nothing of it is kept any more.
  virtual void SlabGone(uint64_t slab_id) = 0;
  // A session was given a slab's handle, or let it go.
  virtual void HolderAdded(uint64_t slab_id, uint64_t session) = 0;
  virtual void HolderGone(uint64_t slab_id, uint64_t session) = 0;
  // From now on nothing changes what is kept (a daemon stopping for a
  // restart leaves it to the next one).
  virtual void Freeze() {}
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_SLAB_KEEPER_H_
