#include "common/fd_passing.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace {

absl::Status Errno(const char* what) {
  int e = errno;
  if (e == EPIPE || e == ECONNRESET) {
    return absl::UnavailableError(absl::StrCat(what, ": peer closed"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", strerror(e)));
}

}  // namespace

absl::Status WriteAll(int sock, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = send(sock, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("send");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int sock, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = recv(sock, p, len, 0);
    if (n == 0) return absl::UnavailableError("recv: peer closed");
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("recv");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SendWithFd(int sock, const void* data, size_t len, int fd) {
  return SendWithFds(sock, data, len, &fd, fd >= 0 ? 1 : 0);
}

absl::Status SendWithFds(int sock, const void* data, size_t len, const int* fds, int count) {
  if (len == 0) return absl::InternalError("SendWithFds needs a payload");
  if (count <= 0) return WriteAll(sock, data, len);
  if (count > kMaxFdsPerMessage) return absl::InternalError("SendWithFds: too many fds");
  struct iovec iov;
  iov.iov_base = const_cast<void*>(data);
  iov.iov_len = len;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  memset(control, 0, sizeof(control));
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * count);
  memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * count);
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("sendmsg");
  // The fds went with the first byte; the rest of the payload, if the kernel
  // took only part of it, follows as plain data.
  return WriteAll(sock, static_cast<const char*>(data) + n,
                  len - static_cast<size_t>(n));
}

absl::Status RecvWithFd(int sock, void* data, size_t len, int* fd) {
  int fds[kMaxFdsPerMessage];
  int count = 0;
  absl::Status s = RecvWithFds(sock, data, len, fds, &count);
  *fd = fds[0];
  if (count > 1) {  // one was expected: not this caller's answer
    for (int i = 0; i < count; ++i) close(fds[i]);
    *fd = -1;
    if (s.ok()) return absl::InternalError("recvmsg: more fds than expected");
  }
  return s;
}

absl::Status RecvWithFds(int sock, void* data, size_t len, int fds[kMaxFdsPerMessage],
                         int* count) {
  *count = 0;
  for (int i = 0; i < kMaxFdsPerMessage; ++i) fds[i] = -1;
  auto close_all = [&] {
    for (int i = 0; i < *count; ++i) {
      close(fds[i]);
      fds[i] = -1;
    }
    *count = 0;
  };
  struct iovec iov;
  iov.iov_base = data;
  iov.iov_len = len;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("recvmsg");
  bool too_many = false;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t in_msg = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < in_msg; ++i) {
      int received;
      memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*count < kMaxFdsPerMessage) {
        fds[(*count)++] = received;
      } else {
        close(received);
        too_many = true;
      }
    }
  }
  if (n == 0) {
    close_all();
    return absl::UnavailableError("recvmsg: peer closed");
  }
  if ((msg.msg_flags & MSG_CTRUNC) || too_many) {
    close_all();
    return absl::InternalError("recvmsg: control data truncated");
  }
  absl::Status rest = ReadAll(sock, static_cast<char*>(data) + n,
                              len - static_cast<size_t>(n));
  if (!rest.ok()) close_all();
  return rest;
}

}  // namespace gpumem
