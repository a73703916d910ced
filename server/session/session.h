// Session: one client's state in the daemon, under one lock. A session is a
// client process (or, for a caller in another pid namespace, a connection;
// see session_registry.h). It owns what the daemon knows of that client
// beyond single requests: its tenant, the ids of its live allocations with
// their bytes per device, its last usage report, and whether it has ended.
//
// Invariants: nothing is ever recorded for an ended session (AddAllocations
// and End take the same lock, so an allocation is either added before End,
// which hands its id back for release, or refused); its tenant, once fixed,
// is kept for its life, whatever config reloads do later. Thread-safe.
// Sessions are shared (std::shared_ptr): the registry holds each live one;
// requests hold the one they act for.
#ifndef GPUMEMD_SERVER_SESSION_SESSION_H_
#define GPUMEMD_SERVER_SESSION_SESSION_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/session/peer_credentials.h"
#include "server/state/durable_state.h"
#include "server/tenants/tenant.h"

namespace gpumem {

// A client's own account of its caching-pool leases (v1::UsageReport).
struct UsageFigures {
  uint64_t leased_bytes = 0;
  uint64_t in_use_bytes = 0;
};

// One live allocation as its session counts it.
struct SessionBlock {
  uint64_t id = 0;
  uint32_t device = 0;
  uint64_t bytes = 0;
};

// FAILED_PRECONDITION "the calling process has exited": the answer to a
// call whose session ended (its process is gone) while the call was served.
absl::Status CallerExitedError();

class Session {
 public:
  // `token` is set for connection-bound sessions only. `state` (may be
  // null) keeps its record (its process's pid and start time, or its token;
  // its uid, gid and fixed tenant), so a restarted daemon finds it again
  // (server/state/); the record goes when the session ends, and stays when
  // the daemon stops without ending it (a restart keeping its state);
  // `start_ticks` is its process's start time (/proc/PID/stat), 0 for
  // connection-bound sessions; `slot` is the record
  // a restore found it in (kNoSlot: a new session, recorded now).
  Session(uint64_t id, PeerCred cred, std::string token = "",
          state::DurableState* state = nullptr, uint64_t start_ticks = 0,
          uint32_t slot = state::kNoSlot, std::optional<tenants::TenantRef> tenant = {});
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const { return id_; }
  // The credentials of the process (or connection) that opened it.
  const PeerCred& cred() const { return cred_; }
  absl::Time started() const { return started_; }
  const std::string& token() const { return token_; }
  uint64_t start_ticks() const { return start_ticks_; }

  // The session's tenant: the one fixed earlier, or `resolve()`'s answer,
  // which is fixed now (its first Allocate or slab export) if it is a
  // tenant (a refusal is not kept: a later config may give the caller a
  // tenant). FAILED_PRECONDITION once ended.
  absl::StatusOr<tenants::TenantRef> FixTenant(
      const std::function<absl::StatusOr<tenants::TenantRef>()>& resolve);
  // The tenant fixed so far, if any.
  std::optional<tenants::TenantRef> tenant() const;

  // Records `blocks` as the session's; false (and nothing recorded) once the
  // session has ended.
  bool AddAllocations(const std::vector<SessionBlock>& blocks);
  // Forgets one allocation (freed); no-op if it is not the session's.
  void RemoveAllocation(const SessionBlock& block);

  // Keeps the client's latest usage report (ignored once ended).
  void RecordUsage(const UsageFigures& usage);

  // Marks the session ended and hands back the ids of its live
  // allocations; later calls hand back nothing. Idempotent.
  std::vector<uint64_t> End();
  bool ended() const;

  // A consistent copy of the figures, for Stats and reclaim.
  struct Figures {
    uint64_t allocations = 0;
    uint64_t used_bytes = 0;
    absl::flat_hash_map<uint32_t, uint64_t> device_bytes;  // devices it holds memory on
    std::optional<UsageFigures> usage;                     // absent: never reported
    std::optional<tenants::TenantRef> tenant;
    bool ended = false;
  };
  Figures figures() const;

 private:
  // Writes the record of the session as it is now (mu_ held), replacing the
  // previous one.
  void RecordLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t id_;
  const PeerCred cred_;
  const absl::Time started_;
  const std::string token_;
  state::DurableState* const state_;
  const uint64_t start_ticks_;

  mutable absl::Mutex mu_;
  uint32_t slot_ ABSL_GUARDED_BY(mu_) = state::kNoSlot;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<tenants::TenantRef> tenant_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::pair<uint32_t, uint64_t>> blocks_
      ABSL_GUARDED_BY(mu_);  // id -> (device, bytes)
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint32_t, uint64_t> device_bytes_ ABSL_GUARDED_BY(mu_);
  std::optional<UsageFigures> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_SESSION_H_
