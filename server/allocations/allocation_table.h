// AllocationTable: every live allocation of the daemon, and the one place an
// allocation begins (Commit) and ends (Take, TakeAll, Clear).
//
// Invariants: nothing is ever left in the table for an ended session; ids
// increase and never repeat across restarts; with a ledger, the ledger's
// order of ALLOCATE and ending events is the table's; with a DurableState,
// every live allocation is recorded there before anyone is answered and its
// record goes when it leaves, so a restarted daemon finds exactly the
// allocations that were live (server/state/); a record's session pointer is
// valid while the record is in the table (a session object outlives the
// TakeAll of its ids, and every other removal happens under the lock).
// Thread-safe; one short lock, held for map updates and ledger queue pushes
// (TenantLedger::Append never touches the disk).
#ifndef GPUMEMD_SERVER_ALLOCATIONS_ALLOCATION_TABLE_H_
#define GPUMEMD_SERVER_ALLOCATIONS_ALLOCATION_TABLE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/ledger/ledger_event.h"
#include "server/ledger/tenant_ledger.h"
#include "server/pool/slab_pool.h"
#include "server/session/session.h"
#include "server/state/durable_state.h"

namespace gpumem {

// One live allocation (a million of them is a normal day: keep it small;
// the tenant's name is looked up when an event needs it).
struct AllocationRecord {
  Session* session = nullptr;
  uint64_t charged = 0;  // bytes charged to the quota and the ledger
  PoolBlock block;
  uid_t uid = 0;
  pid_t pid = 0;
  uint32_t tenant = 0;
  uint32_t device = 0;
  uint32_t state_slot = state::kNoSlot;  // its durable record
  // The Allocate's request_key (0: none), kept so that its retry after a
  // restart finds it (MemoryBroker::RetakeByKey).
  uint64_t request_key = 0;
};

class AllocationTable {
 public:
  // `ledger` may be null (no events); `tenant_name` names tenant ids in
  // events. Both must outlive the table. Ids are assigned here, increasing,
  // from the ledger's first_allocation_id() (1 without a ledger; a restart
  // moves them past restored ones: AdvanceIdsPast).
  AllocationTable(ledger::TenantLedger* ledger,
                  std::function<std::string(uint32_t tenant)> tenant_name,
                  state::DurableState* state = nullptr);

  // Adds `records` (all of `session`) and returns their ids, in order;
  // FAILED_PRECONDITION "the calling process has exited" (and nothing
  // added) when the session has ended; RESOURCE_EXHAUSTED "state table
  // full" (nothing added) when the state file has no room for them (such an
  // allocation would not survive a restart). All or nothing: the records are
  // added to the table, to their session (Session::AddAllocations) and to
  // the state file under the table's lock, so a session that ends at the
  // same moment either hands the new ids back from Session::End, to be taken
  // by TakeAll, or makes the commit fail. With a ledger, each ALLOCATE event
  // is appended in the same critical section.
  absl::StatusOr<std::vector<uint64_t>> Commit(Session& session,
                                               const std::vector<AllocationRecord>& records);

  // Removes allocation `id` if `may_take` accepts its record (its error is
  // returned otherwise, and nothing changes); NOT_FOUND when no such
  // allocation is live. `why` is its ending event (FREE, SESSION_END,
  // DAEMON_STOP), appended in the same critical section. The caller gives
  // the block back to its pool and credits its quota after taking the
  // record, so replaying the ledger never shows a tenant holding more than
  // it did.
  absl::StatusOr<AllocationRecord> Take(
      uint64_t id, const std::function<absl::Status(const AllocationRecord&)>& may_take,
      ledger::EventKind why, const std::string& detail = "");
  // Removes those of `ids` still live (a session's, at its end).
  std::vector<AllocationRecord> TakeAll(const std::vector<uint64_t>& ids,
                                        ledger::EventKind why, const std::string& detail = "");
  // Removes every record (daemon shutdown).
  std::vector<AllocationRecord> Clear(ledger::EventKind why);

  // A restart: allocation `id` as a previous daemon recorded it (durable
  // record `slot`), for its restored session; no ledger event (the ledger
  // reconciles what survived as a whole). FAILED_PRECONDITION if the session
  // ended, ALREADY_EXISTS for an id restored twice.
  absl::Status Restore(uint64_t id, AllocationRecord record, Session& session);
  // New allocations get ids above `id`.
  void AdvanceIdsPast(uint64_t id);

  // A copy of live allocation `id`'s record, if it is live.
  std::optional<AllocationRecord> Find(uint64_t id) const;

  size_t size() const;
  // Visits every live record under the lock (keep `visit` short).
  void ForEach(const std::function<void(uint64_t id, const AllocationRecord&)>& visit) const;

 private:
  void AppendEvent(ledger::EventKind kind, uint64_t id, const AllocationRecord& r,
                   const std::string& detail = "") ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases `it` and forgets it in its session.
  AllocationRecord EraseLocked(absl::flat_hash_map<uint64_t, AllocationRecord>::iterator it,
                               ledger::EventKind why, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ledger::TenantLedger* const ledger_;
  state::DurableState* const state_;
  const std::function<std::string(uint32_t)> tenant_name_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, AllocationRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_ALLOCATIONS_ALLOCATION_TABLE_H_
