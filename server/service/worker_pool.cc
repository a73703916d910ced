// See worker_pool.h. A mutex-guarded queue and `threads` threads that
// wait on it; Shutdown lets them empty it before they exit.
#include "server/service/worker_pool.h"

#include <utility>

namespace gpumem {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

WorkerPool::~WorkerPool() { Shutdown(); }

bool WorkerPool::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void WorkerPool::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkerPool::Work() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->stopping_ || !w->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace gpumem
