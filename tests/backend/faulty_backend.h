// FaultyBackend: a Backend decorator for tests that injects the failures a
// real driver can produce, over any inner backend (usually SimBackend).
//
//  - FailCreate(n, status): the n-th CreateSlab from now (1 = the next one)
//    fails with `status`; n = 0 clears it. FailEveryCreate(status) fails all.
//  - FailExport(status): every slab's ExportFd fails with `status` (OK clears).
//  - SlowCreate(device, delay): CreateSlab on `device` sleeps `delay` first,
//    as cuMemCreate plus mapping and zeroing may on a large slab.
//  - SetDeviceFree(bytes): the device has only `bytes` left for new slabs
//    (memory other processes hold, as a driver's cuMemGetInfo would say).
//    The backend learns it as the cuda backend does: on RefreshNewSlabRoom,
//    and around the slabs it makes and releases; NewSlabRoom says what it
//    learnt last. refreshes() counts RefreshNewSlabRoom calls.
// Counters say how many calls were made. Thread-safe.
#ifndef GPUMEMD_TESTS_BACKEND_FAULTY_BACKEND_H_
#define GPUMEMD_TESTS_BACKEND_FAULTY_BACKEND_H_

#include <atomic>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/backend/backend.h"

namespace gpumem {
namespace testing {

class FaultyBackend : public Backend {
 public:
  explicit FaultyBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  void FailCreate(int nth, absl::Status status) {
    absl::MutexLock lock(&mu_);
    create_countdown_ = nth;
    create_error_ = std::move(status);
    fail_every_create_ = false;
  }
  void FailEveryCreate(absl::Status status) {
    absl::MutexLock lock(&mu_);
    create_error_ = std::move(status);
    fail_every_create_ = !create_error_.ok();
    create_countdown_ = 0;
  }
  void FailExport(absl::Status status) {
    absl::MutexLock lock(&mu_);
    export_error_ = std::move(status);
  }
  void SlowCreate(uint32_t device, absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    slow_device_ = device;
    slow_delay_ = delay;
  }
  void SetDeviceFree(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    device_free_ = bytes;
  }
  int refreshes() const { return refreshes_.load(); }
  uint64_t NewSlabRoom(uint32_t device) const override {
    absl::MutexLock lock(&mu_);
    return device_free_ == UINT64_MAX ? inner_->NewSlabRoom(device) : room_seen_;
  }
  void RefreshNewSlabRoom(uint32_t device) override {
    refreshes_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    room_seen_ = device_free_;
    inner_->RefreshNewSlabRoom(device);
  }
  int creates() const { return creates_.load(); }
  // Slow creations (SlowCreate) begun, and finished sleeping.
  int slow_creates_begun() const { return slow_begun_.load(); }
  int slow_creates_slept() const { return slow_slept_.load(); }
  int exports() const { return exports_.load(); }

  const char* name() const override { return inner_->name(); }
  const std::vector<DeviceInfo>& devices() const override { return inner_->devices(); }
  PeerLink Peer(uint32_t a, uint32_t b) const override { return inner_->Peer(a, b); }
  uint64_t SlabBytes(uint32_t device) const override { return inner_->SlabBytes(device); }
  const std::vector<HandleKind>& handle_kinds() const override {
    return inner_->handle_kinds();
  }
  uint64_t Granularity(uint32_t device) const override { return inner_->Granularity(device); }
  using Backend::CreateSlab;

  absl::StatusOr<std::unique_ptr<Slab>> CreateSlab(uint32_t device, uint64_t bytes,
                                                   HandleKind kind) override {
    creates_.fetch_add(1);
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      if (fail_every_create_) return create_error_;
      if (create_countdown_ > 0 && --create_countdown_ == 0) return create_error_;
      if (device == slow_device_) delay = slow_delay_;
    }
    if (delay > absl::ZeroDuration()) {
      slow_begun_.fetch_add(1);
      absl::SleepFor(delay);
      slow_slept_.fetch_add(1);
    }
    {
      absl::MutexLock lock(&mu_);
      if (device_free_ != UINT64_MAX) {
        if (bytes > device_free_) {
          return absl::ResourceExhaustedError("the device has no room for the slab");
        }
        device_free_ -= bytes;
        room_seen_ = device_free_;
      }
    }
    absl::StatusOr<std::unique_ptr<Slab>> slab = inner_->CreateSlab(device, bytes, kind);
    if (!slab.ok()) return slab.status();
    return std::unique_ptr<Slab>(new FaultySlab(this, std::move(*slab)));
  }

 private:
  class FaultySlab : public Slab {
   public:
    FaultySlab(FaultyBackend* owner, std::unique_ptr<Slab> inner)
        : owner_(owner), inner_(std::move(inner)) {}
    ~FaultySlab() override {
      absl::MutexLock lock(&owner_->mu_);
      if (owner_->device_free_ != UINT64_MAX) {
        owner_->device_free_ += inner_->size();
        owner_->room_seen_ = owner_->device_free_;
      }
    }
    uint32_t device() const override { return inner_->device(); }
    uint64_t size() const override { return inner_->size(); }
    HandleKind handle_kind() const override { return inner_->handle_kind(); }
    absl::StatusOr<std::string> IpcHandle() const override { return inner_->IpcHandle(); }
    absl::StatusOr<int> ExportFd() const override {
      owner_->exports_.fetch_add(1);
      {
        absl::MutexLock lock(&owner_->mu_);
        if (!owner_->export_error_.ok()) return owner_->export_error_;
      }
      return inner_->ExportFd();
    }
    absl::Status Scrub(uint64_t offset, uint64_t length) override {
      return inner_->Scrub(offset, length);
    }

   private:
    FaultyBackend* owner_;
    std::unique_ptr<Slab> inner_;
  };

  std::unique_ptr<Backend> inner_;
  mutable absl::Mutex mu_;
  int create_countdown_ = 0;
  bool fail_every_create_ = false;
  absl::Status create_error_;
  absl::Status export_error_;
  uint32_t slow_device_ = UINT32_MAX;
  absl::Duration slow_delay_;
  std::atomic<int> creates_{0};
  std::atomic<int> slow_begun_{0}, slow_slept_{0};
  std::atomic<int> exports_{0};
  std::atomic<int> refreshes_{0};
  uint64_t device_free_ = UINT64_MAX;  // UINT64_MAX: as the inner backend
  uint64_t room_seen_ = UINT64_MAX;
};

}  // namespace testing
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_BACKEND_FAULTY_BACKEND_H_
