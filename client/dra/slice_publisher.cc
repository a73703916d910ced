// One loop, two clocks: the next poll of gpumemd and the next write attempt
// (now, after a change; later, after a failure or for the resync).
#include "client/dra/slice_publisher.h"

#include <grpcpp/grpcpp.h>

#include "absl/random/random.h"
#include "absl/time/clock.h"
#include "client/dra/log.h"
#include "client/dra/node_devices.h"

namespace gpumem {
namespace dra {

SlicePublisher::SlicePublisher(PublisherConfig config, const ApiServer* api,
                               v1::GpuMemory::StubInterface* gpumemd, PluginState* state)
    : config_(std::move(config)), api_(api), gpumemd_(gpumemd), state_(state) {}

SlicePublisher::~SlicePublisher() { Stop(); }

void SlicePublisher::Start() { thread_ = std::thread([this] { Run(); }); }

void SlicePublisher::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void SlicePublisher::Run() {
  const std::string path =
      "/apis/resource.k8s.io/v1/resourceslices/" + SliceName(config_.slice);
  absl::BitGen rng;
  nlohmann::json devices;  // null until gpumemd first answers
  bool dirty = false, gpumemd_down_logged = false;
  int64_t generation = state_->slice_generation();
  absl::Time next_poll = absl::Now(), next_write = absl::InfiniteFuture();
  absl::Duration backoff = config_.backoff_initial;
  int failures = 0;
  for (;;) {
    const absl::Time now = absl::Now();
    if (now >= next_poll) {
      next_poll = now + config_.poll;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(config_.gpumemd_timeout)));
      v1::GetStatsRequest req;
      v1::GetStatsResponse stats;
      const grpc::Status s = gpumemd_->GetStats(&ctx, req, &stats);
      if (!s.ok()) {
        if (!gpumemd_down_logged) {
          Log("gpumemd GetStats: ", s.error_message(), " (the slice stays as it is)");
          gpumemd_down_logged = true;
        }
      } else {
        gpumemd_down_logged = false;
        nlohmann::json now_devices = SliceDevices(config_.slice, DevicesFromStats(stats));
        if (now_devices != devices) {
          devices = std::move(now_devices);
          ++generation;
          if (absl::Status g = state_->SetSliceGeneration(generation); !g.ok()) {
            Log("cannot record the slice generation: ", g.ToString());
          }
          dirty = true;
          next_write = now;
          backoff = config_.backoff_initial;
        }
      }
    }
    if (!devices.is_null() && now >= next_write) {
      const nlohmann::json slice = BuildResourceSlice(config_.slice, devices, generation);
      const absl::Status s = api_->Apply(path, slice.dump(), config_.field_manager);
      if (s.ok()) {
        if (dirty || failures > 0) {
          Log("published ResourceSlice ", SliceName(config_.slice), " generation ", generation,
              " with ", devices.size(), " device(s)");
        }
        dirty = false;
        failures = 0;
        backoff = config_.backoff_initial;
        next_write = absl::Now() + config_.resync;
      } else {
        ++failures;
        const absl::Duration wait =
            backoff + backoff * absl::Uniform(rng, 0.0, 0.1);
        Log("writing ResourceSlice ", SliceName(config_.slice), " failed (attempt ", failures,
            "), retrying in ", absl::FormatDuration(wait), ": ", s.ToString());
        next_write = absl::Now() + wait;
        backoff = std::min(backoff * 2, config_.backoff_max);
      }
    }
    absl::MutexLock l(&mu_);
    const absl::Time wake = std::min(next_poll, next_write);
    if (mu_.AwaitWithDeadline(absl::Condition(this, &SlicePublisher::StopRequested), wake)) return;
  }
}

}  // namespace dra
}  // namespace gpumem
