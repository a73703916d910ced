#include "client/lib/cpp/deferred_frees.h"

#include <unistd.h>

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpumem {
namespace client {

DeferredFrees::~DeferredFrees() {
  if (getpid() != pid_) {
    // A fork() child: the thread, and the device, are the parent's.
    if (thread_.joinable()) thread_.detach();
    return;
  }
  Flush();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void DeferredFrees::Add(std::shared_ptr<OpenedSlab> slab, std::function<void()> free) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Item{std::move(slab), std::move(free)});
  ++added_;
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void DeferredFrees::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = added_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= target; };
  mu_.Await(absl::Condition(&done));
}

uint64_t DeferredFrees::pending() const {
  absl::MutexLock lock(&mu_);
  return added_ - done_;
}

void DeferredFrees::Loop() {
  std::vector<Item> later;
  for (;;) {
    std::vector<Item> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &later]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || !later.empty() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() && later.empty() && stop_) return;
      batch = std::move(later);
      later.clear();
      for (Item& it : queue_) batch.push_back(std::move(it));
      queue_.clear();
    }
    // One synchronize per slab, begun after every free of the batch was
    // queued; the frees of a slab whose synchronize a capture refused wait
    // for the next round.
    std::vector<std::pair<OpenedSlab*, bool>> waited;
    uint64_t ran = 0;
    for (Item& it : batch) {
      bool passed = false;
      bool known = false;
      for (const auto& [slab, ok] : waited) {
        if (slab == it.slab.get()) {
          passed = ok;
          known = true;
        }
      }
      if (!known) {
        // Any answer but a capture's refusal ends the wait (a failed device
        // runs nothing more).
        passed = it.slab->WaitForDeviceWork().code() != absl::StatusCode::kUnavailable;
        waited.push_back({it.slab.get(), passed});
      }
      if (!passed) {
        later.push_back(std::move(it));
        continue;
      }
      it.free();
      it.slab.reset();
      ++ran;
    }
    if (!later.empty()) absl::SleepFor(absl::Milliseconds(1));  // a capture is under way
    absl::MutexLock lock(&mu_);
    done_ += ran;
  }
}

}  // namespace client
}  // namespace gpumem
