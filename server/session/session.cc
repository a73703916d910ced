#include "server/session/session.h"

#include "absl/status/status.h"

namespace gpumem {

Session::Session(uint64_t id, PeerCred cred, std::string token)
    : id_(id), cred_(cred), started_(absl::Now()), token_(std::move(token)) {}

absl::StatusOr<tenants::TenantRef> Session::FixTenant(
    const std::function<absl::StatusOr<tenants::TenantRef>()>& resolve) {
  absl::MutexLock lock(&mu_);
  if (ended_) return absl::FailedPreconditionError("the calling process has exited");
  if (tenant_.has_value()) return *tenant_;
  absl::StatusOr<tenants::TenantRef> resolved = resolve();
  if (resolved.ok()) tenant_ = *resolved;
  return resolved;
}

std::optional<tenants::TenantRef> Session::tenant() const {
  absl::MutexLock lock(&mu_);
  return tenant_;
}

bool Session::AddAllocations(const std::vector<SessionBlock>& blocks) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  for (const SessionBlock& b : blocks) {
    blocks_[b.id] = {b.device, b.bytes};
    used_bytes_ += b.bytes;
    device_bytes_[b.device] += b.bytes;
  }
  return true;
}

void Session::RemoveAllocation(const SessionBlock& block) {
  absl::MutexLock lock(&mu_);
  if (blocks_.erase(block.id) == 0) return;
  used_bytes_ -= block.bytes;
  auto d = device_bytes_.find(block.device);
  if (d != device_bytes_.end() && (d->second -= block.bytes) == 0) device_bytes_.erase(d);
}

void Session::RecordUsage(const UsageFigures& usage) {
  absl::MutexLock lock(&mu_);
  if (!ended_) usage_ = usage;
}

std::vector<uint64_t> Session::End() {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  std::vector<uint64_t> ids;
  ids.reserve(blocks_.size());
  for (const auto& [id, where] : blocks_) ids.push_back(id);
  blocks_.clear();
  used_bytes_ = 0;
  device_bytes_.clear();
  usage_.reset();
  return ids;
}

bool Session::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

Session::Figures Session::figures() const {
  absl::MutexLock lock(&mu_);
  Figures f;
  f.allocations = blocks_.size();
  f.used_bytes = used_bytes_;
  f.device_bytes = device_bytes_;
  f.usage = usage_;
  f.tenant = tenant_;
  f.ended = ended_;
  return f;
}

}  // namespace gpumem
