#include "client/lib/pool/free_queue.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/cuda_driver.h"

namespace gpumem {
namespace client {

namespace {
absl::StatusOr<std::unique_ptr<FenceSource>> DriverFences() {
  // The mapper that opened the block loaded the driver already.
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok()) return d.status();
  return std::unique_ptr<FenceSource>(new FreeFences(*d));
}
}  // namespace

FreeQueue::FreeQueue(BlockResource* upstream, Options options)
    : upstream_(upstream), options_(std::move(options)) {}

FreeQueue::~FreeQueue() {
  // Graphs that outlive the queue release into nothing.
  absl::MutexLock lock(&graph_holds_->mu);
  graph_holds_->closed = true;
}

FenceSource* FreeQueue::Fences() {
  absl::call_once(fences_once_, [this] {
    absl::StatusOr<std::unique_ptr<FenceSource>> f =
        options_.make_fences ? options_.make_fences() : DriverFences();
    if (!f.ok()) return;  // frees then wait for nothing
    fences_owner_ = *std::move(f);
    fences_.store(fences_owner_.get(), std::memory_order_release);
  });
  return fences_.load(std::memory_order_acquire);
}

absl::StatusOr<Block> FreeQueue::Allocate(uint64_t size, const Arena& arena) {
  absl::StatusOr<Block> out = absl::UnknownError("not tried");
  for (int attempt = 0; attempt < 2; ++attempt) {
    Collect();
    out = upstream_->Allocate(size, arena);
    // The daemon has no memory left: blocks freed while device work used
    // them will do once that work is done.
    if (out.ok() || out.status().code() != absl::StatusCode::kResourceExhausted || Empty()) {
      break;
    }
    WaitAll();
  }
  return out;
}

absl::Status FreeQueue::Free(Block block, const ReuseAfter& after) {
  if (!OnDevice(block)) return upstream_->Free(std::move(block), after);
  Waiting w;
  if (FenceSource* fences = Fences()) {
    const std::string& uuid = DeviceUuid(block);
    const CUstream stream = static_cast<CUstream>(after.stream);
    FenceSource::CaptureHold hold = FenceSource::CaptureHold::kNone;
    if (after.stream_ordered) {
      uint64_t id;
      {
        absl::MutexLock lock(&mu_);
        id = next_hold_++;
      }
      std::shared_ptr<GraphHolds> box = graph_holds_;
      hold = fences->HoldForCapture(uuid, stream, [box, id] {
        absl::MutexLock lock(&box->mu);
        if (!box->closed) box->released.push_back(id);
      });
      if (hold == FenceSource::CaptureHold::kHeld) {
        absl::MutexLock lock(&mu_);
        held_bytes_ += block.bytes;
        held_.emplace(id, std::move(block));
        return absl::OkStatus();
      }
    }
    // An invalidated capture's graph never runs: the work queued before it.
    absl::StatusOr<FenceSource::Fence> f =
        after.stream_ordered && hold == FenceSource::CaptureHold::kNone
            ? fences->AfterStream(uuid, stream)
            : fences->AfterDevice(uuid);
    // A stream this library cannot record on (another context's): the
    // device's work, which covers it when it is of the primary context.
    if (!f.ok() && after.stream_ordered) f = fences->AfterDevice(uuid);
    if (f.ok()) {
      w.fence = *f;
      w.fenced = true;
    }
  }
  w.device_rule = w.fenced && w.fence.event == nullptr;
  w.stream = after.stream;
  w.block = std::move(block);
  bool over;
  bool request = false;
  {
    absl::MutexLock lock(&mu_);
    QueueLocked(std::move(w));
    over = device_rule_bytes_ > options_.max_device_rule_bytes ||
           device_rule_count_ > options_.max_device_rule_blocks;
    if (over && options_.request_wait) {
      request = !wait_requested_;
      wait_requested_ = true;
    }
  }
  // Free()'s blocks are bounded: past the limits, one synchronize of their
  // devices gives them all back, on another thread where there is one.
  if (request) {
    options_.request_wait();
  } else if (over && !options_.request_wait) {
    Wait(/*device_rule_only=*/true);
  }
  return absl::OkStatus();
}

void FreeQueue::WaitDeviceRule() {
  {
    absl::MutexLock lock(&mu_);
    wait_requested_ = false;  // frees from now on may ask again
  }
  Wait(/*device_rule_only=*/true);
}

void FreeQueue::QueueLocked(Waiting w) {
  bytes_ += w.block.bytes;
  ++count_;
  if (!w.device_rule) {
    stream_queues_[w.stream].push_back(std::move(w));
    return;
  }
  device_rule_bytes_ += w.block.bytes;
  ++device_rule_count_;
  const size_t dev = static_cast<size_t>(w.fence.device);
  if (device_queues_.size() <= dev) device_queues_.resize(dev + 1);
  device_queues_[dev].push_back(std::move(w));
}

void FreeQueue::TakeReleasedGraphs() {
  std::vector<uint64_t> released;
  {
    absl::MutexLock lock(&graph_holds_->mu);
    released.swap(graph_holds_->released);
  }
  if (released.empty()) return;
  FenceSource* fences = fences_.load(std::memory_order_acquire);
  for (uint64_t id : released) {
    Waiting w;
    {
      absl::MutexLock lock(&mu_);
      auto it = held_.find(id);
      if (it == held_.end()) continue;
      w.block = std::move(it->second);
      held_.erase(it);
      held_bytes_ -= w.block.bytes;
    }
    // Its graph's last replay may still be running: the device's work first.
    absl::StatusOr<FenceSource::Fence> f =
        fences != nullptr ? fences->AfterDevice(DeviceUuid(w.block))
                          : absl::StatusOr<FenceSource::Fence>(absl::UnavailableError("no fences"));
    w.fenced = f.ok();
    if (f.ok()) w.fence = *f;
    w.device_rule = w.fenced;
    absl::MutexLock lock(&mu_);
    QueueLocked(std::move(w));
  }
}

bool FreeQueue::MayReuseOnStream(void* stream) {
  if (stream == nullptr) return true;  // the NULL stream never captures
  FenceSource* fences = Fences();
  return fences != nullptr && !fences->Capturing(static_cast<CUstream>(stream));
}

bool FreeQueue::Empty() {
  absl::MutexLock lock(&mu_);
  return count_ == 0;
}

void FreeQueue::Collect() {
  TakeReleasedGraphs();
  std::vector<Waiting> ready;
  {
    absl::MutexLock lock(&mu_);
    if (count_ == 0) return;
    FenceSource* fences = fences_.load(std::memory_order_acquire);
    auto passed = [&](const Waiting& w) {
      return !w.fenced || fences == nullptr || fences->Passed(w.fence);
    };
    auto take = [&](Waiting& w) {
      bytes_ -= w.block.bytes;
      --count_;
      if (w.device_rule) {
        device_rule_bytes_ -= w.block.bytes;
        --device_rule_count_;
      }
      if (w.fenced && fences != nullptr) fences->Release(w.fence);
      ready.push_back(std::move(w));
    };
    // A device's queue is in fence order: what passed is a prefix.
    for (std::deque<Waiting>& q : device_queues_) {
      while (!q.empty() && passed(q.front())) {
        take(q.front());
        q.pop_front();
      }
    }
    // A stream's events pass in order: its front says for the rest (one
    // query that fails per stream, at most kStreamsPerCollect streams).
    if (!stream_queues_.empty()) {
      std::vector<void*> streams;
      for (auto& [stream, q] : stream_queues_) streams.push_back(stream);
      const size_t n = streams.size();
      const size_t look = std::min<size_t>(n, kStreamsPerCollect);
      for (size_t i = 0; i < look; ++i) {
        void* stream = streams[(next_stream_ + i) % n];
        std::deque<Waiting>& q = stream_queues_[stream];
        while (!q.empty() && passed(q.front())) {
          take(q.front());
          q.pop_front();
        }
        if (q.empty()) stream_queues_.erase(stream);
      }
      next_stream_ += look;
    }
  }
  for (Waiting& w : ready) {
    // Nobody is told: a block of a lost lease, or a daemon that is gone,
    // needs nothing more from here.
    upstream_->Free(std::move(w.block), ReuseAfter::DeviceWork()).IgnoreError();
  }
}

void FreeQueue::Wait(bool device_rule_only) {
  TakeReleasedGraphs();
  std::vector<FenceSource::Fence> wait;
  FenceSource* fences = fences_.load(std::memory_order_acquire);
  {
    absl::MutexLock lock(&mu_);
    // The oldest fence of each device: waiting for it synchronizes the
    // device, which covers every fence taken before that began.
    for (const std::deque<Waiting>& q : device_queues_) {
      if (!q.empty()) wait.push_back(q.front().fence);
    }
    if (!device_rule_only) {
      for (const auto& [stream, q] : stream_queues_) {
        for (const Waiting& w : q) {
          if (w.fenced) wait.push_back(w.fence);
        }
      }
    }
  }
  for (const FenceSource::Fence& f : wait) {
    // A failure is judged by Passed() below: a broken device counts as
    // passed, a capture's refusal does not.
    if (fences != nullptr) fences->Wait(f).IgnoreError();
  }
  // What was waited for has passed now (unless a capture refused), whatever
  // the order.
  for (int round = 0; round < 1 + static_cast<int>(wait.size() / kStreamsPerCollect); ++round) {
    Collect();
  }
}

FreeQueue::Figures FreeQueue::Stats() {
  absl::MutexLock lock(&mu_);
  return {count_ + held_.size(), bytes_ + held_bytes_, held_.size(), held_bytes_};
}

}  // namespace client
}  // namespace gpumem
