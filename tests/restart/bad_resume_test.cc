// Hostile and broken input around a restart: re-presented blocks that are
// not the caller's or not as the daemon knows them, handles given back for
// another tenant's slab or that are not the slab's, stale session tokens,
// and an fd store holding names the daemon never gave or handles that do
// not match its records. Each is refused by name (or dropped, saying so),
// gains the caller nothing, and leaves the owner's memory intact.
//
// The owner here is this test process, speaking the raw protocol (gRPC
// stub and slab channel) so that it decides when, and whether, it gives a
// handle back; attackers are fork()ed children (some setuid to another
// tenant's uid) speaking the same protocol. Needs root.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fd_channel.h"
#include "common/fd_passing.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

namespace gpumem {
namespace {

using testing::FakeSystemd;

constexpr uid_t kOther = 65530;  // tenant "other"
constexpr uint64_t kMiB = uint64_t{1} << 20;

// Runs `body` in a fork()ed child (as `uid` unless 0) and returns its exit
// status: the child reports by exit code (0: as expected).
int InChild(uid_t uid, const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    if (uid != 0 && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(120);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
}

class BadResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run attackers as other uids";
    dir_ = testing::MakeTempDir();
    socket_ = dir_ + "/gpumemd.sock";
    const std::string config = dir_ + "/gpumemd.textproto";
    std::ofstream(config) << absl::StrCat(R"(
      tenant { name: "root" uids: 0 }
      tenant { name: "other" uids: )", kOther, R"( }
    )");
    args_ = {testing::RunfilePath("server/gpumemd"), "--socket=" + socket_,
             "--config=" + config, "--ledger=" + dir_ + "/ledger.db",
             "--state=" + dir_ + "/state", "--sim_devices=1x1GiB", "--slab_size=64MiB",
             "--restore_grace_seconds=60"};
  }
  void TearDown() override {
    if (channel_fd_ >= 0) close(channel_fd_);
    for (auto& [slab, fd] : held_fds_) close(fd);
    stub_.reset();
    systemd_.reset();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  void Start(bool fd_store) {
    if (systemd_ == nullptr) systemd_ = std::make_unique<FakeSystemd>(dir_, fd_store);
    ASSERT_TRUE(systemd_->Start(args_, socket_)) << systemd_->Log();
    Connect();
  }
  void Connect() {
    if (channel_fd_ >= 0) close(channel_fd_);
    absl::StatusOr<int> fd = ConnectFdChannel(socket_);
    ASSERT_TRUE(fd.ok()) << fd.status();
    channel_fd_ = *fd;
    ASSERT_TRUE(HelloFdChannel(channel_fd_).ok());
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stub_ = v1::GpuMemory::NewStub(
        grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args));
  }
  void Restart() {
    systemd_->Kill(SIGKILL);
    ASSERT_EQ(systemd_->Wait(), -SIGKILL);
    ASSERT_TRUE(systemd_->Start(args_, socket_)) << systemd_->Log();
    Connect();
  }

  // One block, its slab mapped here (the fd kept, as a client keeps it),
  // filled with `byte`.
  v1::Allocation Allocate(uint64_t size, char byte) {
    grpc::ClientContext ctx;
    v1::AllocateRequest req;
    req.set_size_bytes(size);
    v1::AllocateResponse resp;
    grpc::Status s = stub_->Allocate(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return {};
    const v1::Allocation a = resp.allocations(0);
    if (!held_fds_.count(a.slab_id())) {
      absl::StatusOr<SlabFd> fd = RequestSlabFd(channel_fd_, a.slab_id());
      EXPECT_TRUE(fd.ok()) << fd.status();
      held_fds_[a.slab_id()] = fd->fd;
      maps_[a.slab_id()] = static_cast<char*>(
          mmap(nullptr, fd->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd->fd, 0));
    }
    memset(maps_[a.slab_id()] + a.offset(), byte, size);
    return a;
  }
  bool Intact(const v1::Allocation& a, char byte) {
    const char* p = maps_[a.slab_id()] + a.offset();
    for (uint64_t i = 0; i < a.size_bytes(); ++i) {
      if (p[i] != byte) return false;
    }
    return true;
  }
  absl::StatusOr<v1::ResumeResponse> Resume(const std::vector<v1::Allocation>& claims) {
    grpc::ClientContext ctx;
    v1::ResumeRequest req;
    for (const v1::Allocation& a : claims) *req.add_allocations() = a;
    v1::ResumeResponse resp;
    grpc::Status s = stub_->Resume(&ctx, req, &resp);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                     s.error_message());
    return resp;
  }
  grpc::StatusCode FreeCode(uint64_t id) {
    grpc::ClientContext ctx;
    v1::FreeRequest req;
    req.set_id(id);
    v1::FreeResponse resp;
    return stub_->Free(&ctx, req, &resp).error_code();
  }

  std::string dir_, socket_;
  std::vector<std::string> args_;
  std::unique_ptr<FakeSystemd> systemd_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
  int channel_fd_ = -1;
  std::map<uint64_t, int> held_fds_;
  std::map<uint64_t, char*> maps_;
};

// Another process (of this tenant or another) re-presents this one's
// blocks: each is refused by id (PERMISSION_DENIED to root, which may know;
// to another uid NOT_FOUND, exactly as an id that does not exist), none
// becomes its, and
// none is freed as its orphan; claims that misstate a block's place are
// refused FAILED_PRECONDITION and change nothing.
TEST_F(BadResumeTest, ClaimsOfOthersBlocksOrMisplacedBlocksGainNothing) {
  Start(/*fd_store=*/true);
  const v1::Allocation a = Allocate(4 * kMiB, 'a');
  const v1::Allocation b = Allocate(2 * kMiB, 'b');
  Restart();
  // (Root may free anyone's block, so only the other tenant's Free is tried.)
  auto attack = [&](uid_t uid) {
    return InChild(uid, [&] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = v1::GpuMemory::NewStub(grpc::CreateCustomChannel(
          "unix:" + socket_, grpc::InsecureChannelCredentials(), args));
      grpc::ClientContext ctx;
      v1::ResumeRequest req;
      *req.add_allocations() = a;
      *req.add_allocations() = b;
      v1::ResumeResponse resp;
      if (!stub->Resume(&ctx, req, &resp).ok()) return 10;
      if (resp.kept_size() != 0 || resp.lost_size() != 2) return 11;
      const absl::StatusCode want =
          uid == 0 ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kNotFound;
      for (const auto& l : resp.lost()) {
        if (l.status().code() != static_cast<int>(want)) return 12;
        if (!absl::StrContains(l.status().message(), absl::StrCat(l.id()))) return 13;
      }
      if (uid != 0) {
        // The same words as for an id nobody has.
        grpc::ClientContext nctx;
        v1::ResumeRequest none;
        v1::Allocation made_up = a;
        made_up.set_id(a.id() + 1000000);
        *none.add_allocations() = made_up;
        v1::ResumeResponse nresp;
        if (!stub->Resume(&nctx, none, &nresp).ok() || nresp.lost_size() != 1) return 15;
        std::string theirs = resp.lost(0).status().message();
        std::string nobodys = nresp.lost(0).status().message();
        const std::string id = absl::StrCat(resp.lost(0).id());
        const std::string other = absl::StrCat(made_up.id());
        theirs.replace(theirs.find(id), id.size(), "N");
        nobodys.replace(nobodys.find(other), other.size(), "N");
        if (theirs != nobodys || nresp.lost(0).status().code() != resp.lost(0).status().code()) {
          return 16;
        }
      }
      if (uid == 0) return 0;
      // And it cannot free them either.
      grpc::ClientContext fctx;
      v1::FreeRequest f;
      f.set_id(a.id());
      v1::FreeResponse fr;
      return stub->Free(&fctx, f, &fr).ok() ? 14 : 0;
    });
  };
  EXPECT_EQ(attack(0), 0) << "another process of this tenant";
  EXPECT_EQ(attack(kOther), 0) << "a process of another tenant";

  // Our own claim, with a wrong offset for one block and b's place for a.
  v1::Allocation moved = a;
  moved.set_offset(a.offset() + 4096);
  v1::Allocation b_as_a = b;
  b_as_a.set_id(a.id());
  for (const v1::Allocation& bad : {moved, b_as_a}) {
    absl::StatusOr<v1::ResumeResponse> r = Resume({bad, b});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->lost_size(), 1);
    EXPECT_EQ(r->lost(0).id(), a.id());
    EXPECT_EQ(r->lost(0).status().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
    EXPECT_EQ(r->unclaimed(), 1u) << "a misstated block is not claimed, nor freed";
  }
  // The true claim keeps both; they are intact and free normally.
  absl::StatusOr<v1::ResumeResponse> r = Resume({a, b});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kept_size(), 2);
  EXPECT_TRUE(Intact(a, 'a'));
  EXPECT_TRUE(Intact(b, 'b'));
  EXPECT_EQ(FreeCode(a.id()), grpc::StatusCode::OK);
  EXPECT_EQ(FreeCode(b.id()), grpc::StatusCode::OK);
}

// Two clients of one process share its session and each re-presents only
// its own blocks: neither Resume frees the other's; a block no client
// claims within the grace time is freed then, and only it.
TEST_F(BadResumeTest, EachClientClaimsItsOwnAndWhatNoneClaimsIsFreedAfterTheGrace) {
  args_.back() = "--restore_grace_seconds=2";
  Start(/*fd_store=*/true);
  const v1::Allocation a = Allocate(4 * kMiB, 'a');
  const v1::Allocation b = Allocate(2 * kMiB, 'b');
  const v1::Allocation c = Allocate(1 * kMiB, 'c');
  Restart();
  absl::StatusOr<v1::ResumeResponse> first = Resume({a});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->kept_size(), 1);
  EXPECT_EQ(first->unclaimed(), 2u);
  absl::StatusOr<v1::ResumeResponse> second = Resume({b});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->kept_size(), 1);
  EXPECT_EQ(second->unclaimed(), 1u);
  auto used = [&] {
    grpc::ClientContext ctx;
    v1::GetStatsRequest req;
    v1::GetStatsResponse resp;
    EXPECT_TRUE(stub_->GetStats(&ctx, req, &resp).ok());
    uint64_t sum = 0;
    for (const auto& d : resp.devices()) sum += d.used_bytes();
    return sum;
  };
  EXPECT_EQ(used(), 7 * kMiB) << "nothing is freed before the grace time ends";
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (used() != 6 * kMiB && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(used(), 6 * kMiB) << "the unclaimed block is freed after the grace time";
  EXPECT_EQ(FreeCode(c.id()), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Intact(a, 'a'));
  EXPECT_TRUE(Intact(b, 'b'));
  EXPECT_EQ(FreeCode(a.id()), grpc::StatusCode::OK);
  EXPECT_EQ(FreeCode(b.id()), grpc::StatusCode::OK);
}

// Without the fd store the slab waits for its handle: another tenant, or a
// process it was never given to, giving it (even the real fd) is refused; a
// file that is not the slab's is
// refused; an fd-less give is INVALID_ARGUMENT; the owner's real fd is taken.
TEST_F(BadResumeTest, HandlesGivenBackAreCheckedAgainstTheSlab) {
  Start(/*fd_store=*/false);
  const v1::Allocation a = Allocate(8 * kMiB, 'x');
  const int real_fd = held_fds_[a.slab_id()];
  Restart();
  absl::StatusOr<v1::ResumeResponse> r = Resume({a});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kept_size(), 1);
  ASSERT_EQ(r->needs_handle_size(), 1);
  EXPECT_EQ(r->needs_handle(0), a.slab_id());

  auto give_as = [&](uid_t uid, int fd) {
    return InChild(uid, [&] {
      absl::StatusOr<int> ch = ConnectFdChannel(socket_);
      if (!ch.ok() || !HelloFdChannel(*ch).ok()) return 20;
      absl::Status s = GiveSlabFd(*ch, a.slab_id(), fd);
      return static_cast<int>(s.code());
    });
  };
  EXPECT_EQ(give_as(kOther, real_fd), static_cast<int>(absl::StatusCode::kNotFound))
      << "another tenant's slab: to it, no slab at all";
  EXPECT_EQ(give_as(0, real_fd), static_cast<int>(absl::StatusCode::kPermissionDenied))
      << "a process of this tenant the slab's handle was never given to";
  const int impostor = memfd_create("impostor", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(impostor, 64 * kMiB), 0);
  absl::Status wrong = GiveSlabFd(channel_fd_, a.slab_id(), impostor);
  close(impostor);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied) << wrong;
  EXPECT_TRUE(absl::StrContains(wrong.message(), "not slab")) << wrong;
  // No fd attached: INVALID_ARGUMENT, and the channel keeps working.
  {
    SlabRequest req = {};
    memcpy(req.magic, kFdChannelMagic, 4);
    req.version = kFdChannelVersion;
    req.op = static_cast<uint16_t>(SlabOp::kGiveSlab);
    req.slab_id = a.slab_id();
    ASSERT_TRUE(WriteAll(channel_fd_, &req, sizeof(req)).ok());
    SlabResponse resp = {};
    int got = -1;
    ASSERT_TRUE(RecvWithFd(channel_fd_, &resp, sizeof(resp), &got).ok());
    EXPECT_EQ(resp.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
    std::string msg(resp.message_len, '\0');
    ASSERT_TRUE(ReadAll(channel_fd_, msg.data(), msg.size()).ok());
  }
  EXPECT_TRUE(GiveSlabFd(channel_fd_, a.slab_id(), real_fd).ok());
  EXPECT_TRUE(Intact(a, 'x'));
  EXPECT_EQ(FreeCode(a.id()), grpc::StatusCode::OK);
}

// Session tokens nobody was given, or of a session bound already, are
// refused; a rebind past the size limit loses the channel.
TEST_F(BadResumeTest, StaleOrMadeUpSessionTokensAreRefused) {
  Start(/*fd_store=*/true);
  absl::StatusOr<int> ch = ConnectFdChannel(socket_);
  ASSERT_TRUE(ch.ok());
  absl::Status s = RebindFdChannel(*ch, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  // The channel still serves: hello works after a refused rebind.
  EXPECT_TRUE(HelloFdChannel(*ch).ok());
  close(*ch);
  ch = ConnectFdChannel(socket_);
  ASSERT_TRUE(ch.ok());
  SlabRequest req = {};
  memcpy(req.magic, kFdChannelMagic, 4);
  req.version = kFdChannelVersion;
  req.op = static_cast<uint16_t>(SlabOp::kRebind);
  req.slab_id = 1 << 20;  // a "token" of 1 MiB
  ASSERT_TRUE(WriteAll(*ch, &req, sizeof(req)).ok());
  char byte;
  EXPECT_EQ(read(*ch, &byte, 1), 0) << "the daemon closes a malformed channel";
  close(*ch);
}

// The fd store may hold what gpumemd never put there, or handles that do
// not match its records: each is dropped or set aside with a log line, and
// what can be verified survives.
TEST_F(BadResumeTest, FdStoreNamesAndHandlesThatDoNotMatchAreReconciled) {
  Start(/*fd_store=*/true);
  const v1::Allocation a = Allocate(4 * kMiB, 'k');
  systemd_->Kill(SIGKILL);
  ASSERT_EQ(systemd_->Wait(), -SIGKILL);
  auto memfd = [](uint64_t size) {
    int fd = memfd_create("junk", MFD_CLOEXEC);
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
    return fd;
  };
  systemd_->Store("gpumemd-slab-abc", memfd(4096));
  systemd_->Store("gpumemd-slab-0", memfd(4096));
  systemd_->Store("gpumemd-slab-999999", memfd(64 * kMiB));
  systemd_->Store("gpumemd-bogus", memfd(4096));
  // The real slab's stored handle swapped for a look-alike of its size.
  ASSERT_TRUE(systemd_->StoredNames().size() >= 2);
  ASSERT_TRUE(systemd_->Start(args_, socket_)) << systemd_->Log();
  Connect();
  const std::string log = systemd_->Log();
  EXPECT_TRUE(absl::StrContains(log, "dropped \"gpumemd-slab-abc\"")) << log;
  EXPECT_TRUE(absl::StrContains(log, "dropped \"gpumemd-slab-0\"")) << log;
  EXPECT_TRUE(absl::StrContains(log, "dropped \"gpumemd-bogus\"")) << log;
  EXPECT_TRUE(absl::StrContains(log, "slab 999999 matches no recorded slab")) << log;
  for (const std::string& name : systemd_->StoredNames()) {
    EXPECT_FALSE(name == "gpumemd-slab-abc" || name == "gpumemd-slab-0" ||
                 name == "gpumemd-bogus")
        << name << " is removed from the store";
  }
  absl::StatusOr<v1::ResumeResponse> r = Resume({a});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kept_size(), 1);
  EXPECT_TRUE(Intact(a, 'k'));
  EXPECT_EQ(FreeCode(a.id()), grpc::StatusCode::OK);
}

// A stored handle that is not the recorded slab's (same size, another
// file) is refused by the backend: the slab waits for its owner to give the
// real one back, and survives.
TEST_F(BadResumeTest, AStoredHandleThatIsNotTheSlabsWaitsForTheOwner) {
  Start(/*fd_store=*/true);
  const v1::Allocation a = Allocate(4 * kMiB, 'q');
  systemd_->Kill(SIGKILL);
  ASSERT_EQ(systemd_->Wait(), -SIGKILL);
  const std::string name = absl::StrCat("gpumemd-slab-", a.slab_id());
  // What systemd would do after FDSTOREREMOVE + a hostile FDSTORE: swap it.
  systemd_->Pump();
  FakeSystemd& sd = *systemd_;
  std::vector<std::string> names = sd.StoredNames();
  ASSERT_NE(std::find(names.begin(), names.end(), name), names.end());
  sd.DropStore();
  int lookalike = memfd_create("lookalike", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(lookalike, 64 * kMiB), 0);
  sd.Store(name, lookalike);
  ASSERT_TRUE(sd.Start(args_, socket_)) << sd.Log();
  Connect();
  EXPECT_TRUE(absl::StrContains(sd.Log(), "its kept handle was refused")) << sd.Log();
  absl::StatusOr<v1::ResumeResponse> r = Resume({a});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kept_size(), 1);
  ASSERT_EQ(r->needs_handle_size(), 1);
  EXPECT_TRUE(GiveSlabFd(channel_fd_, a.slab_id(), held_fds_[a.slab_id()]).ok());
  EXPECT_TRUE(Intact(a, 'q'));
  EXPECT_EQ(FreeCode(a.id()), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace gpumem
