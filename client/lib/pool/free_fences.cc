// Device fences count cuCtxSynchronize calls: a fence taken when `started`
// was t has passed once a synchronize with index >= t (begun after the
// fence) has finished, i.e. when completed_upto > t.
#include "client/lib/pool/free_fences.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {
namespace {

// A capture refused the call: the work is not known to be done.
bool CaptureRefusal(CUresult r) {
  return r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
}

// A user object's destructor: runs the release it was made with, once.
void CUDA_CB RunRelease(void* fn) {
  auto* release = static_cast<std::function<void()>*>(fn);
  (*release)();
  delete release;
}

}  // namespace

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
  const CUresult r = d_->cuEventQuery(f.event);
  return r != CUDA_ERROR_NOT_READY && !CaptureRefusal(r);
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
  // Refused by a capture, nothing was waited for.
  if (CaptureRefusal(CudaErrorOf(s))) return s;
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

bool FreeFences::Capturing(CUstream stream) {
  if (stream == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return d_->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

FenceSource::CaptureHold FreeFences::HoldForCapture(const std::string& uuid, CUstream stream,
                                                    std::function<void()> on_release) {
  if (stream == nullptr) return CaptureHold::kNone;  // the NULL stream never captures
  absl::StatusOr<int> i = DeviceIndex(uuid);
  if (!i.ok()) return CaptureHold::kNone;
  Device* dev;
  {
    absl::MutexLock lock(&mu_);
    dev = devices_[*i].get();
  }
  ScopedCudaContext scope(*d_, dev->dev.ctx);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // Another context's stream: not one this library can look at.
  if (scope.result() != CUDA_SUCCESS || d_->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
      status == CU_STREAM_CAPTURE_STATUS_NONE) {
    return CaptureHold::kNone;
  }
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CaptureHold::kInvalidated;
  CUgraph graph = nullptr;
  if (d_->cuStreamGetCaptureInfo_v3 == nullptr ||
      d_->cuStreamGetCaptureInfo_v3(stream, &status, nullptr, &graph, nullptr, nullptr,
                                    nullptr) != CUDA_SUCCESS ||
      graph == nullptr) {
    return CaptureHold::kHeld;  // no graph to tie it to: held for good
  }
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CaptureHold::kInvalidated;
  auto* release = new std::function<void()>(std::move(on_release));
  CUuserObject object = nullptr;
  if (d_->cuUserObjectCreate(&object, release, RunRelease, 1,
                             CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) != CUDA_SUCCESS) {
    delete release;
    return CaptureHold::kHeld;
  }
  // The graph takes the one reference; if it cannot, the object is left
  // alive (its release would come while the capture still uses the memory).
  d_->cuGraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE);
  return CaptureHold::kHeld;
}

}  // namespace client
}  // namespace gpumem
