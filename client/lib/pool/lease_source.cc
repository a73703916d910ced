#include "client/lib/pool/lease_source.h"

#include <utility>

namespace gpumem {
namespace client {

absl::StatusOr<std::unique_ptr<LeaseSource>> LeaseSource::Connect(const std::string& socket_path,
                                                                  LostBlocks* lost) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_path);
  if (!c.ok()) return c.status();
  return std::unique_ptr<LeaseSource>(new LeaseSource(std::move(*c), lost));
}

LeaseSource::~LeaseSource() { Close(); }

absl::StatusOr<Buffer> LeaseSource::TakeLease(uint64_t bytes, const Arena& arena,
                                              uint64_t alignment, const v1::UsageReport& usage) {
  client_->SetUsageReport(usage);
  return client_->Allocate(bytes, arena.placement, alignment);
}

void LeaseSource::GiveBack(Buffer lease, const v1::UsageReport& usage) {
  client_->SetUsageReport(usage);
  // The free queue's fences have passed: nothing queued uses it any more.
  lease.FreeNow().IgnoreError();
}

void LeaseSource::ReportReclaimed(uint64_t bytes) {
  client_->ReportReclaimed(bytes).IgnoreError();  // a daemon that is gone reclaims all
}

absl::StatusOr<Block> LeaseSource::Allocate(uint64_t size, const Arena& arena) {
  absl::StatusOr<Buffer> buf = client_->Allocate(size, arena.placement);
  if (!buf.ok()) return buf.status();
  Block b;
  b.ptr = reinterpret_cast<uintptr_t>(buf->data());
  b.bytes = buf->size();
  absl::MutexLock lock(&mu_);
  wholes_[b.ptr] = std::make_unique<Buffer>(std::move(*buf));
  return b;
}

// The free queue's fences have passed: nothing queued uses it any more.
absl::Status LeaseSource::Free(Block block, const ReuseAfter&) { return block.whole->FreeNow(); }

absl::StatusOr<std::vector<Shard>> LeaseSource::AllocateSharded(
    uint64_t total, uint32_t shards, const v1::PlacementRequest& placement) {
  absl::StatusOr<std::vector<Buffer>> bufs = client_->AllocateSharded(total, shards, placement);
  if (!bufs.ok()) return bufs.status();
  std::vector<Shard> out;
  absl::MutexLock lock(&mu_);
  for (Buffer& b : *bufs) {
    out.push_back({b.data(), b.size(), static_cast<int>(b.device_index())});
    const uintptr_t p = reinterpret_cast<uintptr_t>(b.data());
    wholes_[p] = std::make_unique<Buffer>(std::move(b));
  }
  return out;
}

std::unique_ptr<Buffer> LeaseSource::TakeWhole(uintptr_t p) {
  absl::MutexLock lock(&mu_);
  auto it = wholes_.find(p);
  if (it == wholes_.end()) return nullptr;
  std::unique_ptr<Buffer> whole = std::move(it->second);
  wholes_.erase(it);
  return whole;
}

std::optional<LeaseSource::WholeInfo> LeaseSource::FindWhole(uintptr_t p) {
  absl::MutexLock lock(&mu_);
  auto it = wholes_.find(p);
  if (it == wholes_.end()) return std::nullopt;
  const Buffer& b = *it->second;
  return WholeInfo{b.id(), static_cast<int>(b.device_index()), IsDeviceMemory(b), b.device_uuid(),
                   b.size()};
}

void LeaseSource::MarkLost(const absl::flat_hash_set<uint64_t>& ids) {
  absl::MutexLock lock(&mu_);
  for (auto it = wholes_.begin(); it != wholes_.end();) {
    if (!ids.contains(it->second->id())) {
      ++it;
      continue;
    }
    lost_bytes_ += it->second->size();
    lost_wholes_[it->first] = std::move(it->second);
    wholes_.erase(it++);
  }
}

bool LeaseSource::FreeLost(uintptr_t p) {
  uint64_t size;
  {
    absl::MutexLock lock(&mu_);
    auto it = lost_wholes_.find(p);
    if (it == lost_wholes_.end()) return false;
    size = it->second->size();
    it->second->Abandon();
    lost_wholes_.erase(it);
  }
  lost_->Reserve(p, size);
  return true;
}

bool LeaseSource::IsLost(uintptr_t p) {
  absl::MutexLock lock(&mu_);
  return lost_wholes_.contains(p);
}

LeaseSource::Figures LeaseSource::Stats() {
  Figures f;
  absl::MutexLock lock(&mu_);
  for (const auto& [ptr, b] : wholes_) {
    ++f.blocks;
    f.bytes += b->size();
    f.bytes_by_device[b->device_index()] += b->size();
  }
  f.lost_bytes = lost_bytes_;
  return f;
}

void LeaseSource::Close() {
  absl::flat_hash_map<uintptr_t, std::unique_ptr<Buffer>> wholes, lost;
  {
    absl::MutexLock lock(&mu_);
    wholes.swap(wholes_);
    lost.swap(lost_wholes_);
  }
  // Blocks still allocated at close are freed at the daemon now (the pool
  // waited for every deferred free first).
  for (auto& [ptr, b] : wholes) b->FreeNow().IgnoreError();
  wholes.clear();
  for (auto& [ptr, b] : lost) b->Abandon();
  lost.clear();
  client_.reset();
}

}  // namespace client
}  // namespace gpumem
