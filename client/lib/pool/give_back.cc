#include "client/lib/pool/give_back.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/time/time.h"

namespace gpumem {
namespace client {

absl::StatusOr<std::unique_ptr<GiveBack>> GiveBack::Create(int64_t idle_release_ms, Layers layers,
                                                           std::function<void()> on_wake) {
  const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return absl::InternalError("eventfd failed");
  return std::unique_ptr<GiveBack>(new GiveBack(idle_release_ms, layers, std::move(on_wake), fd));
}

GiveBack::~GiveBack() {
  Stop();
  close(wake_fd_);
}

void GiveBack::Start() {
  watcher_ = std::thread([this] { WatchLoop(); });
}

void GiveBack::Stop() {
  stopping_.store(true);
  Wake();
  if (watcher_.joinable()) watcher_.join();
}

void GiveBack::Wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void GiveBack::RequestReclaim() {
  reclaim_wanted_.store(true);
  Wake();
}

void GiveBack::RequestDeviceWait() {
  device_wait_wanted_.store(true);
  Wake();
}

uint64_t GiveBack::ReleaseIdle() {
  layers_.free_queue->Collect();
  layers_.thread_caches->DrainAll();
  return layers_.size_classes->ReleaseEmpty(absl::ZeroDuration());
}

uint64_t GiveBack::Trim() {
  layers_.free_queue->WaitAll();
  return ReleaseIdle();
}

void GiveBack::WatchLoop() {
  const int tick_ms = static_cast<int>(std::clamp<int64_t>(idle_release_ms_ / 2, 10, 1000));
  while (!stopping_.load()) {
    struct pollfd p = {wake_fd_, POLLIN, 0};
    const int r = poll(&p, 1, tick_ms);
    if (r < 0 && errno != EINTR) return;
    if (stopping_.load()) return;
    if (p.revents != 0) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof(v));
      on_wake_();
      if (device_wait_wanted_.exchange(false)) layers_.free_queue->WaitDeviceRule();
      if (reclaim_wanted_.exchange(false)) {
        layers_.source->ReportReclaimed(ReleaseIdle());
      }
      continue;
    }
    // Blocks whose device work has finished go back first; then caches
    // unused for a whole tick go back to the leases, and leases empty for
    // the idle time to the daemon.
    layers_.free_queue->Collect();
    layers_.thread_caches->DrainIdle();
    layers_.size_classes->ReleaseEmpty(absl::Milliseconds(idle_release_ms_));
  }
}

}  // namespace client
}  // namespace gpumem
