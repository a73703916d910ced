// Socket activation: the listening socket systemd passed (LISTEN_FDS,
// LISTEN_PID), taken through libsystemd's sd_listen_fds.
//
// Guarantees: TakeActivationSocket() returns
//  - std::nullopt (as an OK value) when nothing was passed: the daemon binds
//    its own socket;
//  - the fd (>= SD_LISTEN_FDS_START, close-on-exec set) when exactly one
//    listening AF_UNIX stream socket was passed;
//  - FAILED_PRECONDITION naming what is wrong otherwise (several fds, or one
//    that is not a listening Unix stream socket): a unit that passes the
//    wrong thing is a configuration error, not something to guess around.
// The LISTEN_* variables are removed from the environment either way.
#ifndef GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_
#define GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_

#include <optional>

#include "absl/status/statusor.h"

namespace gpumem {

absl::StatusOr<std::optional<int>> TakeActivationSocket();

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_
