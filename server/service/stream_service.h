// StreamService: gpumem.v1.GpuMemory.Stream, the daemon's hot path, served
// from gRPC completion queues. Each client keeps one bidirectional stream
// open and sends StreamRequests (Allocate, Free, GetSession with a request
// id); each gets exactly one StreamAnswer with the same id, computed by the
// same MemoryBroker calls as the unary RPCs, so codes and messages are
// identical. Answers may come back out of order; each carries its id.
//
// Invariants: every stream lives on one completion queue (event_queues.h)
// drained by one thread, so its state needs no lock; nothing ever blocks on
// a client (reads and writes are asynchronous); a slow device holds up
// neither the other streams of the queue nor allocations on other devices;
// memory per stream is bounded (max_queued_replies); identity is the
// connection's, looked up once per stream (CallerOf in caller.h); an
// Allocate whose answer was not written when the stream ended is freed (the
// client never learned its id). No threads of its own, whatever the streams.
#ifndef GPUMEMD_SERVER_SERVICE_STREAM_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_STREAM_SERVICE_H_

#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/core/memory_broker.h"
#include "server/service/async_service.h"
#include "server/service/call_dispatch.h"
#include "server/service/call_observer.h"
#include "server/service/cq_event.h"
#include "server/service/worker_pool.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

struct StreamServiceOptions {
  // Answers a stream may have waiting to be written before its requests are
  // no longer read until the client reads its answers (a client that stops
  // reading is throttled by HTTP/2 flow control, nobody else is). Allocates
  // the broker holds (waiting, or for reclaims) count against it while they
  // are held.
  size_t max_queued_replies = 64;
};

// What runs where is CallDispatch's (call_dispatch.h), as for the unary
// RPCs: Allocate and Free inline on the queue's thread when they need no
// backend work, otherwise on the backend WorkerPool; an Allocate the broker
// holds (a wait_ms request that waits for memory, or a hold for reclaims,
// memory_broker.h) holds no thread and is answered from admission's thread.
// Waiting is the unary Allocate's: the same limits and refusals. An answer
// made on another thread comes back to the queue thread through a
// grpc::Alarm. A stream that ends (cancelled, client gone) or fails while
// requests of it wait cancels them: their places are freed at once.
//
// A stream whose caller cannot be established ends with that status. A
// request id reused while its request is in flight (answer not yet
// written), or a message that is not a StreamRequest, ends the stream with
// INVALID_ARGUMENT naming it, after the answers already queued are written.
//
// Reclaims (MemoryBroker::SetReclaimSender) are pushed as StreamReply.reclaim
// on every live stream of the session; the pushing thread only queues it and
// sets a grpc::Alarm on the stream's queue, whose thread writes it. At most
// one push waits per stream. A client answers with a
// StreamRequest.reclaimed (answered like any request), which tells the
// broker (ReclaimAnswered).
class StreamService {
 public:
  // `service` is registered with the server; all pointers must outlive this
  // object; `observer` may be null.
  StreamService(MemoryBroker* broker, const PeerTable* peers, AsyncGpuMemory* service,
                WorkerPool* backend_workers, CallObserver* observer,
                StreamServiceOptions options = {});
  ~StreamService();  // Close()
  StreamService(const StreamService&) = delete;
  StreamService& operator=(const StreamService&) = delete;

  // After the server started: accepts streams on each of `queues`.
  void Start(const std::vector<EventQueue*>& queues);
  // After grpc::Server::Shutdown() and the worker pool's Shutdown(), before
  // the queues are shut down: no reclaim push is started from then on.
  // Idempotent.
  void Close();

  class Call;  // one stream (stream_service.cc)

 private:
  MemoryBroker* broker_;
  const PeerTable* peers_;
  AsyncGpuMemory* service_;
  CallDispatch dispatch_;
  StreamServiceOptions options_;
  // Live streams by session, for pushes. A Call registers once accepted and
  // unregisters before it is deleted.
  absl::Mutex registry_mu_;
  std::unordered_multimap<uint64_t, Call*> registry_ ABSL_GUARDED_BY(registry_mu_);
  bool registry_closed_ ABSL_GUARDED_BY(registry_mu_) = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_STREAM_SERVICE_H_
