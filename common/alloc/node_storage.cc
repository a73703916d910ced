// NodeStorage: growth in the owner's thread or on the PagePopulator (see
// node_storage.h).
#include "common/alloc/node_storage.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace gpumem {

std::shared_ptr<NodeStorage> NodeStorage::Create(size_t node_bytes, size_t flag_bytes,
                                                 uint64_t reserve_slots,
                                                 PagePopulator* populator) {
  return std::shared_ptr<NodeStorage>(
      new NodeStorage(node_bytes, flag_bytes, reserve_slots, populator));
}

NodeStorage::NodeStorage(size_t node_bytes, size_t flag_bytes, uint64_t reserve_slots,
                         PagePopulator* populator)
    : node_bytes_(node_bytes),
      flag_bytes_(flag_bytes),
      reserve_slots_(static_cast<uint32_t>(std::min<uint64_t>(
          std::max<uint64_t>(reserve_slots, kInitialSlots), 0xFFFFFFF0u))),
      populator_(populator) {
  absl::MutexLock lock(&mu_);
  node_buffer_.Reserve(uint64_t{reserve_slots_} * node_bytes_);
  flag_buffer_.Reserve(uint64_t{reserve_slots_} * flag_bytes_);
  nodes_ = node_buffer_.data();
  flags_ = flag_buffer_.data();
}

// A quarter of what is handed out, a page to 1 MiB of nodes: the
// populator is woken once per `ahead` new slots (so about 60 times on the
// way to a million ranges), far enough ahead to keep up with a slab filling
// as fast as blocks can be carved, though a page costs far more than a
// block (128 slots a page), once the slab holds a few thousand ranges;
// little is held unused (at most twice `ahead`: 8 KiB for a slab of a few
// blocks).
uint64_t NodeStorage::AheadBytes(uint64_t handed_out_bytes) {
  return std::clamp<uint64_t>(MappedBuffer::RoundUpToPage(handed_out_bytes / 4),
                              MappedBuffer::PageSize(), uint64_t{1} << 20);
}

uint32_t NodeStorage::Prepare(uint32_t n) {
  uint32_t usable = usable_.load(std::memory_order_acquire);
  if (populator_ == nullptr || n >= reserve_slots_) {
    // In this thread: one batch (half what is populated, a page to
    // kBatchBytes) usable and faulted in at a time.
    const uint32_t populated = populated_.load(std::memory_order_relaxed);
    if (n < populated && n < usable) return std::min(populated, usable);
    const uint32_t from = std::max(populated, n);
    const uint64_t have = uint64_t{from} * node_bytes_;
    const uint64_t batch = std::clamp<uint64_t>(MappedBuffer::RoundUpToPage(have / 2),
                                                MappedBuffer::PageSize(), kBatchBytes);
    uint32_t to = static_cast<uint32_t>(std::min<uint64_t>(
        (have + batch) / node_bytes_, 0xFFFFFFF0u));
    if (to <= n) to = n + 1;
    if (to > usable) {
      absl::MutexLock lock(&mu_);
      if (GrowLocked(to)) ++own_.remaps;
      usable = usable_.load(std::memory_order_relaxed);
      nodes_ = node_buffer_.data();
      flags_ = flag_buffer_.data();
      ++own_.grows;
    }
    to = std::min(to, usable);
    PopulateSlots(static_cast<char*>(nodes_), static_cast<char*>(flags_), from, to);
    RaisePopulated(to);
    return to;
  }

  if (n >= usable) {
    // The populator is behind (or was never asked): make one batch usable
    // here and let its pages fault in one at a time as they are written.
    absl::MutexLock lock(&mu_);
    GrowLocked(std::min<uint64_t>(uint64_t{n} + kBatchBytes / node_bytes_, reserve_slots_));
    usable = usable_.load(std::memory_order_relaxed);
    ++own_.grows;
  }
  const uint64_t ahead = AheadBytes(uint64_t{n} * node_bytes_) / node_bytes_;
  const uint32_t target = static_cast<uint32_t>(
      std::min<uint64_t>(n + 2 * ahead, reserve_slots_));
  if (requested_ < n + ahead && target > requested_) {
    requested_ = target;
    ++own_.requests;
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
    }
    populator_->Post([weak = weak_from_this(), target] {
      if (std::shared_ptr<NodeStorage> self = weak.lock()) self->Background(target);
    });
  }
  const uint64_t check = requested_ > ahead ? requested_ - ahead : 0;
  return static_cast<uint32_t>(
      std::max<uint64_t>(n + 1, std::min<uint64_t>(usable, check)));
}

bool NodeStorage::GrowLocked(uint64_t slots) {
  uint64_t want = slots * node_bytes_;
  const uint64_t have = node_buffer_.bytes();
  if (want <= have) return false;
  const bool remap = want > node_buffer_.reserved();
  if (remap) {
    // mremap may move the arrays: not while the populator works on them.
    want = std::max(want, 2 * have);
    mu_.Await(absl::Condition(
        +[](bool* populating) { return !*populating; }, &populating_));
  }
  want = std::min<uint64_t>(want, uint64_t{0xFFFFFFF0u} * node_bytes_);
  node_buffer_.Resize(want);
  flag_buffer_.Resize(want / node_bytes_ * flag_bytes_);
  usable_.store(static_cast<uint32_t>(std::min<uint64_t>(
                    node_buffer_.bytes() / node_bytes_,
                    flag_buffer_.bytes() / flag_bytes_)),
                std::memory_order_release);
  return remap;
}

void NodeStorage::PopulateSlots(char* node_base, char* flag_base, uint32_t from,
                                uint32_t to) {
  if (from >= to) return;
  const uint64_t pages =
      MappedBuffer::PopulateRange(node_base + uint64_t{from} * node_bytes_,
                                  uint64_t{to - from} * node_bytes_) +
      MappedBuffer::PopulateRange(flag_base + uint64_t{from} * flag_bytes_,
                                  uint64_t{to - from} * flag_bytes_);
  // Counted by the thread that faulted the pages in, whichever path it
  // came by: the owner's counts are the owner's alone.
  if (PagePopulator::OnWorkerThread()) {
    background_pages_.fetch_add(pages, std::memory_order_relaxed);
    background_batches_.fetch_add(1, std::memory_order_relaxed);
  } else {
    own_.pages_populated += pages;
    ++own_.populate_batches;
  }
}

void NodeStorage::RaisePopulated(uint32_t to) {
  uint32_t have = populated_.load(std::memory_order_relaxed);
  while (to > have &&
         !populated_.compare_exchange_weak(have, to, std::memory_order_relaxed)) {
  }
}

void NodeStorage::Background(uint32_t target) {
  char* node_base;
  char* flag_base;
  uint32_t from;
  {
    absl::MutexLock lock(&mu_);
    target = std::min(target, reserve_slots_);
    if (usable_.load(std::memory_order_relaxed) < target) GrowLocked(target);
    from = populated_.load(std::memory_order_relaxed);
    if (from >= target) {
      --pending_;
      return;
    }
    populating_ = true;  // the arrays stay where they are until it is false
    node_base = static_cast<char*>(node_buffer_.data());
    flag_base = static_cast<char*>(flag_buffer_.data());
  }
  const uint32_t step = static_cast<uint32_t>(kBatchBytes / node_bytes_);
  for (uint32_t at = from; at < target;) {
    const uint32_t to = std::min<uint64_t>(target, uint64_t{at} + step);
    PopulateSlots(node_base, flag_base, at, to);
    RaisePopulated(to);
    at = to;
  }
  absl::MutexLock lock(&mu_);
  populating_ = false;
  --pending_;
}

NodeStorage::Counts NodeStorage::counts() const {
  Counts c = own_;
  c.background_batches = background_batches_.load(std::memory_order_relaxed);
  c.background_pages = background_pages_.load(std::memory_order_relaxed);
  return c;
}

uint64_t NodeStorage::ResidentBytes(uint32_t handed_out) const {
  const uint64_t slots =
      std::max(handed_out, populated_.load(std::memory_order_relaxed));
  return MappedBuffer::RoundUpToPage(slots * node_bytes_) +
         MappedBuffer::RoundUpToPage(slots * flag_bytes_);
}

absl::Status NodeStorage::Check(uint32_t handed_out) const {
  absl::MutexLock lock(&mu_);
  const uint32_t usable = usable_.load(std::memory_order_relaxed);
  const uint32_t populated = populated_.load(std::memory_order_relaxed);
  if (handed_out > usable || populated > usable ||
      uint64_t{usable} * node_bytes_ > node_buffer_.bytes() ||
      uint64_t{usable} * flag_bytes_ > flag_buffer_.bytes() ||
      node_buffer_.bytes() > node_buffer_.reserved() ||
      flag_buffer_.bytes() > flag_buffer_.reserved() ||
      nodes_ != node_buffer_.data() || flags_ != flag_buffer_.data()) {
    return absl::InternalError(absl::StrFormat(
        "I7 node storage: %u slots handed out, %u populated, %u usable; buffers "
        "of %u and %u bytes, %u and %u reserved; cached addresses %s",
        handed_out, populated, usable, node_buffer_.bytes(), flag_buffer_.bytes(),
        node_buffer_.reserved(), flag_buffer_.reserved(),
        nodes_ == node_buffer_.data() && flags_ == flag_buffer_.data() ? "current"
                                                                       : "stale"));
  }
  return absl::OkStatus();
}

void NodeStorage::WaitForBackground() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](const int* pending) { return *pending == 0; }, &pending_));
}

}  // namespace gpumem
