#include "server/allocations/allocation_table.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/shrink_if_sparse.h"

namespace gpumem {

AllocationTable::AllocationTable(ledger::TenantLedger* ledger,
                                 std::function<std::string(uint32_t)> tenant_name,
                                 state::DurableState* state)
    : ledger_(ledger),
      state_(state),
      tenant_name_(std::move(tenant_name)),
      next_id_(ledger != nullptr ? ledger->first_allocation_id() : 1) {}

absl::StatusOr<std::vector<uint64_t>> AllocationTable::Commit(
    Session& session, const std::vector<AllocationRecord>& records) {
  std::vector<uint64_t> ids;
  ids.reserve(records.size());
  std::vector<SessionBlock> blocks;
  blocks.reserve(records.size());
  absl::MutexLock lock(&mu_);
  uint64_t id = next_id_;
  for (const AllocationRecord& r : records) {
    ids.push_back(id);
    blocks.push_back(SessionBlock{id, r.device, r.block.size});
    ++id;
  }
  // What a restart needs first: an allocation the state file has no room
  // for would not survive one, so it is refused (nothing kept) instead.
  std::vector<uint32_t> slots(records.size(), state::kNoSlot);
  auto drop_slots = [&] {
    for (uint32_t slot : slots) {
      if (slot != state::kNoSlot) state_->RemoveAllocation(slot);
    }
  };
  const int64_t now = state_ != nullptr ? absl::GetCurrentTimeNanos() : 0;
  if (state_ != nullptr) {
    for (size_t i = 0; i < records.size(); ++i) {
      const AllocationRecord& r = records[i];
      state::AllocationRecordData d;
      d.id = ids[i];
      d.session = session.id();
      d.slab_id = r.block.slab_id;
      d.offset = r.block.offset;
      d.size = r.block.size;
      d.charged = r.charged;
      d.time_ns = now;
      d.uid = r.uid;
      d.pid = r.pid;
      d.tenant = r.tenant;
      d.device = r.device;
      d.request_key = r.request_key;
      absl::StatusOr<uint32_t> slot = state_->AddAllocation(d);
      if (!slot.ok() && absl::IsResourceExhausted(slot.status())) {
        drop_slots();
        return slot.status();
      }
      // Frozen (stopping for a restart): kept nowhere, as with Put.
      slots[i] = slot.ok() ? *slot : state::kNoSlot;
    }
  }
  // Under the table lock, so a session ending now either sees these ids
  // (and TakeAll, which needs this lock, finds them) or refuses them.
  if (!session.AddAllocations(blocks)) {
    if (state_ != nullptr) drop_slots();
    return CallerExitedError();
  }
  next_id_ = id;
  for (size_t i = 0; i < records.size(); ++i) {
    AllocationRecord& r = records_[ids[i]];
    r = records[i];
    r.session = &session;
    r.state_slot = slots[i];
    AppendEvent(ledger::EventKind::kAllocate, ids[i], r);
  }
  return ids;
}

AllocationRecord AllocationTable::EraseLocked(
    absl::flat_hash_map<uint64_t, AllocationRecord>::iterator it, ledger::EventKind why,
    const std::string& detail) {
  AllocationRecord r = it->second;
  AppendEvent(why, it->first, r, detail);
  if (state_ != nullptr) state_->RemoveAllocation(r.state_slot);
  r.session->RemoveAllocation(SessionBlock{it->first, r.device, r.block.size});
  records_.erase(it);
  ShrinkIfSparse(records_);  // what a burst of blocks grew is given back
  return r;
}

absl::StatusOr<AllocationRecord> AllocationTable::Take(
    uint64_t id, const std::function<absl::Status(const AllocationRecord&)>& may_take,
    ledger::EventKind why, const std::string& detail) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(id);
  if (it == records_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no live allocation ", id, " (never allocated, already freed, or its process exited)"));
  }
  if (absl::Status ok = may_take(it->second); !ok.ok()) return ok;
  return EraseLocked(it, why, detail);
}

std::vector<AllocationRecord> AllocationTable::TakeAll(const std::vector<uint64_t>& ids,
                                                       ledger::EventKind why,
                                                       const std::string& detail) {
  std::vector<AllocationRecord> out;
  out.reserve(ids.size());
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = records_.find(id);
    if (it != records_.end()) out.push_back(EraseLocked(it, why, detail));
  }
  return out;
}

std::vector<AllocationRecord> AllocationTable::Clear(ledger::EventKind why) {
  std::vector<AllocationRecord> out;
  absl::MutexLock lock(&mu_);
  out.reserve(records_.size());
  for (const auto& [id, r] : records_) {
    AppendEvent(why, id, r);
    if (state_ != nullptr) state_->RemoveAllocation(r.state_slot);
    out.push_back(r);
  }
  records_.clear();
  return out;
}

absl::Status AllocationTable::Restore(uint64_t id, AllocationRecord record, Session& session) {
  absl::MutexLock lock(&mu_);
  if (records_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("allocation ", id, " restored twice"));
  }
  if (!session.AddAllocations({SessionBlock{id, record.device, record.block.size}})) {
    return absl::FailedPreconditionError("its session has ended");
  }
  record.session = &session;
  records_[id] = record;
  next_id_ = std::max(next_id_, id + 1);
  return absl::OkStatus();
}

void AllocationTable::AdvanceIdsPast(uint64_t id) {
  absl::MutexLock lock(&mu_);
  next_id_ = std::max(next_id_, id + 1);
}

std::optional<AllocationRecord> AllocationTable::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(id);
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

size_t AllocationTable::size() const {
  absl::MutexLock lock(&mu_);
  return records_.size();
}

void AllocationTable::ForEach(
    const std::function<void(uint64_t, const AllocationRecord&)>& visit) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, r] : records_) visit(id, r);
}

void AllocationTable::AppendEvent(ledger::EventKind kind, uint64_t id,
                                  const AllocationRecord& r, const std::string& detail) {
  if (ledger_ == nullptr) return;
  ledger::LedgerEvent e;
  e.kind = kind;
  e.tenant = tenant_name_(r.tenant);
  e.uid = r.uid;
  e.pid = r.pid;
  e.session = r.session->id();
  e.device = static_cast<int32_t>(r.device);
  e.bytes = r.charged;
  e.allocation_id = id;
  e.detail = detail;
  ledger_->Append(std::move(e));
}

}  // namespace gpumem
