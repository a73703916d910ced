// PagePopulator: one background thread that faults memory in ahead of its
// use, so that the thread that will write that memory (a request holding
// SlabPool's lock) does not pay for fresh pages itself: faulting fresh pages
// in is slow and uneven (the host may have to back them), so a batch of them
// inside one Allocate call would be the allocator's worst stall. Work posted
// here runs on this thread, in the order posted, one task at a time.
//
// Invariants: Post never blocks on a running task; the thread lives as long
// as the process, so a task may be posted from anywhere, at any time. A
// task must not block on its poster; it keeps what it touches alive itself
// (NodeStorage posts a weak_ptr to itself). Not for processes that fork
// after posting (the child has no worker and a queue mutex that may be
// held): the daemon does not fork; the client library's caching pool does
// not use it.
#ifndef GPUMEMD_COMMON_ALLOC_PAGE_POPULATOR_H_
#define GPUMEMD_COMMON_ALLOC_PAGE_POPULATOR_H_

#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {

class PagePopulator {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // The process-wide populator (SlabPool's allocators share it).
  static PagePopulator* Shared();

  PagePopulator() = default;
  PagePopulator(const PagePopulator&) = delete;
  PagePopulator& operator=(const PagePopulator&) = delete;
  // Never destroyed while tasks may be posted; the shared one never is.
  ~PagePopulator() = delete;

  // Takes a mutex that the worker holds only to pop the queue. The thread
  // starts at the first Post.
  void Post(Task task);

  // Tasks finished so far (tests wait on it).
  uint64_t tasks_done() const;

  // True on the thread of a PagePopulator (any instance's): work done here
  // is the populator's, not its poster's (NodeStorage counts faulting-in by
  // the thread that did it).
  static bool OnWorkerThread();

 private:
  void Run();

  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_ALLOC_PAGE_POPULATOR_H_
