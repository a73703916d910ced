// DeferredFrees: the C++ client's frees of device memory, sent to the daemon
// only once the work this process queued on the block's device before the
// free has completed, without making the freeing thread wait for it.
//
// A GPU runs work after the host queues it, so a Buffer may be freed while
// kernels that use it are still queued; cudaFree covers this by
// synchronizing the device in the call. Here the free is queued instead, and
// one thread per Client (started by the first deferred free) synchronizes
// each device a free waits on (OpenedSlab::WaitForDeviceWork: every stream of
// the device's primary context) and then runs the frees queued before that
// synchronize began: the block's memory is unmapped and given back to the
// daemon only then, so neither this process nor the daemon's next borrower
// reuses it under running work. The C ABI's gpumem_free keeps the same rule
// (client/lib/pool/free_fences.h).
//
// Invariants: a free runs only after a synchronize of its slab's device that
// began after the free was queued (a capture refusing the synchronize means
// "later", never "done"); Flush() returns once every free queued before it
// has run; the destructor flushes and stops the thread (in a fork() child,
// which has neither the thread nor the device, it leaves both alone).
// Thread-safe.
#ifndef GPUMEMD_CLIENT_LIB_CPP_DEFERRED_FREES_H_
#define GPUMEMD_CLIENT_LIB_CPP_DEFERRED_FREES_H_

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/lib/slabs/slab_mapper.h"

namespace gpumem {
namespace client {

class DeferredFrees {
 public:
  DeferredFrees() = default;
  ~DeferredFrees();  // Flush(), then stops the thread
  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;

  // Runs `free` once the work queued on `slab`'s device before now has
  // completed (on the thread; `free` must not call Flush()).
  void Add(std::shared_ptr<OpenedSlab> slab, std::function<void()> free);
  // Waits until every free added before the call has run.
  void Flush();
  // Frees added and not yet run.
  uint64_t pending() const;

 private:
  struct Item {
    std::shared_ptr<OpenedSlab> slab;
    std::function<void()> free;
  };
  void Loop();

  mutable absl::Mutex mu_;
  std::vector<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t added_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Add, under mu_
  const pid_t pid_ = getpid();
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_CPP_DEFERRED_FREES_H_
