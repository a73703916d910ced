// RingTransport: the shared-memory request ring (common/ring/request_ring.h)
// as a transport of the daemon, beside the unary RPCs and the Stream. A
// session asks for a ring over the slab channel (SlabOp::kOpenRing); its
// Allocates and Frees (common/ring/ring_kinds.h) then come through the ring
// and are served by one daemon-wide RingPoller (server/ring/) with a fixed
// set of workers, never a thread per ring or per request.
//
// Invariants:
// - A ring belongs to the session that asked for it, acts as that caller
//   (the slab channel's kernel credentials, never anything in the ring),
//   and is served only while the session lives: the session's end
//   (MemoryBroker::SetSessionEndListener: process exit, connection close
//   for a bound session, tenant removal) and Close (daemon stop) take it
//   off the poller and cancel its waiting requests.
// - At most one ring per session (ALREADY_EXISTS), max_rings_per_uid per
//   uid and max_rings in all (RESOURCE_EXHAUSTED): each ring is up to
//   RingLayoutBytes(kRingMaxSlots) (about 256 KiB) of shared memory and two
//   fds of the daemon.
// - Every request is decoded from the reader's private copy and goes
//   through CallDispatch as the Stream's do, so it gets the gRPC answer's
//   code and message (admission, quotas, waiting, priorities, the ledger
//   and the observer's counts alike); a payload that does not parse or an
//   unknown kind is INVALID_ARGUMENT. Exactly one answer per request taken.
// - A waiting Allocate holds no thread; it is answered through the reader
//   from admission's thread.
// - An allocation whose answer cannot go into its slot (larger than
//   kRingPayloadBytes) is freed and answered RESOURCE_EXHAUSTED: the client
//   never learns its id, so nothing would free it before the session ends.
// - No answer touches freed memory: each request not yet answered holds its
//   ring (region and reader) alive, however long after the session's end.
// Thread-safe.
#ifndef GPUMEMD_SERVER_SERVICE_RING_TRANSPORT_H_
#define GPUMEMD_SERVER_SERVICE_RING_TRANSPORT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/memory_broker.h"
#include "server/defaults/defaults.h"
#include "server/ring/ring_poller.h"
#include "server/service/call_dispatch.h"
#include "server/service/call_observer.h"
#include "server/service/slab_channel.h"
#include "server/service/worker_pool.h"

namespace gpumem {

struct RingTransportOptions {
  // --request_rings: false refuses every kOpenRing (RingsOffError) and
  // starts no worker.
  bool enabled = true;
  // --ring_workers: the poller's threads.
  int workers = 2;
  // Rings one uid may hold at once (the daemon ties it to
  // max_connections_per_uid), and the daemon in all.
  uint32_t max_rings_per_uid = defaults::kMaxConnectionsPerUid;
  uint32_t max_rings = 1024;
  // The poller's turn (ring_poller.h).
  int per_turn = RingPoller::kDefaultPerTurn;
  absl::Duration spin = RingPoller::kDefaultSpin;
};

class RingTransport final : public RingLender {
 public:
  // Everything given must outlive the transport; `observer` may be null.
  // Registers itself as the broker's session end listener (until Close).
  static absl::StatusOr<std::unique_ptr<RingTransport>> Create(MemoryBroker* broker,
                                                               WorkerPool* backend_workers,
                                                               CallObserver* observer,
                                                               RingTransportOptions options);
  ~RingTransport() override;  // Close(), then joins the workers
  RingTransport(const RingTransport&) = delete;
  RingTransport& operator=(const RingTransport&) = delete;

  // RingLender (the slab channel's kOpenRing): a new ring for the caller's
  // session, served from now on; the returned fds are the caller's copies.
  absl::StatusOr<LentRing> Lend(const PeerCred& caller, uint64_t slots) override;

  // The session ended: its ring (if any) is served no more and its waiting
  // requests are cancelled. Not from a ring's handler.
  void SessionEnded(uint64_t session_id);

  // Daemon stop: every ring ends as above and no ring is lent from now on;
  // the workers, idle from then on, are joined by the destructor.
  // Idempotent.
  void Close();

  // Rings lent and not ended.
  size_t ring_count() const;
  // A reload: the per-uid bound from now on (rings over it stay).
  void SetMaxRingsPerUid(uint32_t n);

  struct Ring;  // one lent ring (ring_transport.cc)

 private:
  RingTransport(MemoryBroker* broker, WorkerPool* backend_workers, CallObserver* observer,
                RingTransportOptions options, std::unique_ptr<RingPoller> poller);
  // Takes `ring` off the poller and cancels what it has waiting.
  void End(const std::shared_ptr<Ring>& ring);
  // One request collected from `ring` (on a poller worker).
  void Serve(const std::shared_ptr<Ring>& ring, RingRequest request);

  MemoryBroker* const broker_;
  CallDispatch dispatch_;
  const RingTransportOptions options_;
  std::unique_ptr<RingPoller> poller_;  // null when rings are off

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t max_rings_per_uid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Ring>> by_session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_RING_TRANSPORT_H_
