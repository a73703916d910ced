// PollUntil: a test waits for a condition of another thread or process
// instead of sleeping for a guessed time.
//
// The condition is asked every few milliseconds until it holds or the
// deadline passes; the result says which, so the test fails loudly (with
// the message it streams after ASSERT_TRUE/EXPECT_TRUE) when the condition
// never came. Deadlines are generous (sanitizer builds on a loaded 2-core
// machine): they bound a hang, they are not what the test measures.
#ifndef GPUMEMD_TESTS_COMMON_POLL_UNTIL_H_
#define GPUMEMD_TESTS_COMMON_POLL_UNTIL_H_

#include <chrono>
#include <thread>

namespace gpumem {
namespace testing {

// The default deadline for a condition that should come at once.
inline constexpr std::chrono::seconds kPollDeadline{60};

// True as soon as done() is true; false if it still is not at `deadline`.
template <typename F>
bool PollUntil(F done, std::chrono::milliseconds deadline = kPollDeadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace testing
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_COMMON_POLL_UNTIL_H_
