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
  if (len == 0) return absl::InternalError("SendWithFd needs a payload");
  if (fd < 0) return WriteAll(sock, data, len);
  struct iovec iov;
  iov.iov_base = const_cast<void*>(data);
  iov.iov_len = len;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  memset(control, 0, sizeof(control));
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("sendmsg");
  // The fd went with the first byte; the rest of the payload, if the kernel
  // took only part of it, follows as plain data.
  return WriteAll(sock, static_cast<const char*>(data) + n,
                  len - static_cast<size_t>(n));
}

absl::Status RecvWithFd(int sock, void* data, size_t len, int* fd) {
  *fd = -1;
  struct iovec iov;
  iov.iov_base = data;
  iov.iov_len = len;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
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
  if (n == 0) return absl::UnavailableError("recvmsg: peer closed");
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return absl::InternalError("recvmsg: control data truncated");
  }
  absl::Status rest = ReadAll(sock, static_cast<char*>(data) + n,
                              len - static_cast<size_t>(n));
  if (!rest.ok() && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return rest;
}

}  // namespace gpumem
