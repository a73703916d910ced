// FakeSystemd: systemd's side of the protocols a restart of gpumemd relies
// on, played by a test: the service's notify socket (READY=1, STATUS=,
// STOPPING=1, and the fd store: FDSTORE=1 with FDNAME= and an fd attached,
// FDSTOREREMOVE=1), and starting the service again with what it stored
// passed back as LISTEN_FDS / LISTEN_FDNAMES / LISTEN_PID, as systemd does
// for a restart (Restart=, a crash, `systemctl restart`).
//
// As systemd 252 does: stored fds stay in the store after being passed (the
// next start gets them again); FDSTORE with a name already stored adds
// another entry; FDSTOREREMOVE drops every entry of that name; a stop (not
// a restart) empties the store (DropStore). Without the store (`fd_store`
// false) there is no NOTIFY_SOCKET at all: the daemon runs as outside
// systemd, and it is ready once its socket accepts connections.
#ifndef GPUMEMD_TESTS_RESTART_FAKE_SYSTEMD_H_
#define GPUMEMD_TESTS_RESTART_FAKE_SYSTEMD_H_

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace gpumem {
namespace testing {

class FakeSystemd {
 public:
  // `dir`: where the notify socket and the daemon's log go.
  FakeSystemd(std::string dir, bool fd_store);
  ~FakeSystemd();  // kills a daemon still running; closes the store
  FakeSystemd(const FakeSystemd&) = delete;
  FakeSystemd& operator=(const FakeSystemd&) = delete;

  // Starts `argv` (argv[0] a path) with the store's fds passed, and waits up
  // to `timeout` for READY=1 (or, without the store, for `socket` to be a
  // socket that accepts connections). False if it exited or timed out first.
  bool Start(const std::vector<std::string>& argv, const std::string& socket,
             absl::Duration timeout = absl::Seconds(20));
  // From fork to ready, for the last Start.
  absl::Duration last_start() const { return last_start_; }

  void Kill(int sig);
  // Waits for the daemon's exit: its status, -signal, or -1000 on timeout.
  int Wait(absl::Duration timeout = absl::Seconds(20));
  pid_t pid() const { return pid_; }

  // Reads what the daemon sent so far (the tests call it before looking).
  void Pump();
  // A stop (systemd 252 keeps no fd store over a stop).
  void DropStore();
  // Puts an fd in the store as if the daemon had (bad-input tests); taken.
  void Store(const std::string& name, int fd);
  std::vector<std::string> StoredNames();
  size_t stored_count();
  // The last STATUS= line.
  const std::string& status() const { return status_; }
  std::string log_path() const { return dir_ + "/gpumemd.log"; }
  std::string Log() const;

 private:
  void Handle(const std::string& message, std::vector<int> fds);

  const std::string dir_;
  const bool fd_store_;
  std::string notify_path_;
  int notify_fd_ = -1;
  pid_t pid_ = -1;
  bool ready_ = false;
  std::string status_;
  absl::Duration last_start_;
  std::vector<std::pair<std::string, int>> store_;
  int starts_ = 0;
};

}  // namespace testing
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_RESTART_FAKE_SYSTEMD_H_
