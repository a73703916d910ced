// DaemonCounters: what the core has done since it started, counted with
// relaxed atomics (one increment per event, no lock), for GetStats'
// DaemonCounters and the rates `gpumemctl top` shows.
//
// Blocks handed out count one per shard; blocks returned count Frees,
// session ends and shutdown alike. A refused Allocate counts once, with its
// final answer (one that waited counts when its wait ends; a drain's or
// shutdown's UNAVAILABLE / FAILED_PRECONDITION too), under
// common/refusal_payload.h's RefusalReasonOf (the rule the Prometheus
// refusal label uses too). Waiting requests are not counted here: they are
// admission's (server/admission/), and MemoryBroker::Stats fills
// CounterView::waiting_requests from its per-tenant figures.
#ifndef GPUMEMD_SERVER_CORE_DAEMON_COUNTERS_H_
#define GPUMEMD_SERVER_CORE_DAEMON_COUNTERS_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/refusal_payload.h"
#include "server/core/stats_view.h"

namespace gpumem {

class DaemonCounters {
 public:
  void Allocated(uint64_t blocks) { allocations_.fetch_add(blocks, std::memory_order_relaxed); }
  void Returned(uint64_t blocks) { frees_.fetch_add(blocks, std::memory_order_relaxed); }
  void Refused(const absl::Status& status) {
    refused_[static_cast<int>(RefusalReasonOf(status))].fetch_add(1, std::memory_order_relaxed);
  }

  CounterView View() const {
    CounterView v;
    v.allocations = allocations_.load(std::memory_order_relaxed);
    v.frees = frees_.load(std::memory_order_relaxed);
    v.refused_capacity = Load(RefusalReason::kCapacity);
    v.refused_fragmentation = Load(RefusalReason::kFragmentation);
    v.refused_quota = Load(RefusalReason::kQuota);
    v.refused_other = Load(RefusalReason::kOther);
    v.uptime_seconds = absl::ToDoubleSeconds(absl::Now() - started_);
    return v;
  }

 private:
  uint64_t Load(RefusalReason r) const {
    return refused_[static_cast<int>(r)].load(std::memory_order_relaxed);
  }
  const absl::Time started_ = absl::Now();
  std::atomic<uint64_t> allocations_{0};
  std::atomic<uint64_t> frees_{0};
  std::atomic<uint64_t> refused_[4] = {};
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CORE_DAEMON_COUNTERS_H_
