// SessionRegistry: one session per client process, ended when the process is.
// The sessions themselves (their tenant, allocations, usage) are Session
// objects (session.h); the registry finds, creates and ends them.
//
// Invariants: a process gets exactly one session per socket it calls through
// (keyed by the SO_PEERCRED pid and PeerCred::socket_tenant, each charged to
// its own tenant), however many of its threads Attach at once; a reused pid
// gets a new session; a process that exits (cleanly, by crash or by SIGKILL)
// has its session ended at once, by a watcher thread polling a pidfd per
// session; a session is marked ended (Session::End) before on_end is
// called, so nothing can be recorded for it from then on.
#ifndef GPUMEMD_SERVER_SESSION_SESSION_REGISTRY_H_
#define GPUMEMD_SERVER_SESSION_SESSION_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/session/peer_credentials.h"
#include "server/session/session.h"

namespace gpumem {

class SessionRegistry {
 public:
  // Called once per session, after it was marked ended, with the ids of
  // the allocations it held then; with no registry lock held, on the
  // watcher thread or on the thread of whoever ends a session explicitly
  // (EndConnection, EndSession), never from Attach, so callers of Attach may
  // hold locks that on_end takes.
  using EndCallback = std::function<void(const std::shared_ptr<Session>& session,
                                         std::vector<uint64_t> allocation_ids)>;

  // `state` (may be null) keeps each session's record for a restart.
  explicit SessionRegistry(EndCallback on_end, state::DurableState* state = nullptr);
  ~SessionRegistry();  // stops the watcher; does not call on_end
  SessionRegistry(const SessionRegistry&) = delete;
  SessionRegistry& operator=(const SessionRegistry&) = delete;

  // The live session of the caller's process, created if needed (a pid
  // whose old pidfd is already readable is a new process). A caller
  // without a visible pid gets its connection-bound session
  // (cred.bound_session), or PERMISSION_DENIED saying how to get one.
  absl::StatusOr<std::shared_ptr<Session>> Attach(const PeerCred& cred);

  // A caller in another pid namespace (SO_PEERCRED gives pid 0): a session
  // bound to the connection it keeps open instead of to a process. It ends
  // when the transport calls EndConnection (the connection closed). The
  // returned token (128 random bits, hex) is what the caller presents on
  // its other connections (gRPC metadata) to act in this session.
  absl::StatusOr<std::shared_ptr<Session>> BindConnection(const PeerCred& cred);
  void EndConnection(uint64_t session_id) { EndSession(session_id); }
  // The connection-bound session a token names, if it is live and was
  // opened by the same principal as `cred` (SamePrincipal: the same
  // tenant's socket, or the main socket and the same uid);
  // PERMISSION_DENIED otherwise.
  absl::StatusOr<uint64_t> ResolveToken(absl::string_view token, const PeerCred& cred) const;
  // A session a previous daemon recorded (a restart): a process-bound one
  // comes back if the same process still runs (same pid and start time),
  // watched as before; a connection-bound one comes back waiting for its
  // client to bind a new connection to it (RebindConnection) until
  // ExpireUnbound. Its id is kept. One that came through a tenant's socket
  // has that tenant (`tenant`, numbered as the directory in force numbers
  // it) as its principal. NOT_FOUND when its process, or its socket
  // tenant, is gone.
  absl::StatusOr<std::shared_ptr<Session>> Restore(const state::SessionRecord& record,
                                                   std::optional<tenants::TenantRef> tenant);
  // New sessions get ids above `id` (those a previous daemon gave).
  void AdvanceIdsPast(uint64_t id);
  // A restored connection-bound session, for the caller that presents its
  // token on a new connection as the same principal (SamePrincipal: the
  // same uid on the main socket, the same tenant's socket);
  // PERMISSION_DENIED otherwise.
  absl::StatusOr<std::shared_ptr<Session>> RebindConnection(absl::string_view token,
                                                            const PeerCred& cred);
  // Ends the restored connection-bound sessions nobody rebound; returns how
  // many.
  int ExpireUnbound();

  // The live session of the caller's process, if it has one (never
  // creates); null otherwise.
  std::shared_ptr<Session> Find(const PeerCred& cred) const;
  // The live session `session_id`, or null.
  std::shared_ptr<Session> Get(uint64_t session_id) const;
  std::vector<std::shared_ptr<Session>> List() const;
  // Ends session `session_id` now (as if its process had exited: on_end is
  // called, on this thread, so the caller must hold no lock on_end takes).
  // The number of allocations it held, or nullopt if it was not live.
  std::optional<size_t> EndSession(uint64_t session_id);

  // Ending many sessions in two steps, so that the first may run under a
  // lock of the caller's that on_end takes too: TakeSessions marks every
  // live session `pick` accepts ended (nothing can be recorded for it from
  // then on) and forgets it (no Attach or Find returns it), and returns
  // each with the ids of the allocations it held; FinishSessions then calls
  // on_end for each, on this thread.
  struct Taken {
    std::shared_ptr<Session> session;
    std::vector<uint64_t> allocation_ids;
  };
  std::vector<Taken> TakeSessions(const std::function<bool(const Session&)>& pick);
  void FinishSessions(std::vector<Taken> taken);

 private:
  struct Entry {
    std::shared_ptr<Session> session;
    int pidfd = -1;
  };
  absl::StatusOr<std::shared_ptr<Session>> CreateLocked(const PeerCred& cred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch();
  // A process's sessions are keyed by its pid and the socket it came through.
  using ProcessKey = std::pair<pid_t, uint32_t>;
  static ProcessKey KeyOf(const PeerCred& cred) { return {cred.pid, cred.socket_tenant}; }
  // Removes entry `it` (its pidfd, token and pid key) and returns its session.
  std::shared_ptr<Session> RemoveLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EndCallback on_end_;
  state::DurableState* const state_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ProcessKey, uint64_t> by_pid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_token_ ABSL_GUARDED_BY(mu_);
  // Restored connection-bound sessions whose client has not come back yet.
  absl::flat_hash_set<uint64_t> unbound_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SESSION_SESSION_REGISTRY_H_
