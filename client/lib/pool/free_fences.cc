// Device fences count cuCtxSynchronize calls: a fence taken when `started`
// was t has passed once a synchronize with index >= t (begun after the
// fence) has finished, i.e. when completed_upto > t.
#include "client/lib/pool/free_fences.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {

FreeFences::~FreeFences() {
  absl::MutexLock lock(&mu_);
  for (auto& dev : devices_) {
    ScopedCudaContext scope(*d_, dev->dev.ctx);
    absl::MutexLock dl(&dev->mu);
    for (CUevent e : dev->spare) d_->cuEventDestroy_v2(e);
  }
}

absl::StatusOr<int> FreeFences::DeviceIndex(const std::string& uuid) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(uuid);
  if (it != index_.end()) return it->second;
  absl::StatusOr<CudaDeviceContext> dev = CudaDeviceContext::Find(*d_, uuid);
  if (!dev.ok()) return dev.status();
  auto d = std::make_unique<Device>();
  d->dev = *std::move(dev);
  devices_.push_back(std::move(d));
  const int i = static_cast<int>(devices_.size()) - 1;
  index_[uuid] = i;
  return i;
}

absl::StatusOr<FreeFences::Fence> FreeFences::AfterStream(const std::string& uuid,
                                                          CUstream stream) {
  absl::StatusOr<int> i = DeviceIndex(uuid);
  if (!i.ok()) return i.status();
  Device* dev;
  {
    absl::MutexLock lock(&mu_);
    dev = devices_[*i].get();
  }
  Fence f;
  f.device = *i;
  {
    absl::MutexLock dl(&dev->mu);
    if (!dev->spare.empty()) {
      f.event = dev->spare.back();
      dev->spare.pop_back();
    }
  }
  ScopedCudaContext scope(*d_, dev->dev.ctx);
  absl::Status s = dev->dev.Entered(*d_, scope);
  const std::string where = absl::StrCat("device ", uuid);
  if (s.ok() && f.event == nullptr) {
    s = CudaStatus(*d_, d_->cuEventCreate(&f.event, CU_EVENT_DISABLE_TIMING), "cuEventCreate",
                   where);
  }
  if (s.ok()) s = CudaStatus(*d_, d_->cuEventRecord(f.event, stream), "cuEventRecord", where);
  if (!s.ok()) {
    if (f.event != nullptr) d_->cuEventDestroy_v2(f.event);
    return s;
  }
  return f;
}

absl::StatusOr<FreeFences::Fence> FreeFences::AfterDevice(const std::string& uuid) {
  absl::StatusOr<int> i = DeviceIndex(uuid);
  if (!i.ok()) return i.status();
  Device* dev;
  {
    absl::MutexLock lock(&mu_);
    dev = devices_[*i].get();
  }
  Fence f;
  f.device = *i;
  absl::MutexLock dl(&dev->mu);
  f.ticket = dev->started;
  return f;
}

bool FreeFences::Passed(const Fence& f) {
  Device* dev;
  {
    absl::MutexLock lock(&mu_);
    dev = devices_[f.device].get();
  }
  if (f.event == nullptr) {
    absl::MutexLock dl(&dev->mu);
    return dev->completed_upto > f.ticket;
  }
  ScopedCudaContext scope(*d_, dev->dev.ctx);
  return d_->cuEventQuery(f.event) != CUDA_ERROR_NOT_READY;
}

absl::Status FreeFences::Synchronize(Device& dev) {
  uint64_t mine;
  {
    absl::MutexLock dl(&dev.mu);
    mine = dev.started++;
  }
  ScopedCudaContext scope(*d_, dev.dev.ctx);
  absl::Status s = dev.dev.Entered(*d_, scope);
  if (s.ok()) {
    s = CudaStatus(*d_, d_->cuCtxSynchronize(), "cuCtxSynchronize",
                   absl::StrCat("device ", dev.dev.uuid));
  }
  absl::MutexLock dl(&dev.mu);
  dev.completed_upto = std::max(dev.completed_upto, mine + 1);
  return s;
}

absl::Status FreeFences::Wait(const Fence& f) {
  Device* dev;
  {
    absl::MutexLock lock(&mu_);
    dev = devices_[f.device].get();
  }
  if (f.event == nullptr) {
    if (Passed(f)) return absl::OkStatus();
    return Synchronize(*dev);
  }
  ScopedCudaContext scope(*d_, dev->dev.ctx);
  absl::Status s = dev->dev.Entered(*d_, scope);
  if (!s.ok()) return s;
  return CudaStatus(*d_, d_->cuEventSynchronize(f.event), "cuEventSynchronize",
                    absl::StrCat("device ", dev->dev.uuid));
}

void FreeFences::Release(Fence& f) {
  if (f.event == nullptr) return;
  Device* dev;
  {
    absl::MutexLock lock(&mu_);
    dev = devices_[f.device].get();
  }
  absl::MutexLock dl(&dev->mu);
  dev->spare.push_back(f.event);
  f.event = nullptr;
}

}  // namespace client
}  // namespace gpumem
