// sd_listen_fds + sd_is_socket_unix checks (see listen_fds.h).
#include "server/systemd/listen_fds.h"

#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<std::optional<int>> TakeActivationSocket() {
  const int n = sd_listen_fds(/*unset_environment=*/1);
  if (n < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sd_listen_fds: ", strerror(-n)));
  }
  if (n == 0) return std::optional<int>();
  if (n != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "systemd passed ", n, " sockets (LISTEN_FDS); gpumemd takes exactly one: "
        "give gpumemd.socket a single ListenStream="));
  }
  const int fd = SD_LISTEN_FDS_START;
  const int is_unix = sd_is_socket_unix(fd, SOCK_STREAM, /*listening=*/1,
                                        nullptr, 0);
  if (is_unix <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the socket systemd passed (fd ", fd, ") is not a listening Unix "
        "stream socket", is_unix < 0 ? absl::StrCat(": ", strerror(-is_unix)) : "",
        "; use ListenStream=/run/gpumemd/gpumemd.sock"));
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return std::optional<int>(fd);
}

}  // namespace gpumem
