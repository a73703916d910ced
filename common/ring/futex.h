// Waiting for a 32-bit word that two processes share: futex waits and
// wakes, and the pause of a spin wait before them.
//
// The word lives in a MAP_SHARED mapping (the request ring's memfd), so these
// are the kernel's shared futex operations, not the FUTEX_PRIVATE_FLAG ones:
// the kernel finds the waiters by the page the word is on, whichever process
// mapped it where. A wait ends on a wake, on a signal, at its timeout, or at
// once when the word no longer holds `expected` (the check and the sleep are
// one step in the kernel, so a wake between the caller's last look and the
// sleep is not lost). Callers look at the word again after every wait:
// returns without a change are allowed.
#ifndef GPUMEMD_COMMON_RING_FUTEX_H_
#define GPUMEMD_COMMON_RING_FUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace gpumem {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "a futex word is a plain, lock-free 32-bit word in shared memory");

// Sleeps while *word == expected, for at most `timeout` (InfiniteDuration():
// no bound; zero or less: returns at once).
void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

// Wakes every thread, of any process, sleeping in FutexWait on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

// One step of a spin wait: tells the core this thread is spinning (its
// sibling hyperthread gets the pipeline; no memory-order effect).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_RING_FUTEX_H_
