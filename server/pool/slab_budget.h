// SlabBudget: how many bytes of slabs a tenant may have taken for it on a
// device, asked by the pool before it makes or claims a slab for the tenant.
// A slab belongs to one tenant for life (slab_pool.h), so the bytes a tenant
// pins on a device are its slabs' bytes (carvable, retained, and being
// made), not only its live blocks; a budget bounds those.
//
// Invariants: a tenant passes its limits by less than one `slack` (the
// pool's granularity: a 256-byte block needs a whole granule) per device,
// never more, but for what Take records. Implementations are called under
// the pool's lock: they must be quick and never call back into any pool.
// server/quota/footprint_book.h is the one the daemon uses (a tenant's
// quota is its budget).
#ifndef GPUMEMD_SERVER_POOL_SLAB_BUDGET_H_
#define GPUMEMD_SERVER_POOL_SLAB_BUDGET_H_

#include <cstdint>
#include <string>

namespace gpumem {

class SlabBudget {
 public:
  virtual ~SlabBudget() = default;

  // The most bytes of new slab `tenant` may take on `device` now
  // (UINT64_MAX: no limit): asked before the pool sizes a new slab.
  virtual uint64_t Room(uint32_t tenant, uint32_t device, uint64_t slack) const = 0;
  // Takes `bytes` for a new slab if they fit in Room, atomically with the
  // check, before the backend is asked for them; otherwise false and *why
  // says which limit refused, with the figures.
  virtual bool TryTake(uint32_t tenant, uint32_t device, uint64_t bytes, uint64_t slack,
                       std::string* why) = 0;
  // Takes `bytes` whatever the limits say (a restart adopting a slab a
  // previous daemon had made).
  virtual void Take(uint32_t tenant, uint32_t device, uint64_t bytes) = 0;
  // A slab of `bytes` left the device for good (or was never made).
  virtual void Give(uint32_t tenant, uint32_t device, uint64_t bytes) = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_POOL_SLAB_BUDGET_H_
