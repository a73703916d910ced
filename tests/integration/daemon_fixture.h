// DaemonProcess: a real gpumemd for a test, started as a child process on a
// private socket, and helpers to run other programs (test clients) as
// separate processes.
//
// Start() fork+execs the daemon binary from the test's runfiles and waits for
// its socket; Stop() sends SIGTERM and returns the exit status, so tests can
// assert a clean shutdown. The destructor kills a daemon still running.
#ifndef GPUMEMD_TESTS_INTEGRATION_DAEMON_FIXTURE_H_
#define GPUMEMD_TESTS_INTEGRATION_DAEMON_FIXTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpumem {
namespace testing {

// Path of a binary in this test's runfiles, e.g. "server/gpumemd".
std::string RunfilePath(const std::string& workspace_relative);

// The number of threads of process `pid` (-1 if it is gone).
int ThreadCount(pid_t pid);
// The same less gRPC's timer threads ("grpc_global_timer"): gRPC starts
// another whenever every one it has is running timer callbacks at once and
// stops them only at shutdown, so their number is a high-water mark of
// gRPC's, not threads the daemon made or leaked.
int ThreadCountBesidesGrpcTimers(pid_t pid);
// Its open fds (-1 if it is gone), and its resident memory in KiB (VmRSS;
// -1 if it is gone).
int FdCount(pid_t pid);
// CPU seconds the threads of process `pid` have run so far, to the
// nanosecond: the sum of the first field of each /proc/PID/task/TID/schedstat
// (/proc/PID/stat counts clock ticks, too coarse for a benchmark row of a
// few seconds). Threads that have ended are not counted. 0 if it is gone.
// With `thread_name`, only its threads of that name (/proc/PID/task/TID/comm).
double ProcessCpuSeconds(pid_t pid, const std::string& thread_name = "");
int64_t RssKiB(pid_t pid);

// A fresh directory under /tmp (short enough for a Unix socket path),
// mode 0755 so that tests may run clients as another uid.
std::string MakeTempDir();

class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extra_args = {});
  // Another gpumemd binary than the runfiles' (benchmarks: an earlier build
  // beside this one). Before Start().
  void SetBinary(std::string path) { binary_ = std::move(path); }
  ~DaemonProcess();

  // Starts the daemon and waits up to 10 s for its socket. False on failure.
  bool Start();
  // SIGTERM, then waits; returns the exit status (or -signal, or -1000 when
  // it did not stop within 10 s).
  int Stop();

  const std::string& socket() const { return socket_; }
  // The daemon's private directory (mode 0755, removed with the fixture).
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  // What the daemon wrote to stderr so far.
  std::string Log() const;

 private:
  std::vector<std::string> args_;
  std::string binary_;
  std::string dir_;
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
};

// A child process with its stdout on a pipe the test reads line by line.
class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stdin is /dev/null.
  explicit ChildProcess(const std::vector<std::string>& argv, uid_t run_as = 0);
  ~ChildProcess();  // SIGKILLs and reaps a child still running

  // The next line of the child's stdout (without '\n'); empty on EOF or
  // after timeout_ms. The default is a hang guard, not a property: long
  // enough for a client's first line under TSan on two loaded cores (15 s
  // was seen).
  std::string ReadLine(int timeout_ms = 60000);
  void Kill(int sig);
  // Waits for exit; returns the exit status, or -signal if killed.
  int Wait();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
};

}  // namespace testing
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_INTEGRATION_DAEMON_FIXTURE_H_
