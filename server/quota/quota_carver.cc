#include "server/quota/quota_carver.h"

#include <algorithm>

#include "absl/status/status.h"

namespace gpumem {
namespace quota {

absl::StatusOr<placement::CarvedBlock> QuotaCarver::TryCarve(
    uint32_t device, uint64_t size, uint64_t alignment, Refusal* refusal) {
  if (!book_->TryCharge(tenant_, tenant_name_, device, size, refusal)) {
    return absl::ResourceExhaustedError(refusal->message);
  }
  absl::StatusOr<placement::CarvedBlock> block =
      inner_->TryCarve(device, size, alignment, refusal);
  if (!block.ok()) {
    book_->Uncharge(tenant_, device, size);
  } else {
    uncommitted_bytes_ += size;
  }
  return block;
}

void QuotaCarver::Release(const placement::CarvedBlock& block) {
  inner_->Release(block);
  book_->Uncharge(tenant_, block.device, block.size_bytes);
  uncommitted_bytes_ -= std::min(uncommitted_bytes_, block.size_bytes);
}

void QuotaCarver::Commit() {
  if (uncommitted_bytes_ == 0) return;
  book_->Commit(tenant_, uncommitted_bytes_);
  uncommitted_bytes_ = 0;
}

}  // namespace quota
}  // namespace gpumem
