// DaemonCounters: what the daemon has done since it started, for GetStats'
// DaemonCounters (a rate is the difference of two answers over the time
// between them; `gpumemctl top` shows them per second).
//
// Guarantees:
//  - allocations counts blocks handed out (a sharded request one per shard),
//    frees blocks returned (Free, a session ending, a lease given back);
//    both only ever grow.
//  - Each refused Allocate request is counted once, under the reason
//    RefusalKindOf (common/refusal_payload.h) gives its final status: the
//    same rule that labels gpumemd_allocation_refusals_total.
//  - Waiting requests are counted per tenant between RecordWaitStart and
//    RecordWaitEnd (calls paired by the caller); the daemon-wide figure is
//    their sum, so the two never disagree in one Fill.
//  - uptime counts from construction (the broker is made as the daemon
//    starts serving).
// Thread-safe: the totals are relaxed atomics (each exact, read together
// without a lock, so two of them may be a few events apart in one answer);
// the waiting map has its own leaf lock.
#ifndef GPUMEMD_SERVER_SERVICE_DAEMON_COUNTERS_H_
#define GPUMEMD_SERVER_SERVICE_DAEMON_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

class DaemonCounters {
 public:
  DaemonCounters() : start_(absl::Now()) {}
  DaemonCounters(const DaemonCounters&) = delete;
  DaemonCounters& operator=(const DaemonCounters&) = delete;

  void RecordAllocations(uint64_t blocks) { allocations_.fetch_add(blocks, kRelaxed); }
  void RecordFrees(uint64_t blocks) { frees_.fetch_add(blocks, kRelaxed); }
  // An Allocate request answered with `status` (not OK).
  void RecordRefusal(const absl::Status& status);

  void RecordWaitStart(uint32_t tenant);
  void RecordWaitEnd(uint32_t tenant);
  // Requests of `tenant` waiting now.
  uint32_t WaitingOf(uint32_t tenant) const;
  // The tenants with a request waiting now.
  std::vector<uint32_t> WaitingTenants() const;

  void Fill(v1::DaemonCounters* out) const;

 private:
  static constexpr std::memory_order kRelaxed = std::memory_order_relaxed;
  const absl::Time start_;
  std::atomic<uint64_t> allocations_{0};
  std::atomic<uint64_t> frees_{0};
  std::atomic<uint64_t> refused_capacity_{0};
  std::atomic<uint64_t> refused_fragmentation_{0};
  std::atomic<uint64_t> refused_quota_{0};
  std::atomic<uint64_t> refused_other_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, uint32_t> waiting_ ABSL_GUARDED_BY(mu_);  // tenant -> n > 0
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_DAEMON_COUNTERS_H_
