// BackendWorkers: a few threads that run the requests a completion-queue
// thread must not: those that need backend work (creating a slab: on CUDA
// cuMemCreate, map, memset and synchronise, milliseconds to tens of them).
//
// The Stream RPC serves every stream of a queue from one thread; a request
// that would make that thread wait for the backend is handed here instead
// (MemoryBroker::BackendWork::kNotHere tells which), so the other streams on
// the queue, and allocations on other devices, do not wait for it.
//
// Guarantees:
//  - At most `threads` tasks run at once; the rest wait in arrival order.
//    Each task runs exactly once, unless Submit refused it.
//  - Submit never blocks on a task; it returns false once Shutdown began
//    (the caller answers the request itself then).
//  - Shutdown runs every task already submitted, then joins the threads.
//    Idempotent; the destructor calls it.
#ifndef GPUMEMD_SERVER_SERVICE_BACKEND_WORKERS_H_
#define GPUMEMD_SERVER_SERVICE_BACKEND_WORKERS_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {

class BackendWorkers {
 public:
  explicit BackendWorkers(int threads);
  ~BackendWorkers();
  BackendWorkers(const BackendWorkers&) = delete;
  BackendWorkers& operator=(const BackendWorkers&) = delete;

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

#endif  // GPUMEMD_SERVER_SERVICE_BACKEND_WORKERS_H_
