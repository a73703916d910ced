// FenceSource, and FreeFences (the CUDA driver's): when memory freed on the
// host may be reused, for memory that device work queued before the free
// may still be using. A GPU runs work later than the host queues it;
// PyTorch frees a tensor as soon as the last kernel that uses it is queued,
// so the memory must not be handed to its next owner (or unmapped) until
// that work has run. A Fence is taken at free time and says when.
//
// CUDA graphs: memory freed on a stream that is capturing a graph is used
// by every replay of that graph, so it is held (HoldForCapture) until the
// graph and every executable made from it are destroyed: a CUDA user object
// the graph holds runs the release then.
//
// Invariants: a fence passes only once the work it stands for has
// completed, or its device failed (the context broken, the device lost:
// nothing will run any more); a capture's refusal (a query or synchronize
// while a graph is captured) means "not yet", never "passed"; every driver
// call runs inside a ScopedCudaContext of the device, so the calling
// thread's current context is left as it was, and in RELAXED capture mode,
// so no call of this library invalidates an application's capture.
// Thread-safe.
#ifndef GPUMEMD_CLIENT_LIB_POOL_FREE_FENCES_H_
#define GPUMEMD_CLIENT_LIB_POOL_FREE_FENCES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "common/cuda_driver.h"

namespace gpumem {
namespace client {

// Where a FreeQueue gets its fences (an interface so that the queue's rules
// can be driven without a GPU).
class FenceSource {
 public:
  struct Fence {
    int device = -1;          // the source's index of the device
    CUevent event = nullptr;  // AfterStream
    uint64_t ticket = 0;      // AfterDevice: syncs started before it
  };

  virtual ~FenceSource() = default;
  // Passes once the work queued on `stream` (a CUstream of the device's
  // primary context; null: its legacy NULL stream) before now has
  // completed: an event recorded now on that stream.
  virtual absl::StatusOr<Fence> AfterStream(const std::string& uuid, CUstream stream) = 0;
  // Passes once all the work this process queued on the device's primary
  // context before now has completed: the next cuCtxSynchronize of the
  // device that starts after now.
  virtual absl::StatusOr<Fence> AfterDevice(const std::string& uuid) = 0;
  // Without blocking (cuEventQuery, or "has such a synchronize finished").
  virtual bool Passed(const Fence& f) = 0;
  // Blocks until `f` has passed (cuEventSynchronize, or a cuCtxSynchronize
  // of its own); the driver's error if waiting failed (the fence then counts
  // as passed).
  virtual absl::Status Wait(const Fence& f) = 0;
  // Gives a passed fence's event back for reuse.
  virtual void Release(Fence& f) = 0;

  enum class CaptureHold {
    kNone,         // `stream` is not capturing: fence as usual
    kHeld,         // `on_release` runs once the graph is gone (never, where
                   // the driver cannot name the graph: held for good)
    kInvalidated,  // its capture failed; the graph is discarded
  };
  // Is `stream` capturing a graph (or not known not to be)? One query,
  // made in the caller's context (a stream of another context answers
  // true). The NULL stream never captures.
  virtual bool Capturing(CUstream stream) {
    (void)stream;
    return false;
  }
  // When `stream` is capturing a graph: ties `on_release` to that graph.
  // `on_release` may run on a driver thread; it must make no CUDA call.
  virtual CaptureHold HoldForCapture(const std::string& uuid, CUstream stream,
                                     std::function<void()> on_release) {
    (void)uuid;
    (void)stream;
    (void)on_release;
    return CaptureHold::kNone;
  }
};

// The CUDA driver's fences.
class FreeFences : public FenceSource {
 public:
  explicit FreeFences(const CudaDriver* driver) : d_(driver) {}
  ~FreeFences() override;
  FreeFences(const FreeFences&) = delete;
  FreeFences& operator=(const FreeFences&) = delete;

  absl::StatusOr<Fence> AfterStream(const std::string& uuid, CUstream stream) override;
  absl::StatusOr<Fence> AfterDevice(const std::string& uuid) override;
  bool Passed(const Fence& f) override;
  absl::Status Wait(const Fence& f) override;
  void Release(Fence& f) override;
  CaptureHold HoldForCapture(const std::string& uuid, CUstream stream,
                             std::function<void()> on_release) override;
  bool Capturing(CUstream stream) override;

 private:
  struct Device {
    CudaDeviceContext dev;
    absl::Mutex mu;
    uint64_t started = 0;       // cuCtxSynchronize calls begun
    uint64_t completed_upto = 0;  // 1 + the index of the latest one finished
    std::vector<CUevent> spare ABSL_GUARDED_BY(mu);
  };
  absl::StatusOr<int> DeviceIndex(const std::string& uuid);
  absl::Status Synchronize(Device& dev);

  const CudaDriver* const d_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> index_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Device>> devices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_FREE_FENCES_H_
