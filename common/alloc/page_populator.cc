// PagePopulator: a queue of tasks and the one thread that runs them (see
// page_populator.h).
#include "common/alloc/page_populator.h"

#include <thread>
#include <utility>

namespace gpumem {
namespace {
thread_local bool on_worker_thread = false;
}  // namespace

bool PagePopulator::OnWorkerThread() { return on_worker_thread; }

PagePopulator* PagePopulator::Shared() {
  static PagePopulator* const shared = new PagePopulator();
  return shared;
}

void PagePopulator::Post(Task task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  if (!started_) {
    started_ = true;
    std::thread([this] { Run(); }).detach();
  }
}

uint64_t PagePopulator::tasks_done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void PagePopulator::Run() {
  on_worker_thread = true;
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<Task>* q) { return !q->empty(); }, &queue_));
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
    absl::MutexLock lock(&mu_);
    ++done_;
  }
}

}  // namespace gpumem
