// Sending and receiving file descriptors over Unix stream sockets
// (SCM_RIGHTS), with a small payload in the same message.
//
// Both calls retry on EINTR and handle short writes/reads of the payload; a
// received fd is always close-on-exec. A peer that closes the connection is
// UNAVAILABLE; anything malformed is INTERNAL. At most one fd per message.
#ifndef GPUMEMD_COMMON_FD_PASSING_H_
#define GPUMEMD_COMMON_FD_PASSING_H_

#include <cstddef>

#include "absl/status/status.h"

namespace gpumem {

// Writes `len` bytes of `data`; attaches `fd` to the first byte when fd >= 0.
absl::Status SendWithFd(int sock, const void* data, size_t len, int fd);

// Reads exactly `len` bytes into `data`. If the message carried an fd, stores
// it in *fd (else -1).
absl::Status RecvWithFd(int sock, void* data, size_t len, int* fd);

// Writes/reads exactly len bytes, no fds.
absl::Status WriteAll(int sock, const void* data, size_t len);
absl::Status ReadAll(int sock, void* data, size_t len);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_FD_PASSING_H_
