// LostBlocks: what the client library reported lost at daemon restarts
// (Client::OnRestart: a daemon that kept nothing, or stopped for good), for
// the pool's layers: the ids of lost blocks until the pool has applied them,
// and the address ranges lost blocks held. Most restarts lose nothing: the
// library carries every block over and the pool carries on as it was.
//
// Invariants: an id is handed out by TakeIds() once; a reserved range stays
// reserved (Reserved() true) for the pool's life, because the mapper keeps
// those addresses from being handed out again (Buffer::Abandon) and a stale
// pointer into them must answer GPUMEM_E_LOST. Thread-safe; Report() takes
// only this object's own lock, so the library's thread never waits for a
// pool call.
#ifndef GPUMEMD_CLIENT_LIB_POOL_LOST_BLOCKS_H_
#define GPUMEMD_CLIENT_LIB_POOL_LOST_BLOCKS_H_

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/cpp/client.h"

namespace gpumem {
namespace client {

class LostBlocks {
 public:
  // Records a restart report's lost blocks; false if it lost none.
  bool Report(const Client::RestartReport& report) ABSL_LOCKS_EXCLUDED(mu_);
  // Lost ids not taken yet (cheap: the hot path asks on every call).
  bool pending() const { return pending_.load(std::memory_order_relaxed); }
  absl::flat_hash_set<uint64_t> TakeIds() ABSL_LOCKS_EXCLUDED(mu_);

  void Reserve(uintptr_t begin, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  bool Reserved(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<bool> pending_{false};
  absl::Mutex mu_;
  absl::flat_hash_set<uint64_t> ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uintptr_t, uint64_t>> ranges_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_LOST_BLOCKS_H_
