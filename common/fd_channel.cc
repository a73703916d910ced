#include "common/fd_channel.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"

namespace gpumem {

absl::StatusOr<int> ConnectFdChannel(const std::string& socket_path) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path too long: ", socket_path));
  }
  memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to gpumemd at ", socket_path, ": ", strerror(e),
        " (is the daemon running? set --socket or GPUMEMD_SOCKET)"));
  }
  return fd;
}

namespace {

// One request and its response; *fd gets an attached fd (else -1).
// `give_fd` is attached to the request; `payload` follows it. *answered
// (when given) says whether the daemon's response header arrived.
absl::Status Call(int channel, SlabOp op, uint64_t slab_id, SlabResponse* resp,
                  int* fd, int give_fd = -1, const std::string& payload = "",
                  bool* answered = nullptr) {
  if (answered != nullptr) *answered = false;
  SlabRequest req;
  memcpy(req.magic, kFdChannelMagic, 4);
  req.version = kFdChannelVersion;
  req.op = static_cast<uint16_t>(op);
  req.slab_id = slab_id;
  std::string bytes(reinterpret_cast<const char*>(&req), sizeof(req));
  bytes += payload;
  absl::Status s = give_fd >= 0 ? SendWithFd(channel, bytes.data(), bytes.size(), give_fd)
                                : WriteAll(channel, bytes.data(), bytes.size());
  if (!s.ok()) return s;
  s = RecvWithFd(channel, resp, sizeof(*resp), fd);
  if (!s.ok()) return s;
  if (answered != nullptr) *answered = true;
  if (resp->code == 0) return absl::OkStatus();
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  if (resp->message_len > kFdChannelMaxMessage) {
    return absl::InternalError("slab channel: oversized error message");
  }
  std::string message(resp->message_len, '\0');
  s = ReadAll(channel, message.data(), message.size());
  if (!s.ok()) return s;
  return absl::Status(static_cast<absl::StatusCode>(resp->code), message);
}

}  // namespace

absl::StatusOr<std::string> HelloFdChannel(int channel, bool* answered) {
  SlabResponse resp;
  int fd = -1;
  absl::Status s = Call(channel, SlabOp::kHello, 0, &resp, &fd, -1, "", answered);
  if (fd >= 0) close(fd);
  if (!s.ok()) return s;
  if (resp.message_len > kFdChannelMaxMessage) {
    return absl::InternalError("slab channel: oversized token");
  }
  std::string token(resp.message_len, '\0');
  s = ReadAll(channel, token.data(), token.size());
  if (!s.ok()) return s;
  return token;
}

bool IsFdChannelGoodbye(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         status.message() == kFdChannelGoodbye;
}

bool ReadFdChannelGoodbye(int channel) {
  char buf[sizeof(SlabResponse) + sizeof(kFdChannelGoodbye)];
  const ssize_t n = recv(channel, buf, sizeof(buf), MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(sizeof(SlabResponse) + sizeof(kFdChannelGoodbye) - 1)) {
    return false;
  }
  SlabResponse resp;
  memcpy(&resp, buf, sizeof(resp));
  return resp.slab_size == kFdChannelGoodbyeMark &&
         memcmp(buf + sizeof(resp), kFdChannelGoodbye, sizeof(kFdChannelGoodbye) - 1) == 0;
}

absl::Status GiveSlabFd(int channel, uint64_t slab_id, int fd) {
  if (fd < 0) return absl::InvalidArgumentError("no fd to give");
  SlabResponse resp;
  int got = -1;
  absl::Status s = Call(channel, SlabOp::kGiveSlab, slab_id, &resp, &got, fd);
  if (got >= 0) close(got);
  return s;
}

absl::Status RebindFdChannel(int channel, const std::string& token) {
  if (token.empty() || token.size() > kFdChannelMaxMessage) {
    return absl::InvalidArgumentError("a session token is 1 to 1024 bytes");
  }
  SlabResponse resp;
  int got = -1;
  absl::Status s = Call(channel, SlabOp::kRebind, token.size(), &resp, &got, -1, token);
  if (got >= 0) close(got);
  if (!s.ok()) return s;
  if (resp.message_len > kFdChannelMaxMessage) {
    return absl::InternalError("slab channel: oversized token");
  }
  std::string answered(resp.message_len, '\0');
  return ReadAll(channel, answered.data(), answered.size());
}

absl::StatusOr<SlabFd> RequestSlabFd(int channel, uint64_t slab_id) {
  SlabResponse resp;
  int fd = -1;
  absl::Status s = Call(channel, SlabOp::kOpenSlab, slab_id, &resp, &fd);
  if (!s.ok()) return s;
  if (fd < 0) return absl::InternalError("slab channel: reply without an fd");
  return SlabFd{fd, resp.slab_size};
}

absl::StatusOr<RingFds> OpenRingFdChannel(int channel, uint32_t slots) {
  SlabRequest req;
  memcpy(req.magic, kFdChannelMagic, 4);
  req.version = kFdChannelVersion;
  req.op = static_cast<uint16_t>(SlabOp::kOpenRing);
  req.slab_id = slots;
  absl::Status s = WriteAll(channel, &req, sizeof(req));
  if (!s.ok()) return s;
  SlabResponse resp;
  int fds[kMaxFdsPerMessage];
  int count = 0;
  s = RecvWithFds(channel, &resp, sizeof(resp), fds, &count);
  if (!s.ok()) return s;
  auto close_fds = [&] {
    for (int i = 0; i < count; ++i) close(fds[i]);
  };
  if (resp.code != 0) {
    close_fds();
    if (resp.message_len > kFdChannelMaxMessage) {
      return absl::InternalError("slab channel: oversized error message");
    }
    std::string message(resp.message_len, '\0');
    s = ReadAll(channel, message.data(), message.size());
    if (!s.ok()) return s;
    return absl::Status(static_cast<absl::StatusCode>(resp.code), message);
  }
  if (count != 2) {
    close_fds();
    return absl::InternalError("slab channel: a ring's answer without its two fds");
  }
  return RingFds{fds[0], fds[1]};
}

absl::Status CloseSlabFd(int channel, uint64_t slab_id) {
  SlabResponse resp;
  int fd = -1;
  absl::Status s = Call(channel, SlabOp::kCloseSlab, slab_id, &resp, &fd);
  if (fd >= 0) close(fd);
  return s;
}

}  // namespace gpumem
