// See reset_budget.h.
#include "server/service/reset_budget.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shrink_if_sparse.h"

namespace gpumem {

uint64_t ResetBudget::Key(const PeerCred& cred) {
  if (cred.socket_tenant != 0) return (uint64_t{1} << 32) | cred.socket_tenant;
  return cred.uid;
}

std::string ResetBudget::PrincipalName(const PeerCred& cred) {
  if (cred.socket_tenant != 0) return absl::StrCat("tenant ", cred.socket_tenant, "'s socket");
  return absl::StrCat("uid ", cred.uid);
}

double ResetBudget::TokensAt(const Bucket& b, absl::Time now) {
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - b.at));
  return std::min(kBurst, b.tokens + elapsed * kPerSecond);
}

bool ResetBudget::Spend(const PeerCred& cred, absl::Time now) {
  auto [it, fresh] = buckets_.try_emplace(Key(cred));
  Bucket& b = it->second;
  if (fresh) b.at = now;
  b.tokens = TokensAt(b, now);
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

void ResetBudget::SpendAll(const PeerCred& cred, absl::Time now) {
  Bucket& b = buckets_[Key(cred)];
  b.tokens = 0;
  b.at = now;
}

bool ResetBudget::Admits(const PeerCred& cred, absl::Time now) const {
  auto it = buckets_.find(Key(cred));
  return it == buckets_.end() || TokensAt(it->second, now) >= kPerSecond;
}

void ResetBudget::Sweep(absl::Time now) {
  std::vector<uint64_t> whole;
  for (const auto& [key, b] : buckets_) {
    if (TokensAt(b, now) >= kBurst) whole.push_back(key);
  }
  for (uint64_t key : whole) buckets_.erase(key);
  ShrinkIfSparse(buckets_);
}

}  // namespace gpumem
