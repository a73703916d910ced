#include "server/session/session.h"

#include "absl/status/status.h"

namespace gpumem {

absl::Status CallerExitedError() {
  return absl::FailedPreconditionError("the calling process has exited");
}

Session::Session(uint64_t id, PeerCred cred, std::string token, state::DurableState* state,
                 uint64_t start_ticks, uint32_t slot, std::optional<tenants::TenantRef> tenant)
    : id_(id),
      cred_(cred),
      started_(absl::Now()),
      token_(std::move(token)),
      state_(state),
      start_ticks_(start_ticks) {
  absl::MutexLock lock(&mu_);
  tenant_ = std::move(tenant);
  slot_ = slot;
  if (slot_ == state::kNoSlot) RecordLocked();
}

void Session::RecordLocked() {
  if (state_ == nullptr) return;
  state::SessionRecord r;
  r.id = id_;
  r.start_ticks = start_ticks_;
  r.pid = cred_.pid;
  r.uid = cred_.uid;
  r.gid = cred_.gid;
  r.bound = cred_.pid <= 0 ? 1 : 0;
  r.via_socket = cred_.socket_tenant != 0 ? 1 : 0;
  r.set_token(token_);
  if (tenant_.has_value()) {
    r.tenant_fixed = 1;
    r.tenant = tenant_->id;
    r.set_tenant_name(tenant_->name);
  }
  const uint32_t old = slot_;
  slot_ = state_->PutSession(r);  // the new copy first: a crash between keeps one
  state_->RemoveSession(old);
}

absl::StatusOr<tenants::TenantRef> Session::FixTenant(
    const std::function<absl::StatusOr<tenants::TenantRef>()>& resolve) {
  absl::MutexLock lock(&mu_);
  if (ended_) return CallerExitedError();
  if (tenant_.has_value()) return *tenant_;
  absl::StatusOr<tenants::TenantRef> resolved = resolve();
  if (resolved.ok()) {
    tenant_ = *resolved;
    RecordLocked();
  }
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
  if (!ended_ && state_ != nullptr) {
    state_->RemoveSession(slot_);
    slot_ = state::kNoSlot;
  }
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
