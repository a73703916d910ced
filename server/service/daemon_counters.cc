// See daemon_counters.h.
#include "server/service/daemon_counters.h"

#include "common/refusal_payload.h"

namespace gpumem {

void DaemonCounters::RecordRefusal(const absl::Status& status) {
  switch (RefusalKindOf(status)) {
    case RefusalKind::kCapacity: refused_capacity_.fetch_add(1, kRelaxed); break;
    case RefusalKind::kFragmentation: refused_fragmentation_.fetch_add(1, kRelaxed); break;
    case RefusalKind::kQuota: refused_quota_.fetch_add(1, kRelaxed); break;
    case RefusalKind::kOther: refused_other_.fetch_add(1, kRelaxed); break;
  }
}

void DaemonCounters::RecordWaitStart(uint32_t tenant) {
  absl::MutexLock lock(&mu_);
  ++waiting_[tenant];
}

void DaemonCounters::RecordWaitEnd(uint32_t tenant) {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(tenant);
  if (it == waiting_.end()) return;  // unpaired: nothing to undo
  if (--it->second == 0) waiting_.erase(it);
}

uint32_t DaemonCounters::WaitingOf(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(tenant);
  return it == waiting_.end() ? 0 : it->second;
}

std::vector<uint32_t> DaemonCounters::WaitingTenants() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> out;
  for (const auto& [tenant, n] : waiting_) out.push_back(tenant);
  return out;
}

void DaemonCounters::Fill(v1::DaemonCounters* out) const {
  out->set_allocations(allocations_.load(kRelaxed));
  out->set_frees(frees_.load(kRelaxed));
  out->set_refused_capacity(refused_capacity_.load(kRelaxed));
  out->set_refused_fragmentation(refused_fragmentation_.load(kRelaxed));
  out->set_refused_quota(refused_quota_.load(kRelaxed));
  out->set_refused_other(refused_other_.load(kRelaxed));
  uint64_t waiting = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [tenant, n] : waiting_) waiting += n;
  }
  out->set_waiting_requests(waiting);
  out->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_));
}

}  // namespace gpumem
