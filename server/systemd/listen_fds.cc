// sd_listen_fds_with_names + sd_is_socket_unix checks (see listen_fds.h).
#include "server/systemd/listen_fds.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gpumem {

absl::StatusOr<ListenedFds> TakeListenFds() {
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  if (n < 0) {
    return absl::FailedPreconditionError(absl::StrCat("sd_listen_fds: ", strerror(-n)));
  }
  ListenedFds out;
  std::optional<int> stored_listener;
  absl::Status error;
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    const std::string name = names != nullptr && names[i] != nullptr ? names[i] : "unknown";
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    const bool ours = absl::StartsWith(name, "gpumemd-");
    const int listening = sd_is_socket_unix(fd, SOCK_STREAM, /*listening=*/1, nullptr, 0);
    if (name == kStoredListenName) {
      if (listening > 0 && !stored_listener.has_value()) {
        stored_listener = fd;
      } else {
        out.dropped.push_back(absl::StrCat("fd ", fd, " named ", name,
                                           ": not a listening Unix socket, or a second one"));
        close(fd);
      }
    } else if (ours) {
      out.stored[name] = fd;
    } else if (listening > 0) {
      if (out.socket.has_value() && error.ok()) {
        error = absl::FailedPreconditionError(
            "systemd passed more than one socket (LISTEN_FDS); gpumemd takes exactly one: "
            "give gpumemd.socket a single ListenStream=");
      }
      out.socket = fd;
      out.socket_from_activation = true;
    } else if (n == 1 && !ours) {
      // A unit that passes one fd means it as the socket: say what is wrong.
      error = absl::FailedPreconditionError(absl::StrCat(
          "the socket systemd passed (fd ", fd, ") is not a listening Unix "
          "stream socket", listening < 0 ? absl::StrCat(": ", strerror(-listening)) : "",
          "; use ListenStream=/run/gpumemd/gpumemd.sock"));
      close(fd);
    } else {
      out.dropped.push_back(absl::StrCat("fd ", fd, " named ", name, ": not one of gpumemd's"));
      close(fd);
    }
    if (names != nullptr) free(names[i]);
  }
  free(names);
  if (!error.ok()) {
    for (const auto& [name, fd] : out.stored) close(fd);
    if (out.socket.has_value()) close(*out.socket);
    if (stored_listener.has_value()) close(*stored_listener);
    return error;
  }
  if (stored_listener.has_value()) {
    if (out.socket.has_value()) {
      out.dropped.push_back(absl::StrCat(kStoredListenName,
                                         ": the socket systemd activates is used instead"));
      close(*stored_listener);
    } else {
      out.socket = stored_listener;
    }
  }
  return out;
}

}  // namespace gpumem
