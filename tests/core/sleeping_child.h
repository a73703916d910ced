// SleepingChild: a child process that only sleeps until it is killed, to
// stand for a client process in tests of the core (its pid gets a session
// that really ends when it is killed). Fork it before any thread starts;
// it calls only async-signal-safe functions, so forking later is safe too.
#ifndef GPUMEMD_TESTS_CORE_SLEEPING_CHILD_H_
#define GPUMEMD_TESTS_CORE_SLEEPING_CHILD_H_

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/session/peer_credentials.h"

namespace gpumem {
namespace testing {

class SleepingChild {
 public:
  SleepingChild() {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (;;) pause();
    }
  }
  ~SleepingChild() {
    Kill();
    Reap();
  }
  SleepingChild(const SleepingChild&) = delete;
  SleepingChild& operator=(const SleepingChild&) = delete;

  pid_t pid() const { return pid_; }
  PeerCred Cred(uid_t uid, gid_t gid) const { return PeerCred{pid_, uid, gid}; }
  PeerCred Cred() const { return PeerCred{pid_, getuid(), getgid()}; }
  // SIGKILL; the child stays a zombie until Reap().
  void Kill() {
    if (pid_ > 0 && !killed_) kill(pid_, SIGKILL);
    killed_ = true;
  }
  void Reap() {
    if (pid_ > 0 && !reaped_) waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }

 private:
  pid_t pid_ = -1;
  bool killed_ = false;
  bool reaped_ = false;
};

}  // namespace testing
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_CORE_SLEEPING_CHILD_H_
