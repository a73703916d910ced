// WorkerPool: a few threads that run what a completion-queue thread must
// not: requests that need backend work (creating a slab: on CUDA cuMemCreate,
// map, memset and synchronise; giving a dedicated slab back), and queries
// that read the disk or scan everything (the ledger, GetStats). A request
// that would make a queue's thread wait is handed to a pool instead (the
// core says which: MemoryBroker's Try* calls answer kNeedsBackendWork), so
// the other calls of the queue, and allocations on other devices, do not
// wait for it.
//
// Invariants: at most `threads` tasks run at once, the rest wait in arrival
// order; each task runs exactly once, unless Submit refused it.
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

  // Never blocks on a task; false once Shutdown began (the caller answers
  // the request itself then).
  bool Submit(std::function<void()> task);
  // Runs every task already submitted, then joins the threads. Idempotent;
  // the destructor calls it.
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
