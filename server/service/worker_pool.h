// WorkerPool: a few threads that run what a completion-queue thread must
// not: requests that need backend work (creating a slab: on CUDA cuMemCreate,
// map, memset and synchronise, milliseconds to tens of them; giving a
// dedicated slab back), and queries that read the disk or scan everything
// (the ledger, GetStats).
//
// A completion-queue thread serves every call of its queue; a request that
// would make it wait is handed to a pool instead (the core says which:
// MemoryBroker's Try* calls answer kNeedsBackendWork), so the other calls of
// the queue, and allocations on other devices, do not wait for it.
//
// Guarantees:
//  - At most `threads` tasks run at once; the rest wait in arrival order.
//    Each task runs exactly once, unless Submit refused it.
//  - Submit never blocks on a task; it returns false once Shutdown began
//    (the caller answers the request itself then).
//  - Shutdown runs every task already submitted, then joins the threads.
//    Idempotent; the destructor calls it.
#ifndef GPUMEMD_SERVER_SERVICE_WORKER_POOL_H_
#define GPUMEMD_SERVER_SERVICE_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  bool Submit(std::function<void()> task);
  void Shutdown();

 private:
  void Work();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_WORKER_POOL_H_
