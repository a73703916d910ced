// See fake_systemd.h.
#include "tests/restart/fake_systemd.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace gpumem {
namespace testing {
namespace {

// A connection to `path`, or -1 when nobody listens there.
int socket_fd_probe(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

FakeSystemd::FakeSystemd(std::string dir, bool fd_store)
    : dir_(std::move(dir)), fd_store_(fd_store) {
  notify_path_ = dir_ + "/notify";
  notify_fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", notify_path_.c_str());
  unlink(notify_path_.c_str());
  bind(notify_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  // Room for a burst of FDSTOREs while the test is not reading.
  int big = 8 << 20;
  setsockopt(notify_fd_, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
}

FakeSystemd::~FakeSystemd() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  DropStore();
  if (notify_fd_ >= 0) close(notify_fd_);
  unlink(notify_path_.c_str());
}

void FakeSystemd::Handle(const std::string& message, std::vector<int> fds) {
  bool store = false, remove = false;
  std::string name = "stored";
  for (absl::string_view line : absl::StrSplit(message, '\n', absl::SkipEmpty())) {
    if (line == "READY=1") ready_ = true;
    if (line == "FDSTORE=1") store = true;
    if (line == "FDSTOREREMOVE=1") remove = true;
    if (absl::ConsumePrefix(&line, "FDNAME=")) name = std::string(line);
    if (absl::ConsumePrefix(&line, "STATUS=")) status_ = std::string(line);
  }
  if (remove) {
    for (auto it = store_.begin(); it != store_.end();) {
      if (it->first == name) {
        close(it->second);
        it = store_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (int fd : fds) {
    if (store && fd_store_) {
      store_.emplace_back(name, fd);
    } else {
      close(fd);  // systemd closes fds sent without FDSTORE=1
    }
  }
}

void FakeSystemd::Pump() {
  for (;;) {
    char buf[4096];
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
    struct iovec iov = {buf, sizeof(buf) - 1};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(notify_fd_, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) return;  // EAGAIN: read everything
    std::vector<int> fds;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(fd);
      }
    }
    Handle(std::string(buf, static_cast<size_t>(n)), std::move(fds));
  }
}

bool FakeSystemd::Start(const std::vector<std::string>& argv, const std::string& socket,
                        absl::Duration timeout) {
  Pump();  // what the last daemon said before it died
  ready_ = false;
  // The environment, built before fork; LISTEN_PID is filled in the child.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "LISTEN_", 7) == 0 || strncmp(*e, "NOTIFY_SOCKET=", 14) == 0) continue;
    env.emplace_back(*e);
  }
  std::vector<int> pass;
  std::vector<std::string> names;
  if (fd_store_) {
    env.push_back("NOTIFY_SOCKET=" + notify_path_);
    for (const auto& [name, fd] : store_) {
      pass.push_back(fd);
      names.push_back(name);
    }
    if (!pass.empty()) {
      env.push_back("LISTEN_FDS=" + std::to_string(pass.size()));
      env.push_back("LISTEN_FDNAMES=" + absl::StrJoin(names, ":"));
    }
  }
  char listen_pid[64] = "LISTEN_PID=";
  std::vector<char*> cenv;
  for (std::string& e : env) cenv.push_back(e.data());
  if (!pass.empty()) cenv.push_back(listen_pid);
  cenv.push_back(nullptr);
  std::vector<char*> cargs;
  for (const std::string& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
  cargs.push_back(nullptr);
  const std::string log = log_path();
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const absl::Time began = absl::Now();
  pid_ = fork();
  if (pid_ == 0) {
    dup2(log_fd, 2);
    // The stored fds to 3, 4, ...: first out of the way, then in place.
    const int base = 3 + static_cast<int>(pass.size()) + 64;
    for (size_t i = 0; i < pass.size(); ++i) dup2(pass[i], base + static_cast<int>(i));
    for (size_t i = 0; i < pass.size(); ++i) {
      dup2(base + static_cast<int>(i), 3 + static_cast<int>(i));
      close(base + static_cast<int>(i));
    }
    snprintf(listen_pid + 11, sizeof(listen_pid) - 11, "%d", getpid());
    execve(cargs[0], cargs.data(), cenv.data());
    _exit(127);
  }
  close(log_fd);
  ++starts_;
  const absl::Time deadline = began + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    if (fd_store_) {
      struct pollfd p = {notify_fd_, POLLIN, 0};
      poll(&p, 1, 5);
      Pump();
      if (ready_) break;
    } else {
      // Ready once a connect succeeds (the dead daemon's file refuses).
      const int probe = socket_fd_probe(socket);
      if (probe >= 0) {
        close(probe);
        ready_ = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  last_start_ = absl::Now() - began;
  return ready_;
}

void FakeSystemd::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int FakeSystemd::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1001;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      Pump();
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return -WTERMSIG(status);
      return -1001;
    }
    Pump();
    absl::SleepFor(absl::Milliseconds(2));
  }
  return -1000;
}

void FakeSystemd::DropStore() {
  Pump();
  for (auto& [name, fd] : store_) close(fd);
  store_.clear();
}

void FakeSystemd::Store(const std::string& name, int fd) { store_.emplace_back(name, fd); }

std::vector<std::string> FakeSystemd::StoredNames() {
  Pump();
  std::vector<std::string> out;
  for (const auto& [name, fd] : store_) out.push_back(name);
  return out;
}

size_t FakeSystemd::stored_count() {
  Pump();
  return store_.size();
}

std::string FakeSystemd::Log() const {
  std::ifstream in(log_path());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace testing
}  // namespace gpumem
