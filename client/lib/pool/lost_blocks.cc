#include "client/lib/pool/lost_blocks.h"

namespace gpumem {
namespace client {

bool LostBlocks::Report(const Client::RestartReport& report) {
  if (report.lost.empty()) return false;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, why] : report.lost) ids_.insert(id);
  pending_.store(true);
  return true;
}

absl::flat_hash_set<uint64_t> LostBlocks::TakeIds() {
  absl::flat_hash_set<uint64_t> ids;
  absl::MutexLock lock(&mu_);
  ids.swap(ids_);
  pending_.store(false);
  return ids;
}

void LostBlocks::Reserve(uintptr_t begin, uint64_t size) {
  absl::MutexLock lock(&mu_);
  for (const auto& [b, n] : ranges_) {
    if (begin >= b && begin + size <= b + n) return;
  }
  ranges_.push_back({begin, size});
}

bool LostBlocks::Reserved(uintptr_t p) {
  absl::MutexLock lock(&mu_);
  for (const auto& [b, n] : ranges_) {
    if (p - b < n) return true;
  }
  return false;
}

}  // namespace client
}  // namespace gpumem
