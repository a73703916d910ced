// LeaseSource: where the pool's memory comes from: the daemon, over one
// Client (this process's session). The bottom of the stack
// (block_resource.h): a request no layer above serves becomes one daemon
// allocation handed to the program whole (a "whole block"), and
// SizeClassCache takes its leases here, telling the daemon the pool's
// figures (UsageReport) with every lease taken or given back.
//
// Invariants: a whole block is in exactly one place: this source's table
// while the program holds it, the Block on its way back after a free, or
// given back; a whole block lost at a daemon restart is never freed at the
// daemon and its addresses stay reserved (LostBlocks). Thread-safe; mu_ is
// never held across a call to the daemon.
#ifndef GPUMEMD_CLIENT_LIB_POOL_LEASE_SOURCE_H_
#define GPUMEMD_CLIENT_LIB_POOL_LEASE_SOURCE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/cpp/client.h"
#include "client/lib/pool/block_resource.h"
#include "client/lib/pool/lost_blocks.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

// One shard of a sharded allocation.
struct Shard {
  void* ptr;
  uint64_t size;
  int device;
};

class LeaseSource final : public BlockResource {
 public:
  // Connects (UNAVAILABLE when no daemon answers at `socket_path`). `lost`
  // must outlive the source.
  static absl::StatusOr<std::unique_ptr<LeaseSource>> Connect(const std::string& socket_path,
                                                              LostBlocks* lost);
  ~LeaseSource() override;  // Close()
  LeaseSource(const LeaseSource&) = delete;
  LeaseSource& operator=(const LeaseSource&) = delete;

  // The daemon connection, for calls the pool does not make itself.
  Client& daemon() { return *client_; }

  // A lease of `bytes` at `alignment`, `usage` being the pool's figures with
  // it counted; the caller owns (and carves) it.
  absl::StatusOr<Buffer> TakeLease(uint64_t bytes, const Arena& arena, uint64_t alignment,
                                   const v1::UsageReport& usage);
  // Gives a lease back (`usage`: the figures without it). A daemon that is
  // gone reclaims it itself, so its answer is not waited on.
  void GiveBack(Buffer lease, const v1::UsageReport& usage);
  // Tells the daemon how many bytes a reclaim request got back.
  void ReportReclaimed(uint64_t bytes);

  // Whole blocks.
  absl::StatusOr<Block> Allocate(uint64_t size, const Arena& arena) override;
  // Frees `block.whole` at the daemon (its answer).
  absl::Status Free(Block block, const ReuseAfter& after) override;
  // One whole block per shard, on distinct devices; all or nothing.
  absl::StatusOr<std::vector<Shard>> AllocateSharded(uint64_t total, uint32_t shards,
                                                     const v1::PlacementRequest& placement);
  // Takes the whole block at `p` out of the table (it is being freed); null
  // if there is none.
  std::unique_ptr<Buffer> TakeWhole(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);
  struct WholeInfo {
    uint64_t id;  // the daemon's allocation id
    int device;   // the daemon's index
    bool on_device;
    std::string uuid;
    uint64_t size = 0;
  };
  std::optional<WholeInfo> FindWhole(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);

  // Daemon restarts: the whole blocks among `ids` are lost.
  void MarkLost(const absl::flat_hash_set<uint64_t>& ids) ABSL_LOCKS_EXCLUDED(mu_);
  // The program frees a lost whole block at `p`: it is abandoned, its
  // addresses reserved. False if `p` is not one.
  bool FreeLost(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);
  bool IsLost(uintptr_t p) ABSL_LOCKS_EXCLUDED(mu_);

  struct Figures {
    uint64_t blocks = 0, bytes = 0;  // whole blocks the program holds
    std::map<uint32_t, uint64_t> bytes_by_device;  // the same, by daemon device
    uint64_t lost_bytes = 0;         // whole blocks lost at restarts, ever
  };
  Figures Stats() ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every whole block (lost ones are abandoned) and disconnects; the
  // client's threads have ended when it returns.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LeaseSource(std::unique_ptr<Client> client, LostBlocks* lost)
      : client_(std::move(client)), lost_(lost) {}

  std::unique_ptr<Client> client_;  // null once closed
  LostBlocks* const lost_;

  absl::Mutex mu_;
  absl::flat_hash_map<uintptr_t, std::unique_ptr<Buffer>> wholes_ ABSL_GUARDED_BY(mu_);
  // Lost whole blocks the program still holds: mapped until it frees them.
  absl::flat_hash_map<uintptr_t, std::unique_ptr<Buffer>> lost_wholes_ ABSL_GUARDED_BY(mu_);
  uint64_t lost_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_LEASE_SOURCE_H_
