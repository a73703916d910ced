// The request ring (server/service/ring_transport.h) against a real daemon,
// through a raw client: the slab channel (ConnectFdChannel, HelloFdChannel,
// OpenRingFdChannel), RingRegion::Attach and RingSubmitter, with gRPC beside
// it to compare answers. Checked: an Allocate and a Free over the ring act
// on the caller's session as gRPC's do; a quota refusal reads the same on
// both; garbage, an unknown kind and a slot claiming too many bytes are
// INVALID_ARGUMENT and the ring keeps serving; one ring per session;
// another uid's process cannot free the block through its own ring; a
// client killed holding a ring and a block gives both back; a waiting
// Allocate over the ring is answered when memory frees, with no daemon
// thread held meanwhile; --request_rings=false refuses the ring.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/lib/ring/ring_submitter.h"
#include "common/fd_channel.h"
#include "common/ring/request_ring.h"
#include "common/ring/ring_kinds.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::DaemonProcess;
using testing::PollUntil;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kOtherUid = 65534;
constexpr absl::Duration kCallTimeout = absl::Seconds(60);  // a hang guard

// One raw ring client: a slab channel with its hello done, and a ring.
struct RingClient {
  int channel = -1;
  std::unique_ptr<RingRegion> region;
  std::unique_ptr<RingSubmitter> submitter;

  ~RingClient() {
    submitter.reset();
    region.reset();
    if (channel >= 0) close(channel);
  }

  // Connects and says hello; then OpenRing.
  absl::Status Connect(const std::string& socket) {
    absl::StatusOr<int> fd = ConnectFdChannel(socket);
    if (!fd.ok()) return fd.status();
    channel = *fd;
    return HelloFdChannel(channel).status();
  }
  absl::Status OpenRing(uint32_t slots = 0) {
    absl::StatusOr<RingFds> fds = OpenRingFdChannel(channel, slots);
    if (!fds.ok()) return fds.status();
    absl::StatusOr<std::unique_ptr<RingRegion>> r = RingRegion::Attach(fds->memfd, fds->eventfd);
    if (!r.ok()) return r.status();
    region = *std::move(r);
    submitter = std::make_unique<RingSubmitter>(region.get());
    return absl::OkStatus();
  }

  // A call; a status other than OK carries the daemon's message.
  absl::StatusOr<std::string> Call(uint32_t kind, const std::string& bytes) {
    absl::StatusOr<RingAnswer> a = submitter->Call(kind, bytes, kCallTimeout);
    if (!a.ok()) return absl::InternalError(absl::StrCat("the call itself: ", a.status().ToString()));
    if (a->code != absl::StatusCode::kOk) return absl::Status(a->code, a->bytes);
    return a->bytes;
  }
  absl::StatusOr<v1::AllocateResponse> Allocate(const v1::AllocateRequest& r) {
    absl::StatusOr<std::string> bytes = Call(kRingAllocate, r.SerializeAsString());
    if (!bytes.ok()) return bytes.status();
    v1::AllocateResponse out;
    if (!out.ParseFromString(*bytes)) return absl::InternalError("not an AllocateResponse");
    return out;
  }
  absl::StatusOr<v1::FreeResponse> Free(uint64_t id) {
    v1::FreeRequest r;
    r.set_id(id);
    absl::StatusOr<std::string> bytes = Call(kRingFree, r.SerializeAsString());
    if (!bytes.ok()) return bytes.status();
    v1::FreeResponse out;
    if (!out.ParseFromString(*bytes)) return absl::InternalError("not a FreeResponse");
    return out;
  }
};

v1::AllocateRequest AllocateOf(uint64_t bytes, uint32_t wait_ms = 0) {
  v1::AllocateRequest r;
  r.set_size_bytes(bytes);
  r.set_wait_ms(wait_ms);
  return r;
}

class RingTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void TearDown() override {
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
    }
  }

  void Start(std::vector<std::string> extra) {
    dir_ = testing::MakeTempDir();
    const std::string config = dir_ + "/gpumemd.textproto";
    std::ofstream(config) << absl::StrCat(R"(
      tenant { name: "me" uids: )", getuid(), R"( quota { total_bytes: "32MiB" } }
      tenant { name: "other" uids: )", kOtherUid, R"( }
    )");
    std::vector<std::string> args = {"--sim_devices=1x64MiB", "--slab_size=64MiB",
                                     "--ledger=none", "--config=" + config};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
    stub_ = v1::GpuMemory::NewStub(
        grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
  }

  absl::StatusOr<v1::AllocateResponse> GrpcAllocate(const v1::AllocateRequest& r) {
    grpc::ClientContext ctx;
    v1::AllocateResponse out;
    grpc::Status s = stub_->Allocate(&ctx, r, &out);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return out;
  }
  absl::Status GrpcFree(uint64_t id) {
    grpc::ClientContext ctx;
    v1::FreeRequest r;
    r.set_id(id);
    v1::FreeResponse out;
    grpc::Status s = stub_->Free(&ctx, r, &out);
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  // Live allocations of process `pid`'s session; nullopt when it has none.
  std::optional<uint64_t> AllocationsOf(pid_t pid) {
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    EXPECT_TRUE(stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    for (const auto& s : stats.sessions()) {
      if (s.pid() == pid) return s.allocation_count();
    }
    return std::nullopt;
  }
  uint64_t Used() {
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    EXPECT_TRUE(stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    uint64_t used = 0;
    for (const auto& d : stats.devices()) used += d.used_bytes();
    return used;
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
};

// Runs `child` in a forked process (raw syscalls and the ring only: no gRPC,
// no threads) whose stdout is a pipe; returns its pid and the pipe's read end.
std::pair<pid_t, int> Fork(const std::function<void(int out)>& child) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {-1, -1};
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    child(pipe_fds[1]);
    _exit(0);
  }
  close(pipe_fds[1]);
  return {pid, pipe_fds[0]};
}

// The daemon's fds of request rings: memfds named gpumemd-ring, and
// eventfds (the daemon's own: its poller's two, its listener's).
std::pair<int, int> RingFdsOf(pid_t pid) {
  int memfds = 0;
  int eventfds = 0;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (target.find("memfd:gpumemd-ring") != std::string::npos) ++memfds;
    if (target.find("[eventfd]") != std::string::npos) ++eventfds;
  }
  return {memfds, eventfds};
}

void Say(int out, const std::string& line) {
  const std::string l = line + "\n";
  (void)!write(out, l.data(), l.size());
}

std::string ReadLine(int in) {
  std::string line;
  char c;
  while (read(in, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

TEST_F(RingTransportTest, AllocateAndFreeActOnTheSessionAsGrpcDoes) {
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  ASSERT_TRUE(ring.OpenRing().ok());
  EXPECT_EQ(ring.region->slot_count(), kDefaultRingSlots);

  absl::StatusOr<v1::AllocateResponse> a = ring.Allocate(AllocateOf(4 * kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 1);
  EXPECT_EQ(AllocationsOf(getpid()), 1u);
  EXPECT_EQ(Used(), 4 * kMiB);

  absl::StatusOr<v1::FreeResponse> f = ring.Free(a->allocations(0).id());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->freed_bytes(), 4 * kMiB);
  EXPECT_EQ(AllocationsOf(getpid()), 0u);
  EXPECT_EQ(Used(), 0u);

  // A block allocated over gRPC is freed over the ring, and the other way.
  absl::StatusOr<v1::AllocateResponse> g = GrpcAllocate(AllocateOf(kMiB));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(ring.Free(g->allocations(0).id()).ok());
  a = ring.Allocate(AllocateOf(kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(GrpcFree(a->allocations(0).id()).ok());
  // A second free reads as gRPC's.
  absl::StatusOr<v1::FreeResponse> again = ring.Free(a->allocations(0).id());
  absl::Status grpc_again = GrpcFree(a->allocations(0).id());
  EXPECT_EQ(again.status().code(), grpc_again.code());
  EXPECT_EQ(again.status().message(), grpc_again.message());
}

TEST_F(RingTransportTest, RefusalsReadAsOverGrpc) {
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  ASSERT_TRUE(ring.OpenRing(8).ok());
  EXPECT_EQ(ring.region->slot_count(), 8u);
  for (const v1::AllocateRequest& r :
       {AllocateOf(48 * kMiB) /* over the quota */, AllocateOf(0) /* no size */}) {
    absl::StatusOr<v1::AllocateResponse> over_ring = ring.Allocate(r);
    absl::StatusOr<v1::AllocateResponse> over_grpc = GrpcAllocate(r);
    ASSERT_FALSE(over_grpc.ok());
    EXPECT_EQ(over_ring.status().code(), over_grpc.status().code());
    EXPECT_EQ(over_ring.status().message(), over_grpc.status().message());
  }
  EXPECT_EQ(Used(), 0u);
}

TEST_F(RingTransportTest, BadRequestsAreInvalidAndTheRingKeepsServing) {
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  ASSERT_TRUE(ring.OpenRing(4).ok());

  // A slot claiming more bytes than a slot holds, written by hand.
  RingSlot* slot = ring.region->slot(3);
  slot->seq.store(77);
  slot->kind.store(kRingAllocate);
  slot->length.store(100000);
  slot->state.store(kSlotRequest);
  ring.region->RingDoorbell();
  ASSERT_TRUE(PollUntil([&] { return slot->state.load() == kSlotAnswer; }));
  EXPECT_EQ(slot->status.load(), static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  slot->state.store(kSlotFree);

  absl::StatusOr<std::string> garbage = ring.Call(kRingAllocate, std::string("\xff\xff\xff", 3));
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument) << garbage.status();
  garbage = ring.Call(kRingFree, std::string("\x0a\xff", 2));
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument) << garbage.status();
  absl::StatusOr<std::string> unknown = ring.Call(99, "");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  EXPECT_NE(unknown.status().message().find("unknown kind 99"), std::string::npos);

  absl::StatusOr<v1::AllocateResponse> a = ring.Allocate(AllocateOf(kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(ring.Free(a->allocations(0).id()).ok());
}

TEST_F(RingTransportTest, OneRingPerSession) {
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  ASSERT_TRUE(ring.OpenRing().ok());
  absl::StatusOr<RingFds> second = OpenRingFdChannel(ring.channel, 0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  // The same process on another channel is the same session.
  RingClient other_channel;
  ASSERT_TRUE(other_channel.Connect(daemon_->socket()).ok());
  EXPECT_EQ(other_channel.OpenRing().code(), absl::StatusCode::kAlreadyExists);
  // The first ring still serves.
  absl::StatusOr<v1::AllocateResponse> a = ring.Allocate(AllocateOf(kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(ring.Free(a->allocations(0).id()).ok());
}

TEST_F(RingTransportTest, AnotherUidCannotFreeTheBlockThroughItsRing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  ASSERT_TRUE(ring.OpenRing().ok());
  absl::StatusOr<v1::AllocateResponse> a = ring.Allocate(AllocateOf(kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t id = a->allocations(0).id();
  const std::string socket = daemon_->socket();
  auto [pid, in] = Fork([&](int out) {
    if (setgid(kOtherUid) != 0 || setuid(kOtherUid) != 0) {
      Say(out, "setuid failed");
      return;
    }
    RingClient theirs;
    absl::Status s = theirs.Connect(socket);
    if (s.ok()) s = theirs.OpenRing();
    if (!s.ok()) {
      Say(out, "ring " + s.ToString());
      return;
    }
    Say(out, theirs.Free(id).status().ToString());
    Say(out, theirs.Free(id + 1000000).status().ToString());
  });
  ASSERT_GT(pid, 0);
  const std::string of_another = ReadLine(in);
  const std::string unknown = ReadLine(in);
  close(in);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(of_another.rfind("NOT_FOUND", 0) == 0) << of_another;
  EXPECT_TRUE(unknown.rfind("NOT_FOUND", 0) == 0) << unknown;
  EXPECT_EQ(AllocationsOf(getpid()), 1u);
  EXPECT_TRUE(ring.Free(id).ok());
}

TEST_F(RingTransportTest, AKilledClientGivesBackItsRingAndItsMemory) {
  const auto [memfds_before, eventfds_before] = RingFdsOf(daemon_->pid());
  EXPECT_EQ(memfds_before, 0);
  const std::string socket = daemon_->socket();
  auto [pid, in] = Fork([&](int out) {
    RingClient mine;
    absl::Status s = mine.Connect(socket);
    if (s.ok()) s = mine.OpenRing();
    absl::StatusOr<v1::AllocateResponse> a =
        s.ok() ? mine.Allocate(AllocateOf(8 * kMiB)) : absl::StatusOr<v1::AllocateResponse>(s);
    Say(out, a.ok() ? "allocated" : a.status().ToString());
    pause();
  });
  ASSERT_GT(pid, 0);
  ASSERT_EQ(ReadLine(in), "allocated");
  close(in);
  EXPECT_EQ(RingFdsOf(daemon_->pid()), std::make_pair(1, eventfds_before + 1));
  EXPECT_EQ(AllocationsOf(pid), 1u);
  EXPECT_EQ(Used(), 8 * kMiB);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(PollUntil([&] { return Used() == 0 && !AllocationsOf(pid).has_value(); }));
  // The ring's memfd and eventfd are closed in the daemon.
  EXPECT_TRUE(PollUntil([&] {
    return RingFdsOf(daemon_->pid()) == std::make_pair(0, eventfds_before);
  }));
}

TEST_F(RingTransportTest, AWaitingAllocateHoldsNoThreadAndIsAnsweredWhenMemoryFrees) {
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  ASSERT_TRUE(ring.OpenRing().ok());
  absl::StatusOr<v1::AllocateResponse> first = GrpcAllocate(AllocateOf(28 * kMiB));
  ASSERT_TRUE(first.ok()) << first.status();
  const int threads = testing::ThreadCountBesidesGrpcTimers(daemon_->pid());
  // Three waiters, more than the ring's workers (2): each 6 MiB is over
  // the quota (32 MiB) beside the first block, all three fit without it.
  constexpr int kWaiters = 3;
  std::vector<absl::StatusOr<v1::AllocateResponse>> waited(kWaiters,
                                                           absl::UnknownError("unset"));
  std::atomic<int> answered{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kWaiters; ++i) {
    callers.emplace_back([&, i] {
      waited[i] = ring.Allocate(AllocateOf(6 * kMiB, 50000));
      answered.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(answered.load(), 0);
  // The workers are free: another call over the ring is served meanwhile.
  absl::StatusOr<v1::AllocateResponse> small = ring.Allocate(AllocateOf(kMiB));
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(ring.Free(small->allocations(0).id()).ok());
  EXPECT_EQ(answered.load(), 0);
  EXPECT_LE(testing::ThreadCountBesidesGrpcTimers(daemon_->pid()), threads);
  // Memory frees: every waiter is answered.
  ASSERT_TRUE(GrpcFree(first->allocations(0).id()).ok());
  for (std::thread& t : callers) t.join();
  for (const auto& w : waited) {
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(ring.Free(w->allocations(0).id()).ok());
  }
  EXPECT_EQ(Used(), 0u);
}

TEST_F(RingTransportTest, RingsOffRefuseTheRing) {
  ASSERT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  daemon_.reset();
  Start({"--request_rings=false"});
  RingClient ring;
  ASSERT_TRUE(ring.Connect(daemon_->socket()).ok());
  absl::Status s = ring.OpenRing();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "request rings are off (--request_rings=false)");
  // The channel still serves.
  EXPECT_TRUE(HelloFdChannel(ring.channel).ok());
}

}  // namespace
}  // namespace gpumem
