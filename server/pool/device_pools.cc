#include "server/pool/device_pools.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpumem {

DevicePools::DevicePools(Backend* backend, const PoolOptions& options) : backend_(backend) {
  for (const DeviceInfo& d : backend_->devices()) {
    pools_.push_back(std::make_unique<SlabPool>(backend_, d.index, options));
    placement::DeviceView v;
    v.index = d.index;
    v.uuid = d.uuid;
    v.total_bytes = d.total_bytes;
    views_.push_back(std::move(v));
    largest_device_bytes_ = std::max(largest_device_bytes_, d.total_bytes);
  }
}

placement::DeviceSnapshot DevicePools::Snapshot() const {
  placement::DeviceSnapshot snap;
  snap.devices = views_;
  for (placement::DeviceView& v : snap.devices) {
    const PoolStats s = pools_[v.index]->Stats();
    v.used_bytes = s.used_bytes;
    // Retained bytes are held by some process: not free, not offered; nor
    // is what the device itself has no room for (Backend::NewSlabRoom).
    v.free_bytes = s.free_bytes;
    v.largest_free_bytes = s.largest_carvable;
  }
  const Backend* backend = backend_;
  static_assert(static_cast<int>(PeerLink::kPcie) ==
                    static_cast<int>(placement::PeerDistance::kPcie) &&
                static_cast<int>(PeerLink::kHost) ==
                    static_cast<int>(placement::PeerDistance::kHost),
                "PeerLink and PeerDistance share their values");
  snap.peer = [backend](uint32_t a, uint32_t b) {
    return static_cast<placement::PeerDistance>(backend->Peer(a, b));
  };
  return snap;
}

SlabPool* DevicePools::PoolOfSlab(uint64_t slab_id) {
  for (auto& pool : pools_) {
    if (pool->HasSlab(slab_id)) return pool.get();
  }
  return nullptr;
}

absl::Status DevicePools::Reserve() {
  for (auto& pool : pools_) {
    absl::Status s = pool->Reserve();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void DevicePools::SetBudget(SlabBudget* budget) {
  for (auto& pool : pools_) pool->SetBudget(budget);
}

void DevicePools::ReleaseIdleSlabs(absl::Time now) {
  for (auto& pool : pools_) pool->ReleaseIdleSlabs(now);
}

void DevicePools::ReleaseTenantSlabs(uint32_t tenant) {
  for (auto& pool : pools_) pool->ReleaseTenantSlabs(tenant);
}

void DevicePools::SetEmptyReleaseAfter(absl::Duration after) {
  for (auto& pool : pools_) pool->SetEmptyReleaseAfter(after);
}

void DevicePools::ForgetSession(uint64_t session) {
  for (auto& pool : pools_) pool->ForgetSession(session);
}

void DevicePools::ReleaseAll() {
  for (auto& pool : pools_) pool->ReleaseAll();
}

absl::StatusOr<placement::CarvedBlock> PoolCarver::TryCarve(
    uint32_t device, uint64_t size, uint64_t alignment, Refusal* refusal) {
  SlabPool& pool = pools_->pool(device);
  const CarveResult r = mode_ == Mode::kMayCallBackend
                            ? pool.Carve(size, alignment, tenant_, kind_)
                            : pool.TryCarve(size, alignment, tenant_, kind_);
  switch (r.kind) {
    case CarveResult::Kind::kError:
      return r.error;
    case CarveResult::Kind::kNeedsBackendWork:
      // Not a refusal: placement undoes what it carved and stops. The fact
      // is kept here for the caller.
      needed_backend_work_ = true;
      return absl::UnavailableError(absl::StrCat(
          "device ", device, ": serving this request needs backend work (a new slab "
          "or releasing empty ones), which this call may not do"));
    case CarveResult::Kind::kRefused:
      *refusal = r.refusal;
      return absl::ResourceExhaustedError(refusal->message);
    case CarveResult::Kind::kBlock:
      break;
  }
  placement::CarvedBlock c;
  c.device = device;
  c.size_bytes = size;
  c.id = next_key_++;
  c.slab_id = r.block.slab_id;
  c.offset = r.block.offset;
  pending_[c.id] = r.block;
  return c;
}

void PoolCarver::Release(const placement::CarvedBlock& block) {
  auto it = pending_.find(block.id);
  if (it == pending_.end()) return;
  pools_->pool(block.device).Uncarve(it->second);
  pending_.erase(it);
}

}  // namespace gpumem
