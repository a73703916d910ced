// GpuMemory.Stream against a real daemon: the same answers as the unary RPCs,
// many threads on one stream, the transport's UNIMPLEMENTED against a server
// without the stream (the client's cue to use unary), and bad input
// from other processes (stream_abuser): garbage, a reused request id, a
// client that stops reading, a stream closed mid-request. For each: a clear
// status or a closed stream, the abuser's memory reclaimed when it dies, and
// another client still served meanwhile.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "client/lib/cpp/client.h"
#include "client/lib/cpp/stream_transport.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_client_test.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
using client::Client;
using client::PlacementRefusalOf;
using client::StreamTransport;
namespace {

using Clock = std::chrono::steady_clock;
using testing::ChildProcess;

// A hang guard, not a property: a client that stops reading stalls once
// tens of thousands of answers fill the HTTP/2 windows, which a TSan build
// on two loaded cores was seen to take over 30 s to serve.
constexpr int kStallGuardMs = 180000;
using testing::DaemonClientTest;
using testing::PollUntil;

class StreamTest : public DaemonClientTest {
 protected:
  StreamTest() : DaemonClientTest({"--sim_devices=2x4GiB", "--slab_size=64MiB"}) {}

  std::unique_ptr<v1::GpuMemory::Stub> UnaryStub() {
    return v1::GpuMemory::NewStub(grpc::CreateChannel(
        "unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
  }

  // Live allocations of the session of process `pid` (0 when it has none).
  uint64_t AllocationsOf(pid_t pid) {
    auto stats = client_->GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) return 0;
    for (const auto& s : stats->sessions()) {
      if (s.pid() == pid) return s.allocation_count();
    }
    return 0;
  }

  // A stalled client's live allocations once they hold still for a second.
  // "stalled" is the client's view (its writes stopped getting through); the
  // daemon may still be working through what it had read (seconds, under
  // TSan), and no daemon-side figure says the stream is throttled. At most
  // 100,000: past that the stream is not throttled at all.
  uint64_t SettledAllocationsOf(pid_t pid) {
    uint64_t held = AllocationsOf(pid);
    int still = 0;
    EXPECT_TRUE(PollUntil([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const uint64_t now = AllocationsOf(pid);
      still = now == held ? still + 1 : 0;
      held = now;
      return still >= 5 || held >= 100000;
    })) << "the stalled client's allocations still grow after 60 s: " << held;
    return held;
  }

  // Median microseconds of 200 Allocate+Free pairs of this test's client.
  double PairMedianUs() {
    std::vector<double> us;
    for (int i = 0; i < 200; ++i) {
      auto t0 = Clock::now();
      auto a = client_->AllocateRaw(Request(4096));
      EXPECT_TRUE(a.ok()) << a.status();
      if (!a.ok()) break;
      EXPECT_TRUE(client_->Free(a->allocations(0).id()).ok());
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (us.empty()) return 1e9;
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

  static v1::AllocateRequest Request(uint64_t size) {
    v1::AllocateRequest r;
    r.set_size_bytes(size);
    return r;
  }

  std::unique_ptr<ChildProcess> Abuser(const std::string& mode, const std::string& go = "") {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        testing::RunfilePath("tests/integration/stream_abuser"),
        "--socket=" + daemon_->socket(), "--mode=" + mode, "--go_file=" + go});
  }

  // Other clients are served, not much slower than before the abuse (the
  // bound is loose: this machine is shared; a daemon blocked on the abuser
  // would not answer at all).
  void ExpectOthersServed(double baseline_us) {
    double during = PairMedianUs();
    EXPECT_LT(during, 20 * baseline_us + 5000) << "baseline " << baseline_us << " us";
  }

  // Kills the abuser and expects its session's memory back within 5 s.
  void KillAndExpectReclaimed(ChildProcess* abuser) {
    pid_t pid = abuser->pid();
    ASSERT_GT(AllocationsOf(pid), 0u);
    abuser->Kill(SIGKILL);
    abuser->Wait();
    // The session's row and the devices' used bytes may be updated at
    // different moments; both must come back.
    auto all_back = [&] {
      if (AllocationsOf(pid) != 0) return false;
      for (uint64_t used : UsedPerDevice()) {
        if (used != 0) return false;
      }
      return true;
    };
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!all_back() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(AllocationsOf(pid), 0u);
    for (uint64_t used : UsedPerDevice()) EXPECT_EQ(used, 0u);
  }
};

TEST_F(StreamTest, AnswersAreTheUnaryAnswers) {
  auto unary = UnaryStub();
  // Unknown id.
  absl::Status streamed = client_->Free(987654321);
  v1::FreeRequest free;
  free.set_id(987654321);
  v1::FreeResponse free_resp;
  grpc::ClientContext ctx;
  grpc::Status direct = unary->Free(&ctx, free, &free_resp);
  EXPECT_EQ(streamed.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(static_cast<int>(streamed.code()), static_cast<int>(direct.error_code()));
  EXPECT_EQ(streamed.message(), direct.error_message());
  // Placement refusal: its structured reasons travel on the stream too.
  v1::AllocateRequest big = Request(3ull << 30);
  big.mutable_placement()->add_devices("0");
  absl::StatusOr<v1::AllocateResponse> first = client_->AllocateRaw(big);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::AllocateResponse> refused = client_->AllocateRaw(big);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  std::optional<v1::PlacementRefusal> why = PlacementRefusalOf(refused.status());
  ASSERT_TRUE(why.has_value());
  ASSERT_EQ(why->devices_size(), 1);
  EXPECT_EQ(why->devices(0).reason(), v1::DeviceRefusal::REASON_CAPACITY);
  EXPECT_TRUE(client_->Free(first->allocations(0).id()).ok());
  // Success: same shape.
  auto a = client_->AllocateRaw(Request(1 << 20));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 1);
  EXPECT_EQ(a->allocations(0).size_bytes(), 1u << 20);
  auto session = client_->GetSession();
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(session->pid(), getpid());
  EXPECT_TRUE(client_->Free(a->allocations(0).id()).ok());
  EXPECT_EQ(client_->Free(a->allocations(0).id()).code(), absl::StatusCode::kNotFound);
}

TEST_F(StreamTest, ManyThreadsShareOneStream) {
  constexpr int kThreads = 8, kPairs = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPairs; ++i) {
        // Distinct sizes per thread: each must get its own answer back.
        const uint64_t size = 4096 * (t + 1);
        auto a = client_->AllocateRaw(Request(size));
        if (!a.ok() || a->allocations(0).size_bytes() != size ||
            !client_->Free(a->allocations(0).id()).ok()) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (uint64_t used : UsedPerDevice()) EXPECT_EQ(used, 0u);
}

// A daemon without the Stream method (an older one): only GetSession here.
class OldDaemon final : public v1::GpuMemory::Service {
 public:
  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest*,
                          v1::Session* resp) override {
    resp->set_session_id(77);
    return grpc::Status::OK;
  }
};

// Client::Connect needs a real daemon (the slab channel's hello), so the
// fall-back is checked at the transport: against a server without the
// stream it reports UNIMPLEMENTED and unsupported(), which is what makes
// Client use the unary stub, and that stub works on the same channel.
TEST_F(StreamTest, TransportReportsAServerWithoutTheStream) {
  const std::string socket = daemon_->dir() + "/old.sock";
  OldDaemon old;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&old);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  {
    auto stub = v1::GpuMemory::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    StreamTransport transport(stub.get());
    EXPECT_FALSE(transport.unsupported());
    EXPECT_EQ(transport.GetSession().status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_TRUE(transport.unsupported());
    // Later calls fail at once, without a new stream.
    EXPECT_EQ(transport.GetSession().status().code(), absl::StatusCode::kUnimplemented);
    grpc::ClientContext ctx;
    v1::Session session;
    ASSERT_TRUE(stub->GetSession(&ctx, v1::GetSessionRequest(), &session).ok());
    EXPECT_EQ(session.session_id(), 77u);
  }
  server->Shutdown();
}

// A waiting request through the library (which sends it unary: its call's
// deadline and cancellation are its own) is served once a free makes room.
// The stream's own waiting: stream_waiting_test.
TEST_F(StreamTest, WaitingRequestsThroughTheLibraryAreServed) {
  // Takes the whole device 0, then a waiting request is served once a free
  // makes room.
  v1::AllocateRequest all = Request(3ull << 30);
  all.mutable_placement()->add_devices("0");
  auto first = client_->AllocateRaw(all);
  ASSERT_TRUE(first.ok()) << first.status();
  v1::AllocateRequest wait = all;
  wait.set_wait_ms(20000);
  std::thread freer([&] {
    // Only once the daemon holds it waiting (a free before would test no
    // waiting at all).
    EXPECT_TRUE(PollUntil([&] {
      auto stats = client_->GetStats();
      return stats.ok() && stats->counters().waiting_requests() == 1;
    })) << "the request never waited";
    EXPECT_TRUE(client_->Free(first->allocations(0).id()).ok());
  });
  auto waited = client_->AllocateRaw(wait);
  freer.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_TRUE(client_->Free(waited->allocations(0).id()).ok());
}

TEST_F(StreamTest, GarbageEndsTheStreamWithInvalidArgument) {
  const double baseline = PairMedianUs();
  auto abuser = Abuser("garbage");
  std::string line = abuser->ReadLine();
  EXPECT_EQ(line.rfind("status 3 ", 0), 0u) << line;  // INVALID_ARGUMENT
  EXPECT_TRUE(absl::StrContains(line, "is not a gpumem.v1.StreamRequest")) << line;
  EXPECT_EQ(abuser->ReadLine(), "holding");
  ExpectOthersServed(baseline);
  KillAndExpectReclaimed(abuser.get());
}

TEST_F(StreamTest, ClientThatStopsReadingIsThrottledAlone) {
  const double baseline = PairMedianUs();
  auto abuser = Abuser("stop_reading");
  ASSERT_EQ(abuser->ReadLine(kStallGuardMs), "stalled");
  // The daemon stopped taking its requests: far fewer than it sent
  // (1,000,000) were carried out, and the count no longer grows.
  const uint64_t held = SettledAllocationsOf(abuser->pid());
  EXPECT_LT(held, 100000u);
  ExpectOthersServed(baseline);
  EXPECT_EQ(AllocationsOf(abuser->pid()), held);
  KillAndExpectReclaimed(abuser.get());
}

TEST_F(StreamTest, StreamClosedMidRequestFreesUndeliveredAnswers) {
  const double baseline = PairMedianUs();
  const std::string go = daemon_->dir() + "/cancel-now";
  auto abuser = Abuser("close_mid_request", go);
  ASSERT_EQ(abuser->ReadLine(kStallGuardMs), "stalled");
  const uint64_t before = SettledAllocationsOf(abuser->pid());
  std::ofstream(go).put('\n');
  ASSERT_EQ(abuser->ReadLine(), "cancelled");
  EXPECT_EQ(abuser->ReadLine(), "holding");
  // The answers queued in the daemon (64 by default) were never delivered:
  // their blocks are freed although the process lives on.
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (AllocationsOf(abuser->pid()) + 64 > before && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LE(AllocationsOf(abuser->pid()) + 64, before);
  ExpectOthersServed(baseline);
  KillAndExpectReclaimed(abuser.get());
}

// A device whose slab creation is slow (300 ms, as a real driver's
// cuMemCreate + map + memset of a large slab can be) holds up nobody else:
// the stream's queue thread hands such requests to a backend worker, so
// other streams, and other requests on the same stream, are answered
// meanwhile (out of order: answers carry their request ids).
class SlowDeviceStreamTest : public StreamTest {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<testing::DaemonProcess>(std::vector<std::string>{
        "--sim_devices=2x4GiB", "--slab_size=64MiB", "--sim_slab_create_delay=0:300ms"});
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
    auto c = Client::Connect(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  static v1::AllocateRequest On(uint32_t device, uint64_t size) {
    v1::AllocateRequest r = Request(size);
    r.mutable_placement()->add_devices(std::to_string(device));
    return r;
  }

  using Span = std::pair<Clock::time_point, Clock::time_point>;

  // Allocate+Free pairs on device 1 by `client` while `busy` is set: when
  // each began and ended.
  static std::vector<Span> PairsWhile(Client& client, const std::atomic<bool>& busy) {
    std::vector<Span> pairs;
    while (busy.load()) {
      auto t0 = Clock::now();
      auto a = client.AllocateRaw(On(1, 4096));
      EXPECT_TRUE(a.ok()) << a.status();
      if (!a.ok()) break;
      EXPECT_TRUE(client.Free(a->allocations(0).id()).ok());
      pairs.emplace_back(t0, Clock::now());
    }
    return pairs;
  }
};

TEST_F(SlowDeviceStreamTest, ASlowSlabCreationHoldsUpNoOtherRequest) {
  // Device 1's slab exists; every 64 MiB block on device 0 needs a new slab.
  auto warm = client_->AllocateRaw(On(1, 4096));
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(client_->Free(warm->allocations(0).id()).ok());

  // Blocks stay held to the end, so each round needs new slabs.
  std::vector<std::pair<Client*, uint64_t>> held;
  std::vector<std::unique_ptr<Client>> others;
  for (bool same_stream : {false, true}) {
    SCOPED_TRACE(same_stream ? "slow requests on this client's own stream"
                             : "slow requests on another client's stream");
    std::unique_ptr<Client> other;
    if (!same_stream) {
      auto c = Client::Connect(daemon_->socket());
      ASSERT_TRUE(c.ok()) << c.status();
      other = std::move(*c);
    }
    Client& slow_client = same_stream ? *client_ : *other;
    std::atomic<bool> busy{true};
    std::vector<Span> slow;
    std::vector<uint64_t> ids;
    std::thread slow_thread([&] {
      for (int i = 0; i < 3; ++i) {
        auto t0 = Clock::now();
        auto a = slow_client.AllocateRaw(On(0, 64 << 20));
        EXPECT_TRUE(a.ok()) << a.status();
        slow.emplace_back(t0, Clock::now());
        if (a.ok()) ids.push_back(a->allocations(0).id());
      }
      busy.store(false);
    });
    const std::vector<Span> pairs = PairsWhile(*client_, busy);
    slow_thread.join();
    auto ms = [](const Span& s) {
      return std::chrono::duration<double, std::milli>(s.second - s.first).count();
    };
    // Pairs begun and answered while a slow allocation was in flight. Served
    // inline (the queue thread creating the slab), a request that came
    // during a creation would be answered after it: none at all. Counted
    // rather than timed, so a loaded machine's stalls (TSan, two cores:
    // a 220 ms pause was seen) cannot fail it.
    int inside = 0;
    double worst = 0;
    for (const Span& p : pairs) {
      worst = std::max(worst, ms(p));
      for (const Span& w : slow) {
        if (w.first < p.first && p.second < w.second) {
          ++inside;
          break;
        }
      }
    }
    std::cerr << (same_stream ? "same stream" : "other stream") << ": slow allocations took "
              << ms(slow[0]) << ", " << ms(slow[1]) << ", " << ms(slow[2]) << " ms; "
              << pairs.size() << " pairs on device 1 meanwhile, " << inside
              << " of them within a slow one, worst " << worst << " ms\n";
    for (const Span& w : slow) EXPECT_GE(ms(w), 290.0);  // the delay is real
    EXPECT_GE(inside, 3);
    for (uint64_t id : ids) held.emplace_back(&slow_client, id);
    if (other != nullptr) others.push_back(std::move(other));
  }
  for (auto [client, id] : held) EXPECT_TRUE(client->Free(id).ok());
}

// The abuser's first id 7 is an Allocate held 300 ms by device 0's slab
// creation, so its second id 7 is a reuse however the answers are
// scheduled (before, with only quick requests, a slow run could have every
// answer written before the next id came: TSan, once).
TEST_F(SlowDeviceStreamTest, RequestIdReusedInFlightEndsTheStream) {
  const double baseline = PairMedianUs();
  auto abuser = Abuser("reuse");
  std::string line = abuser->ReadLine(30000);
  EXPECT_EQ(line.rfind("status 3 ", 0), 0u) << line;
  EXPECT_TRUE(absl::StrContains(line, "request id 7 reused while its request is in flight"))
      << line;
  EXPECT_EQ(abuser->ReadLine(), "holding");
  ExpectOthersServed(baseline);
  KillAndExpectReclaimed(abuser.get());
}

TEST_F(SlowDeviceStreamTest, DedicatedSlabsComeAndGoThroughTheWorkers) {
  // 128 MiB > the 64 MiB slab size: a dedicated slab, made on a worker, and
  // given back on a worker when its block is freed.
  for (uint32_t device : {0u, 1u}) {
    auto a = client_->AllocateRaw(On(device, 128 << 20));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->allocations(0).slab_size_bytes(), 128u << 20);
    auto stats = client_->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->devices(device).used_bytes(), 128u << 20);
    ASSERT_TRUE(client_->Free(a->allocations(0).id()).ok());
    stats = client_->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->devices(device).used_bytes(), 0u);
    EXPECT_EQ(stats->devices(device).pooled_bytes(), 0u);
    // A second free of it: NOT_FOUND, as ever.
    EXPECT_EQ(client_->Free(a->allocations(0).id()).code(), absl::StatusCode::kNotFound);
  }
}

TEST_F(SlowDeviceStreamTest, AStreamEndingWhileItsSlowAllocateRunsGetsItFreed) {
  // A process sends an Allocate that needs a slow new slab, then dies before
  // the answer: the block is freed (nobody learned its id), and the daemon
  // keeps serving.
  auto abuser = Abuser("slow_then_die");
  ASSERT_EQ(abuser->ReadLine(30000), "sent");
  abuser->Kill(SIGKILL);
  abuser->Wait();
  auto deadline = Clock::now() + std::chrono::seconds(5);
  uint64_t used = 1;
  while (Clock::now() < deadline) {
    used = 0;
    auto stats = client_->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    for (const auto& d : stats->devices()) used += d.used_bytes();
    if (used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0u);
  auto a = client_->AllocateRaw(On(1, 4096));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(client_->Free(a->allocations(0).id()).ok());
}

}  // namespace
}  // namespace gpumem
