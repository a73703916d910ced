// SlicePublisher: keeps this node's ResourceSlice in the API server equal to
// what gpumemd can lease.
//
// A thread polls gpumemd's GetStats every `poll`; when the slice's devices
// differ from the last ones (a device's leasable memory moved by a step, a
// device came or went), the pool generation is raised (and recorded in the
// state file, so it never goes back) and the slice is written with
// server-side apply. A write that fails is retried after `backoff_initial`,
// doubling up to `backoff_max` (plus up to 10% jitter), until one succeeds;
// an unchanged slice is written again every `resync` anyway, which brings
// back a slice someone deleted (the kubelet deletes a driver's slices while
// its plugin is unregistered). gpumemd being unreachable changes nothing
// in the API server: the last slice stays until gpumemd answers again.
#ifndef GPUMEMD_CLIENT_DRA_SLICE_PUBLISHER_H_
#define GPUMEMD_CLIENT_DRA_SLICE_PUBLISHER_H_

#include <thread>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/dra/api_server.h"
#include "client/dra/plugin_state.h"
#include "client/dra/resource_slice.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace dra {

struct PublisherConfig {
  SliceConfig slice;
  std::string field_manager = "gpumemd-dra";
  absl::Duration poll = absl::Seconds(10);
  absl::Duration resync = absl::Minutes(5);
  absl::Duration backoff_initial = absl::Seconds(1);
  absl::Duration backoff_max = absl::Minutes(2);
  absl::Duration gpumemd_timeout = absl::Seconds(5);
};

class SlicePublisher {
 public:
  SlicePublisher(PublisherConfig config, const ApiServer* api,
                 v1::GpuMemory::StubInterface* gpumemd, PluginState* state);
  ~SlicePublisher();  // Stop()s

  void Start();
  void Stop();

 private:
  void Run();
  bool StopRequested() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; }

  const PublisherConfig config_;
  const ApiServer* const api_;
  v1::GpuMemory::StubInterface* const gpumemd_;
  PluginState* const state_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_SLICE_PUBLISHER_H_
