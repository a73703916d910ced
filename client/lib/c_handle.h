// What a gpumem_client handle (gpumem.h) is, for the files of the C ABI.
//
// Invariant: `magic` is kOpenMagic while the pool serves, kClosedMagic after
// gpumem_close (the handle itself is never freed, so later calls can be
// answered GPUMEM_E_CLOSED).
#ifndef GPUMEMD_CLIENT_LIB_C_HANDLE_H_
#define GPUMEMD_CLIENT_LIB_C_HANDLE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/lib/pool/caching_pool.h"

struct gpumem_client;

namespace gpumem {
namespace client {
inline constexpr uint32_t kOpenMagic = 0x67706d31;    // "gpm1"
inline constexpr uint32_t kClosedMagic = 0x67706d30;  // "gpm0"

// Sets this thread's last error from `s` and returns its code.
int SetError(const absl::Status& s);
int SetOk();
// The pool of an open handle (or the status the C ABI answers).
absl::StatusOr<CachingPool*> PoolOf(gpumem_client* c);
}  // namespace client
}  // namespace gpumem

struct gpumem_client {
  std::atomic<uint32_t> magic{0};
  std::unique_ptr<gpumem::client::CachingPool> pool;
  gpumem::client::CachingPool::Arena* default_arena = nullptr;
};

#endif  // GPUMEMD_CLIENT_LIB_C_HANDLE_H_
