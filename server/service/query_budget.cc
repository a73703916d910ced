#include "server/service/query_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {

QueryBudget::Hold::~Hold() { budget_->Give(caller_, bytes_); }

absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> QueryBudget::Take(uint32_t uid,
                                                                       uint32_t socket_tenant,
                                                                       size_t bytes) {
  bytes = std::max(bytes, kMinRequestBytes);
  const std::pair<uint32_t, uint32_t> caller{uid, socket_tenant};
  {
    absl::MutexLock lock(&mu_);
    size_t& mine = by_caller_[caller];
    if (mine + bytes > kPerCallerBytes) {
      const size_t held = mine;
      if (held == 0) by_caller_.erase(caller);
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", uid, socket_tenant != 0 ? " through its tenant socket" : "", " has ",
          FormatBytes(held), " of requests waiting for the daemon's query workers; at most ",
          FormatBytes(kPerCallerBytes), " per caller (a fixed limit: README \"Limits\"); retry "
          "when they are answered"));
    }
    if (total_ + bytes > kTotalBytes) {
      if (mine == 0) by_caller_.erase(caller);
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon's query workers have ", FormatBytes(total_), " of requests waiting; at "
          "most ", FormatBytes(kTotalBytes), " (a fixed limit: README \"Limits\"); retry"));
    }
    mine += bytes;
    total_ += bytes;
  }
  return std::shared_ptr<Hold>(new Hold(this, caller, bytes));
}

void QueryBudget::Give(std::pair<uint32_t, uint32_t> caller, size_t bytes) {
  absl::MutexLock lock(&mu_);
  total_ -= bytes;
  auto it = by_caller_.find(caller);
  if (it != by_caller_.end() && (it->second -= bytes) == 0) by_caller_.erase(it);
}

absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> TakeQueryBudget(QueryBudget* budget,
                                                                   const PeerTable& peers,
                                                                   absl::string_view peer,
                                                                   size_t bytes) {
  absl::StatusOr<PeerCred> who = peers.Lookup(peer);
  return budget->Take(who.ok() ? who->uid : UINT32_MAX, who.ok() ? who->socket_tenant : 0, bytes);
}

size_t QueryBudget::held() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace gpumem
