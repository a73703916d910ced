#include "tests/integration/daemon_fixture.h"

#include <dirent.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

namespace gpumem {
namespace testing {
namespace {

std::vector<char*> CArgs(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const std::string& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int WaitFor(pid_t pid, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return -WTERMSIG(status);
    }
    if (r < 0) return -1001;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1000;
}

}  // namespace

std::string RunfilePath(const std::string& rel) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return rel;
  return std::string(srcdir) + "/" + (ws ? ws : "gpumemd") + "/" + rel;
}

namespace {
// Calls fn(path of the entry) for each entry of /proc/PID/<sub> (its tasks
// or its fds); false if the process is gone.
template <typename Fn>
bool ForEachProcEntry(pid_t pid, const char* sub, Fn fn) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/" + sub;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') fn(dir + "/" + e->d_name);
  }
  closedir(d);
  return true;
}
}  // namespace

int ThreadCount(pid_t pid) {
  int n = 0;
  return ForEachProcEntry(pid, "task", [&](const std::string&) { ++n; }) ? n : -1;
}

int ThreadCountBesidesGrpcTimers(pid_t pid) {
  int n = 0;
  const bool alive = ForEachProcEntry(pid, "task", [&](const std::string& task) {
    std::ifstream comm(task + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != "grpc_global_tim") ++n;  // comm is cut at 15 characters
  });
  return alive ? n : -1;
}

double ProcessCpuSeconds(pid_t pid, const std::string& thread_name) {
  uint64_t ns = 0;
  ForEachProcEntry(pid, "task", [&](const std::string& task) {
    if (!thread_name.empty()) {
      std::ifstream comm(task + "/comm");
      std::string name;
      if (!std::getline(comm, name) || name != thread_name) return;
    }
    std::ifstream in(task + "/schedstat");
    uint64_t run = 0;
    if (in >> run) ns += run;
  });
  return ns / 1e9;
}

int FdCount(pid_t pid) {
  int n = 0;
  return ForEachProcEntry(pid, "fd", [&](const std::string&) { ++n; }) ? n : -1;
}

int64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    long long kib = -1;
    return std::sscanf(line.c_str(), "VmRSS: %lld", &kib) == 1 ? kib : -1;
  }
  return -1;
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/gpumemd-test-XXXXXX";
  char* d = mkdtemp(tmpl);
  if (d == nullptr) return "/tmp";
  chmod(d, 0755);
  return d;
}

DaemonProcess::DaemonProcess(std::vector<std::string> extra_args)
    : args_(std::move(extra_args)) {
  dir_ = MakeTempDir();
  socket_ = dir_ + "/gpumemd.sock";
  log_ = dir_ + "/gpumemd.log";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

bool DaemonProcess::Start() {
  // A private ledger unless the test names one (a later flag wins); lock
  // order checked on every acquisition (a cycle aborts the daemon).
  std::vector<std::string> argv = {binary_.empty() ? RunfilePath("server/gpumemd") : binary_,
                                   "--socket=" + socket_,
                                   "--ledger=" + dir_ + "/ledger.db",
                                   "--mutex_deadlock_detection"};
  argv.insert(argv.end(), args_.begin(), args_.end());
  std::vector<char*> cargs = CArgs(argv);
  pid_ = fork();
  if (pid_ == 0) {
    int log = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(log, 2);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  for (int i = 0; i < 1000; ++i) {
    struct stat st;
    if (stat(socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return true;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1001;
  kill(pid_, SIGTERM);
  int rc = WaitFor(pid_, 10000);
  if (rc != -1000) pid_ = -1;
  return rc;
}

std::string DaemonProcess::Log() const {
  std::ifstream in(log_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, uid_t run_as) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return;
  std::vector<char*> cargs = CArgs(argv);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(p[1], 1);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    if (run_as != 0 && (setgid(run_as) != 0 || setuid(run_as) != 0)) _exit(126);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  close(p[1]);
  out_ = p[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) close(out_);
}

std::string ChildProcess::ReadLine(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0 || out_ < 0) return "";
    struct pollfd p = {out_, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) return "";
    char buf[4096];
    ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) return "";
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

void ChildProcess::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int ChildProcess::Wait() {
  if (pid_ <= 0) return -1001;
  int rc = WaitFor(pid_, 20000);
  if (rc != -1000) pid_ = -1;
  return rc;
}

}  // namespace testing
}  // namespace gpumem
