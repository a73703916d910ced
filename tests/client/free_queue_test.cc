// FreeQueue on a recording upstream and a fence source the test drives:
// host memory passes at once; device memory goes upstream only once its
// fence has passed (per device in order for Free()'s rule, in any order for
// FreeAfterStream()'s); past its bound Free()'s rule waits at the free; an
// allocation the daemon cannot serve waits for the queue and is tried again.
#include "client/lib/pool/free_queue.h"

#include <functional>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace client {
namespace {

// Device fences count "synchronizes" per device; stream fences are events
// the test marks done.
class TestFences : public FenceSource {
 public:
  absl::StatusOr<Fence> AfterStream(const std::string& uuid, CUstream stream) override {
    absl::MutexLock lock(&mu_);
    if (stream == kForeignStream) return absl::InvalidArgumentError("not this context's stream");
    Fence f;
    f.device = Index(uuid);
    f.event = reinterpret_cast<CUevent>(++events_);
    return f;
  }
  absl::StatusOr<Fence> AfterDevice(const std::string& uuid) override {
    absl::MutexLock lock(&mu_);
    Fence f;
    f.device = Index(uuid);
    f.ticket = ++taken_[f.device];
    return f;
  }
  bool Passed(const Fence& f) override {
    absl::MutexLock lock(&mu_);
    ++queries_;
    if (f.event != nullptr) return done_events_.count(f.event) > 0;
    return synced_[f.device] >= f.ticket;
  }
  absl::Status Wait(const Fence& f) override {
    absl::MutexLock lock(&mu_);
    ++waits_;
    if (f.event != nullptr) {
      done_events_.insert(f.event);
    } else {
      synced_[f.device] = taken_[f.device];  // a synchronize covers all before it
    }
    return absl::OkStatus();
  }
  void Release(Fence&) override {}
  // kCapturing is capturing a graph; kBroken's capture was invalidated.
  CaptureHold HoldForCapture(const std::string&, CUstream stream,
                             std::function<void()> on_release) override {
    absl::MutexLock lock(&mu_);
    if (stream == kBroken) return CaptureHold::kInvalidated;
    if (stream != kCapturing) return CaptureHold::kNone;
    graph_releases_.push_back(std::move(on_release));
    return CaptureHold::kHeld;
  }
  // The captured graph is destroyed (its user objects run), maybe on
  // another thread.
  void DestroyGraph() {
    std::vector<std::function<void()>> releases = TakeGraphReleases();
    std::thread([&] {
      for (auto& r : releases) r();
    }).join();
  }
  std::vector<std::function<void()>> TakeGraphReleases() {
    absl::MutexLock lock(&mu_);
    std::vector<std::function<void()>> out;
    out.swap(graph_releases_);
    return out;
  }
  static inline const CUstream kCapturing = reinterpret_cast<CUstream>(0xca9);
  static inline const CUstream kBroken = reinterpret_cast<CUstream>(0xb0c);

  // The device work before every fence of `uuid` so far is done.
  void Synchronized(const std::string& uuid) {
    absl::MutexLock lock(&mu_);
    synced_[Index(uuid)] = taken_[Index(uuid)];
  }
  void EventDone(uint64_t n) {
    absl::MutexLock lock(&mu_);
    done_events_.insert(reinterpret_cast<CUevent>(n));
  }
  int waits() {
    absl::MutexLock lock(&mu_);
    return waits_;
  }
  int queries() {
    absl::MutexLock lock(&mu_);
    return queries_;
  }
  static inline const CUstream kForeignStream = reinterpret_cast<CUstream>(0xbad);

 private:
  int Index(const std::string& uuid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = index_.emplace(uuid, static_cast<int>(index_.size())).first;
    return it->second;
  }
  absl::Mutex mu_;
  std::map<std::string, int> index_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> taken_ ABSL_GUARDED_BY(mu_), synced_ ABSL_GUARDED_BY(mu_);
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<CUevent> done_events_ ABSL_GUARDED_BY(mu_);
  int waits_ ABSL_GUARDED_BY(mu_) = 0;
  int queries_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> graph_releases_ ABSL_GUARDED_BY(mu_);
};

class RecordingUpstream : public BlockResource {
 public:
  absl::StatusOr<Block> Allocate(uint64_t size, const Arena&) override {
    ++allocations;
    if (exhausted_until_freed && freed.empty()) return absl::ResourceExhaustedError("full");
    Block b;
    b.ptr = 1;
    b.bytes = size;
    return b;
  }
  absl::Status Free(Block b, const ReuseAfter&) override {
    freed.push_back(b.ptr);
    return absl::OkStatus();
  }
  bool exhausted_until_freed = false;
  int allocations = 0;
  std::vector<uintptr_t> freed;
};

class FreeQueueTest : public ::testing::Test {
 protected:
  FreeQueueTest() {
    FreeQueue::Options o;
    o.max_device_rule_bytes = 10 * 4096;
    o.make_fences = [this]() -> absl::StatusOr<std::unique_ptr<FenceSource>> {
      auto f = std::make_unique<TestFences>();
      fences_ = f.get();
      return std::unique_ptr<FenceSource>(std::move(f));
    };
    queue_ = std::make_unique<FreeQueue>(&upstream_, std::move(o));
  }
  // A 4 KiB block at `ptr` of the device lease `on`.
  Block DeviceBlock(uintptr_t ptr, Lease* on) {
    Block b;
    b.ptr = ptr;
    b.bytes = 4096;
    b.lease = on;
    return b;
  }
  void Free(Block b, ReuseAfter after = ReuseAfter::DeviceWork()) {
    ASSERT_TRUE(queue_->Free(std::move(b), after).ok());
  }

  Arena arena_;
  Lease gpu0_{0, 1 << 30, 1 << 30, 0, "GPU-0", /*on_device=*/true, &arena_, BlockShadow()};
  Lease gpu1_{0, 2ull << 30, 1 << 30, 1, "GPU-1", /*on_device=*/true, &arena_, BlockShadow()};
  Lease host_{0, 3ull << 30, 1 << 30, 0, "", /*on_device=*/false, &arena_, BlockShadow()};
  RecordingUpstream upstream_;
  TestFences* fences_ = nullptr;
  std::unique_ptr<FreeQueue> queue_;
};

TEST_F(FreeQueueTest, HostMemoryPassesAtOnceDeviceMemoryWhenItsDeviceWorkIsDone) {
  Block h = DeviceBlock(host_.base, &host_);
  Free(std::move(h));
  EXPECT_EQ(upstream_.freed.size(), 1u);
  EXPECT_EQ(fences_, nullptr);  // no fences made for host memory
  Free(DeviceBlock(gpu0_.base, &gpu0_));
  Free(DeviceBlock(gpu1_.base, &gpu1_));
  Free(DeviceBlock(gpu0_.base + 4096, &gpu0_));
  queue_->Collect();
  EXPECT_EQ(upstream_.freed.size(), 1u);
  EXPECT_EQ(queue_->Stats().blocks, 3u);
  EXPECT_EQ(queue_->Stats().bytes, 3u * 4096);
  fences_->Synchronized("GPU-0");
  queue_->Collect();
  EXPECT_EQ(upstream_.freed, (std::vector<uintptr_t>{host_.base, gpu0_.base, gpu0_.base + 4096}));
  EXPECT_EQ(queue_->Stats().blocks, 1u);
  queue_->WaitAll();
  EXPECT_EQ(upstream_.freed.back(), gpu1_.base);
  EXPECT_EQ(queue_->Stats().blocks, 0u);
}

TEST_F(FreeQueueTest, StreamFencesPassInAnyOrderAndAForeignStreamFallsBackToTheDevice) {
  void* const a = reinterpret_cast<void*>(0xa);
  void* const b = reinterpret_cast<void*>(0xb);
  Free(DeviceBlock(gpu0_.base, &gpu0_), ReuseAfter::StreamWork(a));         // event 1
  Free(DeviceBlock(gpu0_.base + 4096, &gpu0_), ReuseAfter::StreamWork(b));  // event 2
  fences_->EventDone(2);
  queue_->Collect();
  EXPECT_EQ(upstream_.freed, (std::vector<uintptr_t>{gpu0_.base + 4096}));
  Free(DeviceBlock(gpu0_.base + 8192, &gpu0_), ReuseAfter::StreamWork(TestFences::kForeignStream));
  fences_->Synchronized("GPU-0");
  queue_->Collect();
  EXPECT_EQ(upstream_.freed.back(), gpu0_.base + 8192);  // under the device's rule
  EXPECT_EQ(queue_->Stats().blocks, 1u);                 // event 1 still pending
  fences_->EventDone(1);
  queue_->Collect();
  EXPECT_EQ(queue_->Stats().blocks, 0u);
}

// One stream's events pass in the order recorded: its oldest says for the
// rest, so a collection queries one fence per stream that has not passed,
// and at most kStreamsPerCollect streams, however many blocks wait.
TEST_F(FreeQueueTest, ACollectionQueriesAStreamsOldestFenceOnly) {
  for (int i = 0; i < 1000; ++i) {
    Free(DeviceBlock(gpu0_.base + i * 4096, &gpu0_), ReuseAfter::StreamWork(nullptr));
  }
  for (int s = 1; s <= 20; ++s) {
    Free(DeviceBlock(gpu1_.base + s * 4096, &gpu1_),
         ReuseAfter::StreamWork(reinterpret_cast<void*>(static_cast<uintptr_t>(s))));
  }
  const int before = fences_->queries();
  queue_->Collect();
  EXPECT_LE(fences_->queries() - before, 8);
  EXPECT_TRUE(upstream_.freed.empty());
  // The first stream's fences all pass: one collection takes all 1000.
  for (int e = 1; e <= 1000; ++e) fences_->EventDone(e);
  for (int round = 0; round < 3; ++round) queue_->Collect();
  EXPECT_EQ(upstream_.freed.size(), 1000u);
}

TEST_F(FreeQueueTest, PastTheBoundTheDevicesWorkIsWaitedForAtTheFree) {
  for (int i = 0; i < 10; ++i) Free(DeviceBlock(gpu0_.base + i * 4096, &gpu0_));
  EXPECT_EQ(fences_->waits(), 0);
  EXPECT_TRUE(upstream_.freed.empty());
  Free(DeviceBlock(gpu0_.base + 10 * 4096, &gpu0_));  // 11 x 4 KiB > 40 KiB
  EXPECT_EQ(fences_->waits(), 1);                     // one synchronize for all
  EXPECT_EQ(upstream_.freed.size(), 11u);
}

// With a thread to do it (the pool's watcher), the free past the bound only
// asks for the synchronize, once until it has run: no freeing thread waits
// for the device's whole queue.
TEST_F(FreeQueueTest, PastTheBoundTheSynchronizeIsAskedOfAnotherThread) {
  int asked = 0;
  FreeQueue::Options o;
  o.max_device_rule_bytes = 10 * 4096;
  o.request_wait = [&asked] { ++asked; };
  o.make_fences = [this]() -> absl::StatusOr<std::unique_ptr<FenceSource>> {
    auto f = std::make_unique<TestFences>();
    fences_ = f.get();
    return std::unique_ptr<FenceSource>(std::move(f));
  };
  queue_ = std::make_unique<FreeQueue>(&upstream_, std::move(o));
  for (int i = 0; i < 13; ++i) Free(DeviceBlock(gpu0_.base + i * 4096, &gpu0_));
  EXPECT_EQ(fences_->waits(), 0);  // the frees did not wait
  EXPECT_EQ(asked, 1);             // asked once, not at every free past the bound
  EXPECT_TRUE(upstream_.freed.empty());
  std::thread([this] { queue_->WaitDeviceRule(); }).join();
  EXPECT_EQ(fences_->waits(), 1);
  EXPECT_EQ(upstream_.freed.size(), 13u);
  for (int i = 0; i < 11; ++i) Free(DeviceBlock(gpu1_.base + i * 4096, &gpu1_));
  EXPECT_EQ(asked, 2);  // past the bound again after it ran: asked again
}

TEST_F(FreeQueueTest, AnAllocationTheDaemonCannotServeWaitsForTheQueueOnce) {
  Free(DeviceBlock(gpu0_.base, &gpu0_));
  upstream_.exhausted_until_freed = true;
  absl::StatusOr<Block> b = queue_->Allocate(4096, arena_);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(upstream_.allocations, 2);
  EXPECT_EQ(upstream_.freed.size(), 1u);
  // With nothing waiting, the refusal is the answer.
  upstream_.freed.clear();
  b = queue_->Allocate(4096, arena_);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(upstream_.allocations, 3);
}

// Freed on a stream capturing a graph: held through every wait while the
// graph lives, then the device's work like Free(); an invalidated capture's
// block waits for the device's work only; a graph that outlives the queue
// releases into nothing.
TEST_F(FreeQueueTest, BlocksFreedIntoAGraphCaptureWaitForTheGraph) {
  Free(DeviceBlock(gpu0_.base, &gpu0_), ReuseAfter::StreamWork(TestFences::kCapturing));
  Free(DeviceBlock(gpu0_.base + 4096, &gpu0_), ReuseAfter::StreamWork(TestFences::kBroken));
  EXPECT_EQ(queue_->Stats().graph_blocks, 1u);
  EXPECT_EQ(queue_->Stats().graph_bytes, 4096u);
  EXPECT_EQ(queue_->Stats().blocks, 2u);
  queue_->WaitAll();
  EXPECT_EQ(upstream_.freed, (std::vector<uintptr_t>{gpu0_.base + 4096}));
  EXPECT_EQ(queue_->Stats().graph_blocks, 1u);
  fences_->DestroyGraph();
  EXPECT_EQ(queue_->Stats().graph_blocks, 1u);  // taken at the next collection
  queue_->Collect();                             // under the device's rule now
  EXPECT_EQ(queue_->Stats().graph_blocks, 0u);
  EXPECT_EQ(queue_->Stats().blocks, 1u);
  fences_->Synchronized("GPU-0");
  queue_->Collect();
  EXPECT_EQ(upstream_.freed.back(), gpu0_.base);
  EXPECT_EQ(queue_->Stats().blocks, 0u);

  Free(DeviceBlock(gpu0_.base + 8192, &gpu0_), ReuseAfter::StreamWork(TestFences::kCapturing));
  std::vector<std::function<void()>> outliving = fences_->TakeGraphReleases();
  queue_.reset();
  fences_ = nullptr;  // went with the queue
  for (auto& r : outliving) r();  // the graph dies after the queue: nothing happens
}

TEST(FreeQueueNoFencesTest, WithoutFencesDeviceMemoryWaitsForNothing) {
  RecordingUpstream upstream;
  FreeQueue::Options o;
  o.make_fences = []() -> absl::StatusOr<std::unique_ptr<FenceSource>> {
    return absl::UnavailableError("no driver");
  };
  FreeQueue queue(&upstream, std::move(o));
  Arena arena;
  Lease gpu(0, 1 << 30, 1 << 30, 0, "GPU-0", true, &arena, BlockShadow());
  Block b;
  b.ptr = gpu.base;
  b.bytes = 4096;
  b.lease = &gpu;
  ASSERT_TRUE(queue.Free(std::move(b), ReuseAfter::DeviceWork()).ok());
  queue.Collect();
  EXPECT_EQ(upstream.freed.size(), 1u);
}

}  // namespace
}  // namespace client
}  // namespace gpumem
