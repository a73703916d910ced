// File descriptors really cross a Unix socket, with their payload, and the
// slab channel's error path carries the daemon's status.
#include "common/fd_passing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "common/fd_channel.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace {

TEST(FdPassingTest, AMemfdCrossesTheSocketAndSharesItsBytes) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int memfd = memfd_create("t", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, 4096), 0);
  const char payload[] = "slab 42";
  ASSERT_TRUE(SendWithFd(sv[0], payload, sizeof(payload), memfd).ok());

  char got[sizeof(payload)];
  int fd = -1;
  ASSERT_TRUE(RecvWithFd(sv[1], got, sizeof(got), &fd).ok());
  EXPECT_STREQ(got, payload);
  ASSERT_GE(fd, 0);
  EXPECT_NE(fd, memfd);
  EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);

  char* a = static_cast<char*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  char* b = static_cast<char*>(mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0));
  ASSERT_NE(a, MAP_FAILED);
  ASSERT_NE(b, MAP_FAILED);
  strcpy(a + 100, "same bytes");
  EXPECT_STREQ(b + 100, "same bytes");
  munmap(a, 4096);
  munmap(b, 4096);
  close(fd);
  close(memfd);
  close(sv[0]);
  close(sv[1]);
}

TEST(FdPassingTest, PlainMessagesAndClosedPeers) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const char msg[] = "no fd";
  ASSERT_TRUE(SendWithFd(sv[0], msg, sizeof(msg), -1).ok());
  char got[sizeof(msg)];
  int fd = 123;
  ASSERT_TRUE(RecvWithFd(sv[1], got, sizeof(got), &fd).ok());
  EXPECT_EQ(fd, -1);
  close(sv[0]);
  absl::Status s = RecvWithFd(sv[1], got, sizeof(got), &fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  close(sv[1]);
}

TEST(FdChannelTest, ErrorRepliesCarryCodeAndMessage) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::thread server([fd = sv[1]] {
    SlabRequest req;
    ASSERT_TRUE(ReadAll(fd, &req, sizeof(req)).ok());
    EXPECT_EQ(memcmp(req.magic, kFdChannelMagic, 4), 0);
    EXPECT_EQ(req.slab_id, 77u);
    const std::string text = "slab 77 holds no block of uid 1000";
    SlabResponse resp = {};
    resp.code = static_cast<uint32_t>(absl::StatusCode::kPermissionDenied);
    resp.message_len = static_cast<uint32_t>(text.size());
    ASSERT_TRUE(WriteAll(fd, &resp, sizeof(resp)).ok());
    ASSERT_TRUE(WriteAll(fd, text.data(), text.size()).ok());
  });
  absl::StatusOr<SlabFd> got = RequestSlabFd(sv[0], 77);
  server.join();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(got.status().message(), "slab 77 holds no block of uid 1000");
  close(sv[0]);
  close(sv[1]);
}

TEST(FdChannelTest, ConnectingToNothingSaysWhatToDo) {
  absl::StatusOr<int> fd = ConnectFdChannel("/tmp/gpumemd-no-such-dir/x.sock");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fd.status().message().find("is the daemon running"), absl::string_view::npos);
}

}  // namespace
}  // namespace gpumem
