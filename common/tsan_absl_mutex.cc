// Makes absl::Mutex visible to ThreadSanitizer. Compiles to nothing unless
// the build is a TSan build (--config=tsan).
//
// Debian's Abseil is not built with -fsanitize=thread, so TSan cannot see the
// happens-before edges of absl::Mutex and would report every access guarded
// by one as a race. These definitions interpose on the Mutex entry points
// (an executable's definitions win over libabsl_synchronization.so's), call
// the real ones found with dlsym(RTLD_NEXT), and tell TSan about each
// acquire and release, so what TSan reports is a real race. Linked, always,
// into the libraries that take an absl::Mutex.
#include <string>

#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#include <dlfcn.h>

#include <cstdlib>

#include "absl/base/options.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {
#define GPUMEMD_STR2(x) #x
#define GPUMEMD_STR(x) GPUMEMD_STR2(x)
template <typename F>
F RealMutexFn(const char* member) {
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const std::string ns = GPUMEMD_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + "5Mutex" + member;
#else
  const std::string name = std::string("_ZN4absl5Mutex") + member;
#endif
  void* p = dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) abort();
  return reinterpret_cast<F>(p);
}
}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN
void Mutex::Lock() {
  static auto real = RealMutexFn<void (*)(Mutex*)>("4LockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::Unlock() {
  static auto real = RealMutexFn<void (*)(Mutex*)>("6UnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::ReaderLock() {
  static auto real = RealMutexFn<void (*)(Mutex*)>("10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::ReaderUnlock() {
  static auto real = RealMutexFn<void (*)(Mutex*)>("12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}
bool Mutex::TryLock() {
  static auto real = RealMutexFn<bool (*)(Mutex*)>("7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
void Mutex::Await(const Condition& cond) {
  static auto real = RealMutexFn<void (*)(Mutex*, const Condition&)>(
      "5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, cond);
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = RealMutexFn<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool r = real(this, cond, timeout);
  __tsan_acquire(this);
  return r;
}
ABSL_NAMESPACE_END
}  // namespace absl
#endif  // __SANITIZE_THREAD__
