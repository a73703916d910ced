// TenantMemInfo: what a framework should be told is free and total on one
// device under gpumemd (torch.cuda.mem_get_info(), gpumem_mem_get_info()):
// not the whole GPU, but what the caller's tenant may still take. So code
// that sizes a cache as "total * utilization - (total - free)", as vLLM
// does, sizes it to the tenant's budget, not to the GPU.
#ifndef GPUMEMD_CLIENT_LIB_TENANT_BUDGET_H_
#define GPUMEMD_CLIENT_LIB_TENANT_BUDGET_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "client/lib/pool/caching_pool.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

struct MemInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

//   total = min(device total, the tenant's total_bytes quota, its quota on
//               this device)
//   free  = min(device free_bytes, total quota headroom, device quota
//               headroom) + this process's idle lease bytes on the device,
//           at most total
// where headroom is the limit minus what the quota counts: the tenant's
// charged bytes (GetUsage, exact now) plus its retained bytes (GetStats).
// Idle lease bytes are memory this process holds already in its caching
// pool and can hand out without asking (they are charged, so the headroom
// does not count them). A tenant without a quota gets the device's figures.
// From the daemon's answers; `session` says whose tenant (tenant,
// tenant_name). INVALID_ARGUMENT for a device the daemon does not have.
absl::StatusOr<MemInfo> TenantMemInfo(const v1::GetStatsResponse& stats,
                                      const v1::GetUsageResponse& usage,
                                      const v1::Session& session, uint32_t device,
                                      uint64_t own_idle_bytes);

// The same for `pool`'s tenant, asking the daemon (GetSession, GetUsage,
// GetStats) and reading the pool's own leases.
absl::StatusOr<MemInfo> PoolMemInfo(CachingPool* pool, uint32_t device);

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_TENANT_BUDGET_H_
