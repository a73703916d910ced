// `gpumemctl top`: a live view of the daemon (client/ctl/top_view.h renders it).
//
//   gpumemctl [--socket=PATH] top [--interval=1s] [--iterations=N] [--plain]
//
// Each refresh asks the daemon one GetStats, nothing else, and with a
// deadline, so a daemon that hangs shows as unreachable instead of freezing
// the screen. The daemon going away is not an error: top says it is
// unreachable, keeps the last figures (marked stale), asks again every
// interval on a fresh connection, and carries on when it is back.
#ifndef GPUMEMD_CLIENT_CTL_GPUMEMCTL_TOP_H_
#define GPUMEMD_CLIENT_CTL_GPUMEMCTL_TOP_H_

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

struct TopOptions {
  std::string socket_path;  // empty: DefaultSocketPath()
  absl::Duration interval = absl::Seconds(1);
  int iterations = 0;       // 0: until asked to stop
  bool plain = false;       // plain text even on a terminal
  int plain_width = 100;    // columns of the plain view
};

// One GetStats per call.
using StatsSource = std::function<absl::StatusOr<v1::GetStatsResponse>()>;

// GetStats over gRPC on the daemon's socket, with `timeout` per call. A
// failed call drops the channel; the next call makes a new one (so a
// restarted daemon is reached at once, without gRPC's reconnect backoff).
// It opens no session and no slab channel: top holds nothing at the daemon.
StatsSource DaemonStatsSource(const std::string& socket_path, absl::Duration timeout);

// The plain loop: `iterations` refreshes (0: until `stop` returns true),
// one `source` call each, written to `out`. Returns the exit status.
int RunPlainTop(const TopOptions& options, const StatsSource& source, std::ostream& out,
                const std::function<bool()>& stop);

// The command: full-screen on a terminal (ncurses: `q` quits, a resize
// redraws the last answer at once, no extra call), else plain: with
// --plain, or when stdout is not a terminal, each refresh prints the whole
// view as plain text followed by an empty line (for pipes and logs).
// --iterations stops after N refreshes (0: until q, SIGINT or SIGTERM). Exit status 0 when
// asked to quit, 2 for a bad --interval.
int RunTop(const TopOptions& options);

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_CTL_GPUMEMCTL_TOP_H_
