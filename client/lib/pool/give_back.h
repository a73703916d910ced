// GiveBack: memory the program is not using goes back to the daemon. On a
// timer, thread caches unused for a whole tick go back to their leases, then
// leases empty for idle_release_ms go back to the daemon; when the daemon
// asks for idle memory (memory pressure: a StreamReply.reclaim, heard by the
// client's stream reader even while the program makes no call), everything
// idle goes back at once and the daemon is told how much; Trim() does the
// same for the program, after waiting for every deferred free. Past the
// free queue's bound, the watcher also runs the device synchronize that
// gives those frees back, so that no freeing thread waits for it.
//
// Invariants: memory goes back only when idle (no block out of it); the
// watcher thread is the only one that runs the timer and reclaim passes,
// and it has stopped when Stop() returns. RequestReclaim() and Wake() take
// no lock, so the client's threads never wait for the pool.
#ifndef GPUMEMD_CLIENT_LIB_POOL_GIVE_BACK_H_
#define GPUMEMD_CLIENT_LIB_POOL_GIVE_BACK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "client/lib/pool/free_queue.h"
#include "client/lib/pool/lease_source.h"
#include "client/lib/pool/size_class_cache.h"
#include "client/lib/pool/thread_caches.h"

namespace gpumem {
namespace client {

class GiveBack {
 public:
  struct Layers {
    ThreadCaches* thread_caches;
    FreeQueue* free_queue;
    SizeClassCache* size_classes;
    LeaseSource* source;
  };
  // `on_wake` runs on the watcher thread first thing after every Wake()
  // (the pool applies restart losses there). The layers must outlive the
  // watcher (Stop()).
  static absl::StatusOr<std::unique_ptr<GiveBack>> Create(int64_t idle_release_ms, Layers layers,
                                                          std::function<void()> on_wake);
  ~GiveBack();  // Stop()
  GiveBack(const GiveBack&) = delete;
  GiveBack& operator=(const GiveBack&) = delete;

  void Start();
  void Stop();
  // Any thread, no lock.
  void Wake();
  void RequestReclaim();
  // Runs FreeQueue::WaitDeviceRule on the watcher (FreeQueue's request_wait).
  void RequestDeviceWait();

  // Waits for every deferred free, then gives back everything idle. Bytes
  // given back.
  uint64_t Trim();

 private:
  GiveBack(int64_t idle_release_ms, Layers layers, std::function<void()> on_wake, int wake_fd)
      : idle_release_ms_(idle_release_ms),
        layers_(layers),
        on_wake_(std::move(on_wake)),
        wake_fd_(wake_fd) {}
  void WatchLoop();
  // Everything idle back now (no waiting for device work). Bytes given back.
  uint64_t ReleaseIdle();

  const int64_t idle_release_ms_;
  const Layers layers_;
  const std::function<void()> on_wake_;
  const int wake_fd_;  // eventfd
  std::atomic<bool> stopping_{false};
  std::atomic<bool> reclaim_wanted_{false};
  std::atomic<bool> device_wait_wanted_{false};
  std::thread watcher_;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_GIVE_BACK_H_
