// FreeQueue: when a freed block is safe to reuse. A GPU runs work later than
// the host queues it, and PyTorch frees a tensor as soon as the last kernel
// that uses it is queued, so freed device memory waits here until a fence
// taken at the free (free_fences.h) has passed; then it goes upstream. Host
// memory (memfd, the sim backend) passes upstream at once.
//
// A block freed on a stream that is capturing a CUDA graph is held until
// the graph and its executables are gone (FenceSource::HoldForCapture), then
// waits for the device's work like a Free(): every replay of the graph used
// it. One freed while its capture had already failed waits for the device's
// work.
//
// Invariants: a block goes upstream only once its fence has passed, or its
// device failed (nothing will run there any more); blocks under Free()'s
// rule go up per device in fence order; a block held for a graph goes
// nowhere while the graph lives. Thread-safe; mu_ is never held while a
// block goes upstream or a fence is waited for.
#ifndef GPUMEMD_CLIENT_LIB_POOL_FREE_QUEUE_H_
#define GPUMEMD_CLIENT_LIB_POOL_FREE_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/pool/block_resource.h"
#include "client/lib/pool/free_fences.h"

namespace gpumem {
namespace client {

class FreeQueue final : public BlockResource {
 public:
  struct Options {
    uint64_t max_device_rule_bytes = 128ull << 20;
    uint64_t max_device_rule_blocks = 8192;
    // Past those bounds: asked (once until WaitDeviceRule() runs) to have
    // WaitDeviceRule() run on another thread, so that the freeing thread
    // never waits for the device's whole queue. Unset: the free waits.
    std::function<void()> request_wait;
    // Makes the fences, on the first free of device memory (default: the
    // CUDA driver's, FreeFences). A failure leaves frees unfenced.
    std::function<absl::StatusOr<std::unique_ptr<FenceSource>>()> make_fences;
  };

  // `upstream` must outlive the queue.
  FreeQueue(BlockResource* upstream, Options options);
  ~FreeQueue() override;  // blocks still waiting are dropped: WaitAll() first
  FreeQueue(const FreeQueue&) = delete;
  FreeQueue& operator=(const FreeQueue&) = delete;

  // Collects what has passed, then asks upstream; when upstream has no
  // memory left and blocks are waiting, waits for them and asks once more.
  absl::StatusOr<Block> Allocate(uint64_t size, const Arena& arena) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Free()'s rule (ReuseAfter::DeviceWork: all the device's work before the
  // free) waits for the next cuCtxSynchronize of the device: one is run
  // when the blocks waiting under it exceed max_device_rule_bytes or
  // max_device_rule_blocks (by WaitDeviceRule() on the thread request_wait
  // wakes, or here without one), when the daemon has no memory left for an
  // allocation, and by WaitAll(). FreeAfterStream()'s rule is an event on
  // the stream, polled by Collect() (every allocation that reaches this
  // layer, and GiveBack's ticks).
  absl::Status Free(Block block, const ReuseAfter& after) override ABSL_LOCKS_EXCLUDED(mu_);

  // Passes upstream the blocks whose fences have passed (without blocking).
  void Collect() ABSL_LOCKS_EXCLUDED(mu_);
  // May a device block freed on `stream` be reused on it at once? Not while
  // the stream captures a graph (FenceSource::Capturing).
  bool MayReuseOnStream(void* stream);
  // Waits for every waiting block's fence, then collects.
  void WaitAll() ABSL_LOCKS_EXCLUDED(mu_) { Wait(/*device_rule_only=*/false); }
  // One synchronize of each device with Free()'s blocks waiting, then
  // collects (what Options::request_wait asks for).
  void WaitDeviceRule() ABSL_LOCKS_EXCLUDED(mu_);

  struct Figures {
    uint64_t blocks = 0, bytes = 0;
    uint64_t graph_blocks = 0, graph_bytes = 0;  // of those, held for graphs
  };
  Figures Stats() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiting {
    Block block;
    void* stream = nullptr;  // FreeAfterStream()'s: the stream it waits for
    FenceSource::Fence fence;
    bool fenced = false;       // false: nothing to wait for (the device failed)
    bool device_rule = false;  // Free()'s rule, not FreeAfterStream()'s
  };
  // Blocks held for graphs, by a number of their own; a graph's release
  // (on a driver thread, maybe after the queue is gone: it holds the box)
  // moves the number to `released`, which Collect() fences.
  struct GraphHolds {
    absl::Mutex mu;
    bool closed ABSL_GUARDED_BY(mu) = false;  // the queue is gone
    std::vector<uint64_t> released ABSL_GUARDED_BY(mu);
  };
  FenceSource* Fences();
  void Wait(bool device_rule_only) ABSL_LOCKS_EXCLUDED(mu_);
  bool Empty() ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `w`: under Free()'s rule by device, else by stream.
  void QueueLocked(Waiting w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves blocks whose graphs are gone to Free()'s rule.
  void TakeReleasedGraphs() ABSL_LOCKS_EXCLUDED(mu_);

  BlockResource* const upstream_;
  const Options options_;
  absl::once_flag fences_once_;
  std::unique_ptr<FenceSource> fences_owner_;  // made once, under fences_once_
  std::atomic<FenceSource*> fences_{nullptr};

  absl::Mutex mu_;
  // Free()'s blocks by device (the fence's device index), each in fence
  // order; FreeAfterStream()'s by stream, each in the order freed (a
  // stream's events pass in the order recorded). Collect() looks at the
  // fronts of at most kStreamsPerCollect streams, from `next_stream_` on.
  static constexpr int kStreamsPerCollect = 8;
  std::vector<std::deque<Waiting>> device_queues_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, std::deque<Waiting>> stream_queues_ ABSL_GUARDED_BY(mu_);
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t device_rule_count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t device_rule_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool wait_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<GraphHolds> graph_holds_ = std::make_shared<GraphHolds>();
  absl::flat_hash_map<uint64_t, Block> held_ ABSL_GUARDED_BY(mu_);
  uint64_t next_hold_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_FREE_QUEUE_H_
