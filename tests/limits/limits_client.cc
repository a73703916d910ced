// limits_client: a client process for the connection-limit tests, run as
// whatever uid the test chooses.
//
// Modes (one per run):
//   --flood=N
//       opens N connections, each saying the HTTP/2 preface and an empty
//       SETTINGS frame as a gRPC client does, then sees which the daemon
//       served (its SETTINGS came) and which it closed; prints
//       "open K closed M" and holds the open ones until killed.
//   --settings
//       one such connection; prints "max_concurrent_streams V" from the
//       daemon's SETTINGS frame (-1 when it does not say).
//   --alloc_once
//       a real client (gpumem::Client) allocates 4 KiB; prints "alloc ok" or
//       "alloc error CODE MESSAGE".
//   --go_file=F --devices=1,2,3
//       a real client connects and allocates 4 KiB (on device 0), prints
//       "connected", waits until file F exists, then allocates 4 KiB on each
//       device (a new slab each: the daemon creates and hands over a new
//       handle) and prints "alloc D ok" or "alloc D error CODE MESSAGE" for
//       each, then "done", and holds its buffers until killed.
// Every line is flushed at once.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "client/lib/cpp/client.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(int, flood, 0, "raw HTTP/2 connections to open");
ABSL_FLAG(bool, settings, false, "print the daemon's SETTINGS_MAX_CONCURRENT_STREAMS");
ABSL_FLAG(bool, alloc_once, false, "allocate 4 KiB with a real client");
ABSL_FLAG(std::string, go_file, "", "wait for this file before allocating on --devices");
ABSL_FLAG(std::string, devices, "", "devices to allocate on, one new slab each");

namespace {

void Line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// The preface and an empty SETTINGS frame (length 0, type 4, no flags,
// stream 0).
const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const unsigned char kEmptySettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};

int ConnectRaw(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  (void)!send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL);
  (void)!send(fd, kEmptySettings, sizeof(kEmptySettings), MSG_NOSIGNAL);
  return fd;
}

// 1: the daemon answered, 0: it closed the connection, -1: neither within
// `ms`.
int Outcome(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return -1;
  char buf[64];
  const ssize_t n = recv(fd, buf, sizeof(buf), MSG_PEEK);
  return n > 0 ? 1 : 0;
}

void HoldForever() {
  for (;;) pause();
}

int Flood(const std::string& path, int n) {
  std::vector<int> fds;
  int refused_at_connect = 0;
  for (int i = 0; i < n; ++i) {
    const int fd = ConnectRaw(path);
    if (fd < 0) {
      ++refused_at_connect;
    } else {
      fds.push_back(fd);
    }
  }
  int open = 0, closed = refused_at_connect;
  for (int fd : fds) {
    const int o = Outcome(fd, 5000);
    if (o == 1) {
      ++open;
    } else {
      ++closed;
      close(fd);
    }
  }
  Line("open " + std::to_string(open) + " closed " + std::to_string(closed));
  HoldForever();
  return 0;
}

int Settings(const std::string& path) {
  const int fd = ConnectRaw(path);
  if (fd < 0 || Outcome(fd, 5000) != 1) {
    Line("no settings");
    return 1;
  }
  unsigned char head[9];
  if (recv(fd, head, sizeof(head), MSG_WAITALL) != 9 || head[3] != 4) {
    Line("no settings");
    return 1;
  }
  const size_t len = (size_t{head[0]} << 16) | (size_t{head[1]} << 8) | head[2];
  std::vector<unsigned char> body(len);
  if (len > 0 && recv(fd, body.data(), len, MSG_WAITALL) != static_cast<ssize_t>(len)) {
    Line("no settings");
    return 1;
  }
  long value = -1;
  for (size_t i = 0; i + 6 <= len; i += 6) {
    const int id = (body[i] << 8) | body[i + 1];
    const unsigned long v = (static_cast<unsigned long>(body[i + 2]) << 24) |
                            (static_cast<unsigned long>(body[i + 3]) << 16) |
                            (static_cast<unsigned long>(body[i + 4]) << 8) | body[i + 5];
    if (id == 3) value = static_cast<long>(v);  // SETTINGS_MAX_CONCURRENT_STREAMS
  }
  Line("max_concurrent_streams " + std::to_string(value));
  return 0;
}

std::string Refusal(const absl::Status& s) {
  return "error " + std::to_string(static_cast<int>(s.code())) + " " + std::string(s.message());
}

gpumem::v1::PlacementRequest On(const std::string& device) {
  gpumem::v1::PlacementRequest p;
  if (!device.empty()) p.add_devices(device);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_socket);
  if (absl::GetFlag(FLAGS_flood) > 0) return Flood(path, absl::GetFlag(FLAGS_flood));
  if (absl::GetFlag(FLAGS_settings)) return Settings(path);

  auto client = gpumem::client::Client::Connect(path);
  if (!client.ok()) {
    Line("connect " + Refusal(client.status()));
    return 1;
  }
  if (absl::GetFlag(FLAGS_alloc_once)) {
    auto b = (*client)->Allocate(4096);
    Line(b.ok() ? "alloc ok" : "alloc " + Refusal(b.status()));
    return b.ok() ? 0 : 1;
  }
  std::vector<gpumem::client::Buffer> held;
  auto first = (*client)->Allocate(4096, On("0"));
  if (!first.ok()) {
    Line("connect " + Refusal(first.status()));
    return 1;
  }
  held.push_back(*std::move(first));
  Line("connected");
  const std::string go = absl::GetFlag(FLAGS_go_file);
  struct stat st;
  for (int i = 0; i < 6000 && stat(go.c_str(), &st) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (absl::string_view d :
       absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipEmpty())) {
    auto b = (*client)->Allocate(4096, On(std::string(d)));
    Line("alloc " + std::string(d) + (b.ok() ? " ok" : " " + Refusal(b.status())));
    if (b.ok()) held.push_back(*std::move(b));
  }
  Line("done");
  HoldForever();
  return 0;
}
