// Makes Debian's uninstrumented Abseil and gRPC usable under ThreadSanitizer,
// so that what TSan reports is a race in this project's own code: it tells
// TSan of absl::Mutex's acquires and releases (1), of the order gRPC's
// completion queues give an operation's tag (2), and compiles in
// suppressions for the uninstrumented libraries (3); each part is described
// where it is defined. Compiles to nothing unless the build is a TSan build
// (--config=tsan). Linked, always, into the libraries that take an
// absl::Mutex or talk gRPC.
#if defined(__SANITIZE_THREAD__)
#include <dlfcn.h>

#include <grpc/grpc.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/base/options.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

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

// 1. absl::Mutex: Debian's Abseil is not built with -fsanitize=thread, so
// TSan cannot see the happens-before edges of absl::Mutex and would report
// every access guarded by one as a race. These definitions interpose on the
// Mutex entry points (an executable's definitions win over
// libabsl_synchronization.so's), call the real ones found with
// dlsym(RTLD_NEXT), and tell TSan about each acquire and release.
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
// Await*: the real function releases and retakes the mutex inside, and
// evaluates the condition with it held (on the waiting thread, or on a
// thread that is unlocking), where TSan sees neither. So the condition is
// wrapped: each evaluation is an acquire before and a release after, which
// is what holding the mutex around it means. The library's Await* call each
// other; only the outermost call wraps (thread-local depth).
struct TsanCondition {
  Mutex* mu;
  const Condition* cond;
  static bool Eval(TsanCondition* c) {
    __tsan_acquire(c->mu);
    const bool r = c->cond->Eval();
    __tsan_release(c->mu);
    return r;
  }
};
thread_local int tsan_await_depth = 0;
template <typename Real, typename... Args>
bool TsanAwait(Mutex* mu, Real real, const Condition& cond, Args... args) {
  if (tsan_await_depth > 0) return real(mu, cond, args...);
  TsanCondition wrapped{mu, &cond};
  ++tsan_await_depth;
  __tsan_release(mu);
  const bool r = real(mu, Condition(&TsanCondition::Eval, &wrapped), args...);
  __tsan_acquire(mu);
  --tsan_await_depth;
  return r;
}
void Mutex::Await(const Condition& cond) {
  static auto real = RealMutexFn<void (*)(Mutex*, const Condition&)>(
      "5AwaitERKNS0_9ConditionE");
  TsanAwait(this, [](Mutex* mu, const Condition& c) { real(mu, c); return true; }, cond);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = RealMutexFn<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return TsanAwait(this, real, cond, timeout);
}
bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = RealMutexFn<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return TsanAwait(this, real, cond, deadline);
}
ABSL_NAMESPACE_END
}  // namespace absl
// 2. gRPC's completion queues: gRPC's core orders an operation's start, and
// the posting of its completion, before the thread that dequeues the
// operation's tag; its queues are atomics in an uninstrumented library, so
// TSan sees neither edge. Without them, gRPC's header code compiled into our
// binaries (CallOpSet::FillOps on the thread that starts a batch,
// FinalizeResult on the thread that dequeues it), and our own state handed
// over with a tag, read as races. So: a release on the tag where an
// operation with that tag is started (grpc_call_start_batch,
// grpc_server_request_call, grpc_server_request_registered_call) or its
// completion posted (grpc_cq_end_op), an acquire where the tag is dequeued
// (grpc_completion_queue_next, grpc_completion_queue_pluck). Nothing else is
// ordered: two handlers touching one variable still race. An executable's
// definitions win over libgrpc.so.29's (its own calls, and libgrpc++'s, go
// through the PLT); the real ones come from dlsym(RTLD_NEXT).
namespace {
template <typename F>
F RealGrpcFn(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) abort();
  return reinterpret_cast<F>(p);
}
void ReleaseTag(void* tag) {
  if (tag != nullptr) __tsan_release(tag);
}
grpc_event AcquireTag(grpc_event ev) {
  if (ev.type == GRPC_OP_COMPLETE && ev.tag != nullptr) __tsan_acquire(ev.tag);
  return ev;
}
}  // namespace

extern "C" {
grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops,
                                      void* tag, void* reserved) {
  static auto real = RealGrpcFn<grpc_call_error (*)(grpc_call*, const grpc_op*, size_t,
                                                    void*, void*)>("grpc_call_start_batch");
  ReleaseTag(tag);
  return real(call, ops, nops, tag, reserved);
}
grpc_call_error grpc_server_request_call(grpc_server* server, grpc_call** call,
                                         grpc_call_details* details,
                                         grpc_metadata_array* request_metadata,
                                         grpc_completion_queue* cq_bound_to_call,
                                         grpc_completion_queue* cq_for_notification,
                                         void* tag_new) {
  static auto real = RealGrpcFn<grpc_call_error (*)(
      grpc_server*, grpc_call**, grpc_call_details*, grpc_metadata_array*,
      grpc_completion_queue*, grpc_completion_queue*, void*)>("grpc_server_request_call");
  ReleaseTag(tag_new);
  return real(server, call, details, request_metadata, cq_bound_to_call, cq_for_notification,
              tag_new);
}
grpc_call_error grpc_server_request_registered_call(
    grpc_server* server, void* registered_method, grpc_call** call, gpr_timespec* deadline,
    grpc_metadata_array* request_metadata, grpc_byte_buffer** optional_payload,
    grpc_completion_queue* cq_bound_to_call, grpc_completion_queue* cq_for_notification,
    void* tag_new) {
  static auto real = RealGrpcFn<grpc_call_error (*)(
      grpc_server*, void*, grpc_call**, gpr_timespec*, grpc_metadata_array*,
      grpc_byte_buffer**, grpc_completion_queue*, grpc_completion_queue*, void*)>(
      "grpc_server_request_registered_call");
  ReleaseTag(tag_new);
  return real(server, registered_method, call, deadline, request_metadata, optional_payload,
              cq_bound_to_call, cq_for_notification, tag_new);
}
grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                      void* reserved) {
  static auto real = RealGrpcFn<grpc_event (*)(grpc_completion_queue*, gpr_timespec, void*)>(
      "grpc_completion_queue_next");
  return AcquireTag(real(cq, deadline, reserved));
}
grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag,
                                       gpr_timespec deadline, void* reserved) {
  static auto real =
      RealGrpcFn<grpc_event (*)(grpc_completion_queue*, void*, gpr_timespec, void*)>(
          "grpc_completion_queue_pluck");
  return AcquireTag(real(cq, tag, deadline, reserved));
}
}  // extern "C"

// The core's own (C++ linkage; not in gRPC's installed headers): declared
// here as src/core/lib/surface/completion_queue.h has it, which gives the
// mangled name libgrpc.so.29 exports
// (_Z14grpc_cq_end_opP21grpc_completion_queuePvN4absl7debian36StatusE...).
struct grpc_cq_completion;
void grpc_cq_end_op(grpc_completion_queue* cq, void* tag, absl::Status error,
                    void (*done)(void* done_arg, grpc_cq_completion* storage), void* done_arg,
                    grpc_cq_completion* storage, bool internal) {
  using Fn = void (*)(grpc_completion_queue*, void*, absl::Status,
                      void (*)(void*, grpc_cq_completion*), void*, grpc_cq_completion*, bool);
  static const Fn real = [] {
    // This very function's own mangled name, from the compiler.
    Dl_info self;
    void (*me)(grpc_completion_queue*, void*, absl::Status,
               void (*)(void*, grpc_cq_completion*), void*, grpc_cq_completion*, bool) =
        &grpc_cq_end_op;
    if (dladdr(reinterpret_cast<void*>(me), &self) == 0 || self.dli_sname == nullptr) abort();
    return RealGrpcFn<Fn>(self.dli_sname);
  }();
  ReleaseTag(tag);
  real(cq, tag, std::move(error), done, done_arg, storage, internal);
}

// 3. Suppressions, compiled in, so no test needs a file path. Each names
// one of Debian's uninstrumented libraries (called_from_lib) or frames
// inside one (race:), never a namespace or function our own calls run under
// (TSan drops a report when any frame of any of its stacks, thread-creation
// and allocation stacks included, matches). TSan cannot see gRPC's,
// protobuf's or Abseil's own synchronization, but its interceptors see the
// system calls and memmoves those libraries make (epoll_create1 on one
// thread, epoll_wait on another) and report them; `called_from_lib` ignores
// interceptor calls made directly from each library (each name must match
// exactly one loaded library: the list is `ldd` of gpumemd and gpumemctl on
// Debian 12). The `race:` lines name glibc's loader functions that free and
// allocate dynamic TLS, and the NSS modules glibc loads behind TSan's back
// (see each line). So a race in this project's own code, reached from an RPC
// handler or anywhere else, is reported: tests/common:tsan_suppressions_test
// plants one in a unary handler and checks that TSan reports it.
extern "C" const char* __tsan_default_suppressions() {
  return
    "called_from_lib:libabsl_bad_optional_access.so.20220623\n"
    "called_from_lib:libabsl_bad_variant_access.so.20220623\n"
    "called_from_lib:libabsl_base.so.20220623\n"
    "called_from_lib:libabsl_city.so.20220623\n"
    "called_from_lib:libabsl_civil_time.so.20220623\n"
    "called_from_lib:libabsl_cord.so.20220623\n"
    "called_from_lib:libabsl_cord_internal.so.20220623\n"
    "called_from_lib:libabsl_cordz_functions.so.20220623\n"
    "called_from_lib:libabsl_cordz_handle.so.20220623\n"
    "called_from_lib:libabsl_cordz_info.so.20220623\n"
    "called_from_lib:libabsl_debugging_internal.so.20220623\n"
    "called_from_lib:libabsl_demangle_internal.so.20220623\n"
    "called_from_lib:libabsl_exponential_biased.so.20220623\n"
    "called_from_lib:libabsl_flags_commandlineflag.so.20220623\n"
    "called_from_lib:libabsl_flags_commandlineflag_internal.so.20220623\n"
    "called_from_lib:libabsl_flags_config.so.20220623\n"
    "called_from_lib:libabsl_flags_internal.so.20220623\n"
    "called_from_lib:libabsl_flags_marshalling.so.20220623\n"
    "called_from_lib:libabsl_flags_parse.so.20220623\n"
    "called_from_lib:libabsl_flags_private_handle_accessor.so.20220623\n"
    "called_from_lib:libabsl_flags_program_name.so.20220623\n"
    "called_from_lib:libabsl_flags_reflection.so.20220623\n"
    "called_from_lib:libabsl_flags_usage.so.20220623\n"
    "called_from_lib:libabsl_flags_usage_internal.so.20220623\n"
    "called_from_lib:libabsl_graphcycles_internal.so.20220623\n"
    "called_from_lib:libabsl_hash.so.20220623\n"
    "called_from_lib:libabsl_hashtablez_sampler.so.20220623\n"
    "called_from_lib:libabsl_int128.so.20220623\n"
    "called_from_lib:libabsl_log_severity.so.20220623\n"
    "called_from_lib:libabsl_low_level_hash.so.20220623\n"
    "called_from_lib:libabsl_malloc_internal.so.20220623\n"
    "called_from_lib:libabsl_random_distributions.so.20220623\n"
    "called_from_lib:libabsl_random_internal_platform.so.20220623\n"
    "called_from_lib:libabsl_random_internal_pool_urbg.so.20220623\n"
    "called_from_lib:libabsl_random_internal_randen.so.20220623\n"
    "called_from_lib:libabsl_random_internal_randen_hwaes.so.20220623\n"
    "called_from_lib:libabsl_random_internal_randen_hwaes_impl.so.20220623\n"
    "called_from_lib:libabsl_random_internal_randen_slow.so.20220623\n"
    "called_from_lib:libabsl_random_internal_seed_material.so.20220623\n"
    "called_from_lib:libabsl_random_seed_gen_exception.so.20220623\n"
    "called_from_lib:libabsl_random_seed_sequences.so.20220623\n"
    "called_from_lib:libabsl_raw_hash_set.so.20220623\n"
    "called_from_lib:libabsl_raw_logging_internal.so.20220623\n"
    "called_from_lib:libabsl_spinlock_wait.so.20220623\n"
    "called_from_lib:libabsl_stacktrace.so.20220623\n"
    "called_from_lib:libabsl_status.so.20220623\n"
    "called_from_lib:libabsl_statusor.so.20220623\n"
    "called_from_lib:libabsl_str_format_internal.so.20220623\n"
    "called_from_lib:libabsl_strerror.so.20220623\n"
    "called_from_lib:libabsl_strings.so.20220623\n"
    "called_from_lib:libabsl_strings_internal.so.20220623\n"
    "called_from_lib:libabsl_symbolize.so.20220623\n"
    "called_from_lib:libabsl_synchronization.so.20220623\n"
    "called_from_lib:libabsl_throw_delegate.so.20220623\n"
    "called_from_lib:libabsl_time.so.20220623\n"
    "called_from_lib:libabsl_time_zone.so.20220623\n"
    "called_from_lib:libaddress_sorting.so.29\n"
    "called_from_lib:libcares.so.2\n"
    "called_from_lib:libgpr.so.29\n"
    "called_from_lib:libgrpc++.so.1.51\n"
    "called_from_lib:libgrpc.so.29\n"
    "called_from_lib:libprotobuf.so.32\n"
    "called_from_lib:libre2.so.9\n"
    "called_from_lib:libupb.so.29\n"
    // glibc's dynamic TLS (a dlopen'ed library's thread_local, e.g. the
    // CUDA driver's or its fake's): the loader frees a finished thread's
    // DTV block, which malloc may have handed to another thread; glibc's
    // loader is not instrumented, so TSan sees the reuse as a race
    // (cuda_client_test, without these lines: free in _dl_deallocate_tls on
    // one thread against malloc in allocate_dtv_entry, or against the fake
    // driver's cuCtxPopCurrent writing its thread_local, on a thread that had
    // finished). Two functions of ld-linux-x86-64.so.2, by name (the match is
    // a substring: with libc6-dbg the frame reads __GI__dl_deallocate_tls;
    // allocate_dtv_entry is static, named only with libc6-dbg's symbols).
    // Neither calls our code or starts a thread.
    "race:_dl_deallocate_tls\n"
    "race:allocate_dtv_entry\n"
    // NSS modules (getgrnam/getpwuid for the admin group): glibc loads them
    // with its internal dlopen, which TSan does not see (so called_from_lib
    // cannot name them), and they reuse fd numbers gRPC closed (a close
    // called_from_lib hides from TSan): reload_test, without this line,
    // reports fstat64 from libnss_systemd.so.2 (Daemon::Reload ->
    // ParseDaemonConfig) against the accept4 of SocketListener that first
    // made that fd number. Its functions have no symbols, so the module is
    // named: the one module Debian 12's nsswitch.conf (files systemd) loads.
    // Frames inside it call no code of ours and start no thread (a race on
    // a buffer handed to getgrnam_r would be hidden too: ours are local to
    // each call).
    "race:libnss_systemd.so.2\n";
}

#endif  // __SANITIZE_THREAD__
