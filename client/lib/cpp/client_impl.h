// Client::Impl: the state of one gpumem::Client, shared by client.cc (the
// calls) and client_restart.cc (the restart thread). Private to the library.
//
// Invariants:
//  - `live` is every block this process holds from the daemon (Allocate
//    answered, not yet freed), recorded before the caller sees it; a call
//    records its outcome while holding `calls` shared, so when the restart
//    thread holds `calls` exclusively no answer is half-recorded and `live`
//    is exactly what to re-present.
//  - `link` changes only on the restart thread, under `calls` held
//    exclusively; calls in flight keep the link they started on.
//  - Lock order: calls, then mu, then link_mu / restart_mu; mu before
//    ProcessOpenSlabs' lock (process_open_slabs.h).
#ifndef GPUMEMD_CLIENT_LIB_CPP_CLIENT_IMPL_H_
#define GPUMEMD_CLIENT_LIB_CPP_CLIENT_IMPL_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/lib/cpp/client.h"
#include "client/lib/cpp/daemon_link.h"
#include "client/lib/cpp/deferred_frees.h"
#include "client/lib/slabs/slab_mapper.h"

namespace gpumem {
namespace client {

struct MappedSlab {
  // Shared so copies run outside the client's lock.
  std::shared_ptr<OpenedSlab> slab;
  uint64_t refs = 0;
};

// The pauses between tries to reach a daemon (Connect, Reconnect): 2 ms,
// doubling up to 100 ms.
class DaemonRetryBackoff {
 public:
  absl::Duration Next() {
    const absl::Duration d = next_;
    next_ = std::min(next_ * 2, absl::Milliseconds(100));
    return d;
  }

 private:
  absl::Duration next_ = absl::Milliseconds(2);
};

struct Client::Impl {
  std::string socket_path;
  // How long a call waits for a restarted daemon (GPUMEM_RECONNECT_MS).
  absl::Duration reconnect_wait = absl::Seconds(30);

  // Held shared by every call while it talks to the daemon and records its
  // outcome; exclusively by the restart thread while it re-presents.
  absl::Mutex calls;

  mutable absl::Mutex link_mu;
  std::shared_ptr<DaemonLink> link ABSL_GUARDED_BY(link_mu);
  std::shared_ptr<DaemonLink> Link() const {
    absl::MutexLock lock(&link_mu);
    return link;
  }

  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, MappedSlab> slabs ABSL_GUARDED_BY(mu);
  // Slabs of abandoned or lost Buffers: memory given back, addresses kept
  // reserved until this Client goes (OpenedSlab::Retire).
  std::vector<std::shared_ptr<OpenedSlab>> retired ABSL_GUARDED_BY(mu);
  // One mapper per handle kind, made on first use.
  absl::flat_hash_map<int, std::unique_ptr<SlabMapper>> mappers ABSL_GUARDED_BY(mu);
  v1::HandleKind handle_kind ABSL_GUARDED_BY(mu) = v1::HANDLE_KIND_UNSPECIFIED;
  std::optional<v1::UsageReport> usage ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, v1::Allocation> live ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, absl::Status> lost ABSL_GUARDED_BY(mu);
  // Frees sent whose answer a restart cut off, and those of them the
  // restart showed done (the new daemon no longer had them).
  absl::flat_hash_set<uint64_t> freeing ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> freed_meanwhile ABSL_GUARDED_BY(mu);
  std::function<void(const v1::ReclaimRequest&)> on_reclaim ABSL_GUARDED_BY(mu);
  std::function<void(const RestartReport&)> on_restart ABSL_GUARDED_BY(mu);
  uint64_t session_id ABSL_GUARDED_BY(mu) = 0;

  // The restart: `restarting` from the hangup until the new link serves;
  // `gone` once a wait for it ran out (calls then fail at once until a
  // daemon is back).
  mutable absl::Mutex restart_mu;
  bool restarting ABSL_GUARDED_BY(restart_mu) = false;
  bool gone ABSL_GUARDED_BY(restart_mu) = false;
  bool stopping ABSL_GUARDED_BY(restart_mu) = false;
  uint64_t restarts ABSL_GUARDED_BY(restart_mu) = 0;
  std::string gone_why ABSL_GUARDED_BY(restart_mu);

  // Frees of device memory waiting for the work queued on it (Buffer::Free).
  DeferredFrees deferred;

  int wake_fd = -1;  // eventfd: the destructor wakes the restart thread
  pid_t owner_pid = 0;  // a fork() child has no restart thread
  std::thread watcher;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_CPP_CLIENT_IMPL_H_
