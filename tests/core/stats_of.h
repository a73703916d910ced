// StatsOf: what GetStats would answer a caller of a MemoryBroker in a test
// (the core's view, rendered as the service renders it), without the
// counters of what was done so far: the state, for before/after compares.
#ifndef GPUMEMD_TESTS_CORE_STATS_OF_H_
#define GPUMEMD_TESTS_CORE_STATS_OF_H_

#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/core/memory_broker.h"
#include "server/service/stats_proto.h"

namespace gpumem {

inline v1::GetStatsResponse StatsOf(const MemoryBroker& broker, const PeerCred& caller,
                                    bool include_slabs = false) {
  v1::GetStatsResponse s = RenderStats(broker.Stats(caller, include_slabs));
  s.clear_counters();
  return s;
}

}  // namespace gpumem

#endif  // GPUMEMD_TESTS_CORE_STATS_OF_H_
