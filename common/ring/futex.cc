// See futex.h. Raw syscall(SYS_futex): glibc has no wrapper. FUTEX_WAIT's
// timeout is relative and measured on CLOCK_MONOTONIC.
#include "common/ring/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace gpumem {

void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  struct timespec ts;
  struct timespec* bound = nullptr;
  if (timeout != absl::InfiniteDuration()) {
    ts = absl::ToTimespec(timeout);
    bound = &ts;
  }
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, bound,
          nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace gpumem
