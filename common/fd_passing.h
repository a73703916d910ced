// Sending and receiving file descriptors over Unix stream sockets
// (SCM_RIGHTS), with a small payload in the same message.
//
// Both calls retry on EINTR and handle short writes/reads of the payload; a
// received fd is always close-on-exec. A peer that closes the connection is
// UNAVAILABLE; anything malformed is INTERNAL. At most kMaxFdsPerMessage fds
// per message (the slab channel's kOpenRing answer carries two).
#ifndef GPUMEMD_COMMON_FD_PASSING_H_
#define GPUMEMD_COMMON_FD_PASSING_H_

#include <cstddef>

#include "absl/status/status.h"

namespace gpumem {

inline constexpr int kMaxFdsPerMessage = 2;

// Writes `len` bytes of `data`; attaches `fd` to the first byte when fd >= 0.
absl::Status SendWithFd(int sock, const void* data, size_t len, int fd);

// Reads exactly `len` bytes into `data`. If the message carried an fd, stores
// it in *fd (else -1).
absl::Status RecvWithFd(int sock, void* data, size_t len, int* fd);

// The same for up to kMaxFdsPerMessage fds: `fds[0..count)` are attached to
// the first byte (count 0: none).
absl::Status SendWithFds(int sock, const void* data, size_t len, const int* fds, int count);
// Stores the fds the message carried in fds[0..*count) (at most
// kMaxFdsPerMessage; fds[i] = -1 past them). A message carrying more is
// INTERNAL (the kernel closed those that did not fit; the rest are closed).
absl::Status RecvWithFds(int sock, void* data, size_t len, int fds[kMaxFdsPerMessage],
                         int* count);

// Writes/reads exactly len bytes, no fds.
absl::Status WriteAll(int sock, const void* data, size_t len);
absl::Status ReadAll(int sock, void* data, size_t len);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_FD_PASSING_H_
