// The shared-memory request ring as a building block (issue 40): the
// layout and Attach's checks (common/ring), the daemon's reader and poller
// (server/ring), the client's submitter (client/lib/ring), together.
//
// Most tests run both sides in this process on one mapping, so that
// ThreadSanitizer sees the ring's hand-offs; one goes through Attach (a
// second mapping, as a client process has), and the hostile client is a
// fork()ed child writing over the shared mapping. Deadlines are generous
// (sanitizer builds on two loaded cores): they bound a hang, they are not
// what is measured.
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/lib/ring/ring_submitter.h"
#include "common/ring/request_ring.h"
#include "gtest/gtest.h"
#include "server/ring/ring_poller.h"
#include "server/ring/ring_reader.h"
#include "tests/common/poll_until.h"

namespace gpumem {
namespace {

using ::gpumem::testing::PollUntil;

constexpr absl::Duration kCallTimeout = absl::Seconds(60);

// The daemon's side of one ring.
struct DaemonRing {
  std::unique_ptr<RingRegion> region;
  std::unique_ptr<RingReader> reader;
};

DaemonRing MakeRing(uint32_t slots) {
  DaemonRing ring;
  absl::StatusOr<std::unique_ptr<RingRegion>> region = RingRegion::Create(slots);
  EXPECT_TRUE(region.ok()) << region.status();
  if (!region.ok()) abort();
  ring.region = std::move(*region);
  ring.reader = std::make_unique<RingReader>(ring.region.get());
  return ring;
}

std::unique_ptr<RingPoller> MakePoller(int workers, int per_turn = RingPoller::kDefaultPerTurn) {
  absl::StatusOr<std::unique_ptr<RingPoller>> poller = RingPoller::Create(workers, per_turn);
  EXPECT_TRUE(poller.ok()) << poller.status();
  if (!poller.ok()) abort();
  return std::move(*poller);
}

// Answers every request at once with its own bytes.
RingPoller::Handler Echo(std::atomic<int>* served = nullptr) {
  return [served](RingReader* reader, RingRequest request) {
    if (served != nullptr) served->fetch_add(1);  // before the caller can see the answer
    const absl::Status s =
        reader->Answer(request.slot, request.seq, absl::StatusCode::kOk, request.bytes);
    EXPECT_TRUE(s.ok()) << s;
  };
}

// A request of `size` bytes that names its caller and call.
std::string Payload(int thread, int call, size_t size) {
  std::string p = absl::StrCat("t", thread, "c", call, ":");
  p.resize(size, static_cast<char>('a' + (thread + call) % 26));
  return p;
}

// Writes a request into slot `i` as a client would, without a submitter.
void Publish(RingRegion* region, uint32_t i, uint32_t seq, uint32_t kind,
             const std::string& bytes) {
  RingSlot* slot = region->slot(i);
  slot->seq.store(seq, std::memory_order_relaxed);
  slot->kind.store(kind, std::memory_order_relaxed);
  slot->length.store(static_cast<uint32_t>(bytes.size()), std::memory_order_relaxed);
  memcpy(slot->payload, bytes.data(), bytes.size());
  slot->state.store(kSlotRequest, std::memory_order_release);
}

std::string AnswerBytes(RingRegion* region, uint32_t i) {
  RingSlot* slot = region->slot(i);
  return std::string(reinterpret_cast<const char*>(slot->payload),
                     std::min(slot->length.load(), kRingPayloadBytes));
}

// A copy of `ring`'s memfd, `bytes` long, its header changed by `edit`,
// sealed or not: what a confused or lying peer might pass.
int ForgedMemfd(RingRegion* ring, size_t bytes, bool seal,
                void (*edit)(uint32_t* words) = nullptr) {
  const int fd = memfd_create("forged-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  std::vector<unsigned char> copy(std::min(bytes, ring->size()));
  memcpy(copy.data(), ring->base(), copy.size());
  if (edit != nullptr) edit(reinterpret_cast<uint32_t*>(copy.data()));
  EXPECT_EQ(pwrite(fd, copy.data(), copy.size(), 0), static_cast<ssize_t>(copy.size()));
  if (seal) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  }
  return fd;
}

int NewEventfd() { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

// Kills and reaps a child process when the test ends early.
struct ChildGuard {
  pid_t pid;
  ~ChildGuard() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

TEST(RingRegionTest, AttachRefusesAWrongSize) {
  DaemonRing ring = MakeRing(4);
  for (size_t bytes : {RingLayoutBytes(4) - 1, RingLayoutBytes(4) + 1, RingLayoutBytes(5),
                       size_t{64}}) {
    auto attached = RingRegion::Attach(ForgedMemfd(ring.region.get(), bytes, true), NewEventfd());
    ASSERT_FALSE(attached.ok()) << bytes;
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument) << attached.status();
  }
}

TEST(RingRegionTest, AttachRefusesAnUnsealedMemfd) {
  DaemonRing ring = MakeRing(4);
  auto attached =
      RingRegion::Attach(ForgedMemfd(ring.region.get(), RingLayoutBytes(4), false), NewEventfd());
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(attached.status().message().find("sealed"), std::string::npos) << attached.status();
}

TEST(RingRegionTest, AttachRefusesABadIdentity) {
  DaemonRing ring = MakeRing(4);
  void (*edits[])(uint32_t*) = {
      [](uint32_t* w) { w[0] ^= 1; },  // magic
      [](uint32_t* w) { w[1] = 2; },   // version
      [](uint32_t* w) { w[3] = 512; },  // slot size
      [](uint32_t* w) { w[2] = 0; },   // no slots
  };
  for (auto edit : edits) {
    auto attached = RingRegion::Attach(
        ForgedMemfd(ring.region.get(), RingLayoutBytes(4), true, edit), NewEventfd());
    ASSERT_FALSE(attached.ok());
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument) << attached.status();
  }
}

TEST(RingRegionTest, AttachRefusesMoreThan256Slots) {
  DaemonRing ring = MakeRing(4);
  // Sized for its claim, so only the count is wrong.
  auto attached = RingRegion::Attach(
      ForgedMemfd(ring.region.get(), RingLayoutBytes(300), true,
                  [](uint32_t* w) { w[2] = 300; }),
      NewEventfd());
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(attached.status().message().find("300 slots"), std::string::npos)
      << attached.status();
  EXPECT_FALSE(RingRegion::Create(kRingMaxSlots + 1).ok());
  EXPECT_FALSE(RingRegion::Create(0).ok());
}

TEST(RingRegionTest, AttachRefusesAClosedEventfd) {
  DaemonRing ring = MakeRing(4);
  auto attached = RingRegion::Attach(dup(ring.region->memfd()), -1);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RingRegionTest, TheDaemonsRingIsSealedAndAttaches) {
  DaemonRing ring = MakeRing(kRingMaxSlots);
  const int seals = fcntl(ring.region->memfd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(ring.region->memfd(), 1 << 20), 0);
  auto attached = RingRegion::Attach(dup(ring.region->memfd()), dup(ring.region->eventfd()));
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ((*attached)->slot_count(), kRingMaxSlots);
  EXPECT_EQ((*attached)->size(), RingLayoutBytes(kRingMaxSlots));
}

TEST(RingTest, ARoundTripThroughAnAttachedMapping) {
  DaemonRing ring = MakeRing(8);
  auto poller = MakePoller(1);
  ASSERT_TRUE(poller
                  ->Add(ring.reader.get(),
                        [](RingReader* reader, RingRequest request) {
                          const std::string answer =
                              absl::StrCat("kind ", request.kind, ": ", request.bytes);
                          EXPECT_TRUE(reader
                                          ->Answer(request.slot, request.seq,
                                                   absl::StatusCode::kNotFound, answer)
                                          .ok());
                        })
                  .ok());
  auto client_region =
      RingRegion::Attach(dup(ring.region->memfd()), dup(ring.region->eventfd()));
  ASSERT_TRUE(client_region.ok()) << client_region.status();
  RingSubmitter submitter(client_region->get());
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<RingAnswer> answer = submitter.Call(7 + i, "hello", kCallTimeout);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->code, absl::StatusCode::kNotFound);
    EXPECT_EQ(answer->bytes, absl::StrCat("kind ", 7 + i, ": hello"));
  }
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

TEST(RingTest, RequestsLargerThanASlotAreRefusedBeforeSending) {
  DaemonRing ring = MakeRing(2);
  RingSubmitter submitter(ring.region.get());
  auto answer = submitter.Call(1, std::string(kRingPayloadBytes + 1, 'x'), kCallTimeout);
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(submitter.broken());
  EXPECT_FALSE(ring.reader->HasWork());
}

TEST(RingTest, ManyThreadsManyCallsEachGetTheirOwnAnswer) {
  DaemonRing ring = MakeRing(4);  // fewer slots than threads: callers wait for slots
  auto poller = MakePoller(2);
  ASSERT_TRUE(poller->Add(ring.reader.get(), Echo()).ok());
  RingSubmitter submitter(ring.region.get());
  constexpr int kThreads = 8, kCalls = 300;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c) {
        const std::string request = Payload(t, c, (t * 131 + c * 17) % (kRingPayloadBytes + 1));
        absl::StatusOr<RingAnswer> answer = submitter.Call(t, request, kCallTimeout);
        ASSERT_TRUE(answer.ok()) << answer.status();
        ASSERT_EQ(answer->code, absl::StatusCode::kOk);
        ASSERT_EQ(answer->bytes, request);
        good.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(good.load(), kThreads * kCalls);
  EXPECT_EQ(ring.reader->held(), 0);
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

// Requests wait in a queue and are answered by another thread: a waiting
// request holds no worker, and Answer runs beside Collect.
TEST(RingTest, AnswersFromAnotherThreadLater) {
  DaemonRing ring = MakeRing(16);
  auto poller = MakePoller(2);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RingRequest> waiting;
  bool done = false;
  ASSERT_TRUE(poller
                  ->Add(ring.reader.get(),
                        [&](RingReader*, RingRequest request) {
                          std::lock_guard<std::mutex> lock(mu);
                          waiting.push_back(std::move(request));
                          cv.notify_one();
                        })
                  .ok());
  std::thread answerer([&] {
    for (;;) {
      RingRequest request;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done || !waiting.empty(); });
        if (waiting.empty()) return;
        request = std::move(waiting.front());
        waiting.pop_front();
      }
      const std::string answer = request.bytes + "!";
      EXPECT_TRUE(
          ring.reader->Answer(request.slot, request.seq, absl::StatusCode::kOk, answer).ok());
    }
  });
  RingSubmitter submitter(ring.region.get());
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int c = 0; c < 200; ++c) {
        const std::string request = Payload(t, c, 40);
        auto answer = submitter.Call(1, request, kCallTimeout);
        ASSERT_TRUE(answer.ok()) << answer.status();
        ASSERT_EQ(answer->bytes, request + "!");
      }
    });
  }
  for (std::thread& t : callers) t.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  }
  answerer.join();
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

TEST(RingTest, ABadLengthIsAnsweredInvalidArgumentAndServingGoesOn) {
  DaemonRing ring = MakeRing(4);
  std::atomic<int> served{0};
  auto poller = MakePoller(1);
  ASSERT_TRUE(poller->Add(ring.reader.get(), Echo(&served)).ok());
  // A scribbler's request: a length past the slot's payload.
  RingSlot* slot = ring.region->slot(2);
  slot->seq.store(99);
  slot->length.store(kRingPayloadBytes + 1);
  slot->state.store(kSlotRequest, std::memory_order_release);
  ring.region->RingDoorbell();
  ASSERT_TRUE(PollUntil([&] { return slot->state.load() == kSlotAnswer; }));
  EXPECT_EQ(slot->status.load(), static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(slot->seq.load(), 99u);
  EXPECT_NE(AnswerBytes(ring.region.get(), 2).find("at most 992"), std::string::npos)
      << AnswerBytes(ring.region.get(), 2);
  EXPECT_EQ(served.load(), 0);  // never reached the handler
  slot->state.store(kSlotFree, std::memory_order_release);
  RingSubmitter submitter(ring.region.get());
  for (int i = 0; i < 10; ++i) {
    auto answer = submitter.Call(1, "still here", kCallTimeout);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->bytes, "still here");
  }
  EXPECT_EQ(served.load(), 10);
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

TEST(RingReaderTest, AStateScribbledBackToRequestIsNotTakenTwice) {
  DaemonRing ring = MakeRing(4);
  RingRegion* region = ring.region.get();
  Publish(region, 1, 7, 3, "hello");
  std::vector<RingRequest> got;
  auto keep = [&](RingRequest r) { got.push_back(std::move(r)); };
  EXPECT_EQ(ring.reader->Collect(16, keep), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].slot, 1u);
  EXPECT_EQ(got[0].seq, 7u);
  EXPECT_EQ(got[0].kind, 3u);
  EXPECT_EQ(got[0].bytes, "hello");
  EXPECT_EQ(region->slot(1)->state.load(), kSlotTaken);
  // The client puts the slot back to kSlotRequest with other bytes.
  Publish(region, 1, 8, 4, "again");
  EXPECT_FALSE(ring.reader->HasWork());
  EXPECT_EQ(ring.reader->Collect(16, keep), 0);
  EXPECT_EQ(got.size(), 1u);
  // Only the request held, by its own seq, is answered, once.
  EXPECT_EQ(ring.reader->Answer(1, 8, absl::StatusCode::kOk, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ring.reader->Answer(0, 7, absl::StatusCode::kOk, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ring.reader->Answer(4, 7, absl::StatusCode::kOk, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ring.reader->Answer(1, 7, absl::StatusCode::kOk,
                                std::string(kRingPayloadBytes + 1, 'x'))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(region->slot(1)->state.load(), kSlotRequest);  // nothing written
  EXPECT_TRUE(ring.reader->Answer(1, 7, absl::StatusCode::kOk, "hi").ok());
  EXPECT_EQ(region->slot(1)->state.load(), kSlotAnswer);
  EXPECT_EQ(AnswerBytes(region, 1), "hi");
  EXPECT_EQ(ring.reader->Answer(1, 7, absl::StatusCode::kOk, "twice").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AnswerBytes(region, 1), "hi");
  EXPECT_EQ(ring.reader->held(), 0);
}

TEST(RingReaderTest, CollectTakesAtMostItsBoundAndEveryOneInTurn) {
  DaemonRing ring = MakeRing(8);
  for (uint32_t i = 0; i < 8; ++i) Publish(ring.region.get(), i, 100 + i, 0, "r");
  std::vector<uint32_t> slots;
  auto keep = [&](RingRequest r) { slots.push_back(r.slot); };
  EXPECT_EQ(ring.reader->Collect(3, keep), 3);
  EXPECT_EQ(ring.reader->Collect(3, keep), 3);
  EXPECT_EQ(ring.reader->Collect(3, keep), 2);
  EXPECT_EQ(slots, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ring.reader->held(), 8);
}

TEST(RingTest, AClaimedSlotNeverPublishedBlocksNobody) {
  DaemonRing ring = MakeRing(2);
  auto poller = MakePoller(1);
  ASSERT_TRUE(poller->Add(ring.reader.get(), Echo()).ok());
  // A client that claims slot 0 and stops there (dies, or hangs).
  uint32_t free_state = kSlotFree;
  ASSERT_TRUE(ring.region->slot(0)->state.compare_exchange_strong(free_state, kSlotClaimed));
  RingSubmitter submitter(ring.region.get());
  for (int i = 0; i < 50; ++i) {
    auto answer = submitter.Call(1, Payload(0, i, 10), kCallTimeout);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->bytes, Payload(0, i, 10));
  }
  EXPECT_EQ(ring.region->slot(0)->state.load(), kSlotClaimed);
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

// A fork()ed child writes random bytes over its whole ring (states,
// lengths, the header) and floods the doorbell, while the poller serves it
// and another ring; then it is killed with SIGKILL. The daemon's side
// neither crashes nor hangs, and the other ring is served throughout.
TEST(RingTest, AScribblingChildKilledMidwayHarmsNoOtherRing) {
  DaemonRing victim = MakeRing(16);
  DaemonRing other = MakeRing(4);
  auto poller = MakePoller(2);
  std::atomic<int> victim_served{0};
  ASSERT_TRUE(poller->Add(victim.reader.get(), Echo(&victim_served)).ok());
  ASSERT_TRUE(poller->Add(other.reader.get(), Echo()).ok());
  unsigned char* base = static_cast<unsigned char*>(victim.region->base());
  const size_t size = victim.region->size();
  const int doorbell = victim.region->eventfd();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Async-signal-safe only: stores and write(2).
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t n = 0;; ++n) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      RingSlot* slot = reinterpret_cast<RingSlot*>(base + sizeof(RingHeader)) + (x >> 40) % 16;
      switch (x % 8) {
        case 0:
        case 1:
          static_cast<volatile unsigned char*>(base)[(x >> 16) % size] =
              static_cast<unsigned char>(x >> 8);
          break;
        case 2:
        case 3:
          slot->state.store(static_cast<uint32_t>((x >> 8) % 6), std::memory_order_release);
          break;
        case 4:
          slot->length.store((x >> 12) & 1 ? static_cast<uint32_t>(x >> 20)
                                           : static_cast<uint32_t>((x >> 20) % 1024),
                             std::memory_order_relaxed);
          break;
        case 5:
          reinterpret_cast<RingHeader*>(base)->reader_active.store((x >> 9) & 1);
          break;
        default: {
          const uint64_t one = 1;
          if (write(doorbell, &one, sizeof(one)) < 0) {
          }
        }
      }
    }
  }
  ChildGuard guard{child};
  RingSubmitter submitter(other.region.get());
  auto call_other = [&](int i) {
    auto answer = submitter.Call(2, Payload(1, i, 64), kCallTimeout);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->bytes, Payload(1, i, 64));
  };
  // Half a second of attack at least, and until the scribbles reached the
  // handler as requests a thousand times; the other ring is called
  // throughout.
  const auto attack_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int calls = 0;
  EXPECT_TRUE(PollUntil([&] {
    for (int i = 0; i < 20; ++i) call_other(calls++);
    return std::chrono::steady_clock::now() > attack_end && victim_served.load() > 1000;
  })) << victim_served.load() << " scribbled requests served";
  printf("while scribbled over: %d scribbled requests served, %d calls on the other ring\n",
         victim_served.load(), calls);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  guard.pid = 0;
  for (int i = 0; i < 50; ++i) call_other(calls++);
  EXPECT_TRUE(poller->Remove(victim.reader.get()).ok());
  for (int i = 0; i < 50; ++i) call_other(calls++);
  EXPECT_TRUE(poller->Remove(other.reader.get()).ok());
}

// The client's eventfd is the daemon's open file too: a client that clears
// O_NONBLOCK on it must not make a worker's read of the doorbell block (a
// turn from the poller's queue finds the counter at 0).
TEST(RingPollerTest, AClientClearingONonblockOnTheDoorbellBlocksNoWorker) {
  DaemonRing ring = MakeRing(8);
  auto poller = MakePoller(1, /*per_turn=*/1);
  std::atomic<int> served{0};
  ASSERT_TRUE(poller->Add(ring.reader.get(), Echo(&served)).ok());
  auto client = RingRegion::Attach(dup(ring.region->memfd()), dup(ring.region->eventfd()));
  ASSERT_TRUE(client.ok()) << client.status();
  const int flags = fcntl((*client)->eventfd(), F_GETFL);
  ASSERT_EQ(fcntl((*client)->eventfd(), F_SETFL, flags & ~O_NONBLOCK), 0);
  ASSERT_EQ(fcntl(ring.region->eventfd(), F_GETFL) & O_NONBLOCK, 0);  // shared
  for (uint32_t i = 0; i < 4; ++i) Publish(client->get(), i, i, 0, "q");
  (*client)->RingDoorbell();
  ASSERT_TRUE(PollUntil([&] { return served.load() == 4; })) << served.load();
  EXPECT_GE(poller->turns(), 4u);  // one request a turn: three turns came from the queue
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

TEST(RingPollerTest, SixtyFourRingsOnTwoWorkersAreAllServed) {
  constexpr int kRings = 64, kThreads = 8, kRounds = 30;
  std::vector<DaemonRing> rings;
  std::vector<std::unique_ptr<RingSubmitter>> submitters;
  std::vector<std::atomic<int>> served(kRings);
  auto poller = MakePoller(2, 16);
  for (int r = 0; r < kRings; ++r) {
    rings.push_back(MakeRing(4));
    ASSERT_TRUE(poller->Add(rings.back().reader.get(), Echo(&served[r])).ok());
    submitters.push_back(std::make_unique<RingSubmitter>(rings.back().region.get()));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        for (int r = t; r < kRings; r += kThreads) {
          const std::string request = Payload(r, round, 1 + (r * 7 + round) % 200);
          auto answer = submitters[r]->Call(r, request, kCallTimeout);
          ASSERT_TRUE(answer.ok()) << answer.status();
          ASSERT_EQ(answer->bytes, request);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRings; ++r) EXPECT_EQ(served[r].load(), kRounds) << r;
  for (DaemonRing& ring : rings) EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

// Two rings flood (two callers each, as fast as they are answered) among
// 64; a request on a quiet ring is taken within a few turns of its
// doorbell: each flooding ring, its turn's bound spent, goes to the back of
// the line. One worker, so that the bound is the poller's order alone: with
// two, a worker that loses its core inside the quiet ring's previous turn
// (the ring still busy) lets the other run any number of turns meanwhile,
// which is the scheduler's doing, not the poller's.
TEST(RingPollerTest, AFloodingRingDoesNotStarveAnother) {
  constexpr int kRings = 64;
  auto poller = MakePoller(1, 16);
  std::vector<DaemonRing> rings;
  for (int r = 0; r < kRings; ++r) rings.push_back(MakeRing(r < 2 ? 64 : 2));
  std::atomic<uint64_t> quiet_taken_at_turn{0};
  for (int r = 0; r < kRings; ++r) {
    RingPoller::Handler handler = Echo();
    if (r == kRings - 1) {
      handler = [&](RingReader* reader, RingRequest request) {
        quiet_taken_at_turn.store(poller->turns());
        EXPECT_TRUE(reader->Answer(request.slot, request.seq, absl::StatusCode::kOk, "").ok());
      };
    }
    ASSERT_TRUE(poller->Add(rings[r].reader.get(), handler).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> flood_calls{0};
  std::vector<std::unique_ptr<RingSubmitter>> flooders;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    flooders.push_back(std::make_unique<RingSubmitter>(rings[r].region.get()));
  }
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, r] {
        while (!stop.load()) {
          auto answer = flooders[r]->Call(1, "flood", kCallTimeout);
          ASSERT_TRUE(answer.ok()) << answer.status();
          flood_calls.fetch_add(1);
        }
      });
    }
  }
  ASSERT_TRUE(PollUntil([&] { return flood_calls.load() > 200; }));
  RingRegion* quiet = rings[kRings - 1].region.get();
  constexpr int kTrials = 20;
  std::vector<uint64_t> waits;
  for (uint32_t i = 0; i < kTrials; ++i) {
    quiet_taken_at_turn.store(0);
    Publish(quiet, 0, i, 1, "quiet");
    // Counted from after the doorbell (its event is in epoll's ready list
    // once write returns): this thread losing its core on a loaded machine
    // then shortens the count, never lengthens it.
    quiet->RingDoorbell();
    const uint64_t rung_at_turn = poller->turns();
    ASSERT_TRUE(PollUntil([&] { return quiet->slot(0)->state.load() == kSlotAnswer; }));
    const uint64_t taken = quiet_taken_at_turn.load();
    waits.push_back(taken > rung_at_turn ? taken - rung_at_turn : 0);
    quiet->slot(0)->state.store(kSlotFree, std::memory_order_release);
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  std::sort(waits.begin(), waits.end());
  printf("a quiet ring's request waited %llu turns (median), %llu at most, among %d flooding "
         "calls\n",
         static_cast<unsigned long long>(waits[kTrials / 2]),
         static_cast<unsigned long long>(waits.back()), flood_calls.load());
  // 1-4 (the flooding rings' turns and the queue's ahead of it in epoll's
  // ready list, then the quiet ring's); far below what a ring drained to
  // empty, or served in place while it has work, would cost.
  EXPECT_LE(waits.back(), 8u);
  for (DaemonRing& ring : rings) EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
}

TEST(RingPollerTest, RemoveWithRequestsPendingReturns) {
  DaemonRing ring = MakeRing(4);
  auto poller = MakePoller(2);
  ASSERT_TRUE(poller->Add(ring.reader.get(), [](RingReader*, RingRequest) {}).ok());
  for (uint32_t i = 0; i < 3; ++i) Publish(ring.region.get(), i, i, 0, "wait");
  ring.region->RingDoorbell();
  ASSERT_TRUE(PollUntil([&] { return ring.reader->held() == 3; }));
  Publish(ring.region.get(), 3, 3, 0, "never taken");  // published, maybe not taken
  EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
  EXPECT_EQ(poller->Remove(ring.reader.get()).code(), absl::StatusCode::kNotFound);
  // The held requests can still be answered through the reader.
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(ring.reader->Answer(i, i, absl::StatusCode::kOk, "late").ok());
    EXPECT_EQ(AnswerBytes(ring.region.get(), i), "late");
  }
}

TEST(RingPollerTest, RemoveWaitsForAHandlerInsideTheRing) {
  DaemonRing ring = MakeRing(4);
  auto poller = MakePoller(1);
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, release = false;
  ASSERT_TRUE(poller
                  ->Add(ring.reader.get(),
                        [&](RingReader* reader, RingRequest request) {
                          std::unique_lock<std::mutex> lock(mu);
                          inside = true;
                          cv.notify_all();
                          cv.wait(lock, [&] { return release; });
                          EXPECT_TRUE(reader
                                          ->Answer(request.slot, request.seq,
                                                   absl::StatusCode::kOk, "")
                                          .ok());
                        })
                  .ok());
  Publish(ring.region.get(), 0, 1, 0, "x");
  ring.region->RingDoorbell();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return inside; }));
  }
  std::atomic<bool> removed{false};
  std::thread remover([&] {
    EXPECT_TRUE(poller->Remove(ring.reader.get()).ok());
    removed.store(true);
  });
  // A negative check: Remove must still be waiting a while later.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(removed.load());
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  remover.join();
  EXPECT_TRUE(removed.load());
  EXPECT_EQ(ring.region->slot(0)->state.load(), kSlotAnswer);
}

TEST(RingSubmitterTest, ATimeoutBreaksTheSubmitter) {
  DaemonRing ring = MakeRing(4);  // nobody serves it
  RingSubmitter submitter(ring.region.get());
  auto answer = submitter.Call(1, "anyone?", absl::Milliseconds(20));
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(submitter.broken());
  EXPECT_EQ(ring.region->header()->broken.load(), 1u);
  auto later = submitter.Call(1, "again", kCallTimeout);
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), absl::StatusCode::kFailedPrecondition);
  // The request was sent: a daemon coming late still finds it.
  EXPECT_TRUE(ring.reader->HasWork());
}

TEST(RingSubmitterTest, NoFreeSlotWithinTheTimeoutSendsNothingAndBreaksNothing) {
  DaemonRing ring = MakeRing(1);
  uint32_t free_state = kSlotFree;
  ASSERT_TRUE(ring.region->slot(0)->state.compare_exchange_strong(free_state, kSlotClaimed));
  RingSubmitter submitter(ring.region.get());
  auto answer = submitter.Call(1, "no room", absl::Milliseconds(20));
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(submitter.broken());
  EXPECT_FALSE(ring.reader->HasWork());
}

}  // namespace
}  // namespace gpumem
