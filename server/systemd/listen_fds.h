// What systemd passed the daemon at start (LISTEN_FDS, LISTEN_FDNAMES,
// LISTEN_PID), taken through libsystemd's sd_listen_fds_with_names: the
// listening socket of socket activation, and the fds the daemon deposited
// in systemd's fd store before a restart (fd_store.h), by their names.
// Invariants: every fd it returns has close-on-exec set, every fd it does
// not return is closed, saying why; a unit that passes the wrong thing is a
// configuration error, not something to guess around; the LISTEN_*
// variables are removed from the environment either way.
#ifndef GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_
#define GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpumem {

// The name gpumemd stores its listening socket under.
inline constexpr char kStoredListenName[] = "gpumemd-listen";

struct ListenedFds {
  // The listening socket, if one was passed: a listening AF_UNIX stream
  // socket under any name but gpumemd's own (socket activation), or else
  // the one gpumemd stored as kStoredListenName (the socket of the daemon
  // before a restart, so clients' connects never fail meanwhile).
  std::optional<int> socket;
  bool socket_from_activation = false;
  // Every other fd whose name starts "gpumemd-", by name, for the caller to
  // check.
  std::map<std::string, int> stored;
  // What was dropped (closed) and why, a line each: fds of names not
  // gpumemd's, a second stored listener.
  std::vector<std::string> dropped;
};

// FAILED_PRECONDITION when two activation sockets are passed, or a
// socket-activation fd is not a listening Unix stream socket.
absl::StatusOr<ListenedFds> TakeListenFds();

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_
