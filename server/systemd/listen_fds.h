// What systemd passed the daemon at start (LISTEN_FDS, LISTEN_FDNAMES,
// LISTEN_PID), taken through libsystemd's sd_listen_fds_with_names: the
// listening socket of socket activation, and the fds the daemon deposited
// in systemd's fd store before a restart (fd_store.h), by their names.
//
// Guarantees: TakeListenFds() returns
//  - the listening socket, if one was passed: a listening AF_UNIX stream
//    socket under any name but gpumemd's own (socket activation), or else
//    the one gpumemd stored as "gpumemd-listen" (the socket of the daemon
//    before a restart, so clients' connects never fail meanwhile);
//  - every other fd whose name starts "gpumemd-", by name, for the caller
//    to check;
//  - what it dropped (closed) and why, a line each: fds of names not
//    gpumemd's, a second stored listener;
//  - FAILED_PRECONDITION when two activation sockets are passed, or a
//    socket-activation fd is not a listening Unix stream socket: a unit that
//    passes the wrong thing is a configuration error, not something to
//    guess around.
// Every fd it returns has close-on-exec set. The LISTEN_* variables are
// removed from the environment either way.
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
  std::optional<int> socket;
  bool socket_from_activation = false;
  std::map<std::string, int> stored;
  std::vector<std::string> dropped;
};

absl::StatusOr<ListenedFds> TakeListenFds();

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SYSTEMD_LISTEN_FDS_H_
