// Arena: a placement request as the pool serves it. Every block comes from
// one arena's leases, so memory comes only from devices its placement allows.
//
// Invariants: an ArenaTable holds one arena per distinct placement (compared
// by deterministic serialization); an arena never changes and lives as long
// as its table; `id` is unique in the process (thread caches key on it) and
// `index` is dense within one table (layers index their arrays with it).
#ifndef GPUMEMD_CLIENT_LIB_POOL_ARENA_H_
#define GPUMEMD_CLIENT_LIB_POOL_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

struct Arena {
  uint64_t id = 0;
  uint32_t index = 0;
  v1::PlacementRequest placement;
};

class ArenaTable {
 public:
  ArenaTable() = default;
  ArenaTable(const ArenaTable&) = delete;
  ArenaTable& operator=(const ArenaTable&) = delete;

  // The arena of `placement`, made on first use. Thread-safe.
  Arena* For(const v1::PlacementRequest& placement) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Arena>> arenas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Arena*> by_key_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_ARENA_H_
