// StreamService: gpumem.v1.GpuMemory.Stream, the daemon's hot path, served
// from gRPC completion queues.
//
// Each client keeps one bidirectional stream open and sends StreamRequests
// (Allocate, Free, GetSession with a request id); each gets exactly one
// StreamAnswer with the same id, computed by the same MemoryBroker calls as
// the unary RPCs, so codes and messages are identical.
//
// Shape (measured to be the fastest here, see README "Hot path"): a fixed
// number of completion queues, each drained by one thread; every stream lives
// on one queue, so its state is touched by one thread only and needs no lock.
// Broker calls run inline on that thread, except an Allocate or Free that
// needs backend work (a new slab: on CUDA, milliseconds of cuMemCreate, map
// and memset; a dedicated slab given back; waiters placed by a release): the
// broker says so without changing anything
// (MemoryBroker::BackendWork::kNotHere), and the request runs on one of
// `backend_threads` BackendWorkers; its answer comes back to the queue
// thread through a grpc::Alarm. So a slow device holds up neither the other
// streams of the queue nor allocations on other devices. Nothing ever blocks
// on a client: reads and writes are asynchronous.
//
// What it guarantees:
//  - Identity is the connection's: the caller is looked up once per stream,
//    as the unary handlers do it (CallerOf in gpumem_service.h: the
//    PeerTable by ServerContext::peer(), plus the session token metadata of
//    a client in another pid namespace); a stream whose caller cannot be
//    established ends with that status.
//  - Bounded memory per stream: at most `max_queued_replies` answers wait to
//    be written; past that the stream's requests are not read until the
//    client reads its answers (a client that stops reading is throttled by
//    HTTP/2 flow control, nobody else is).
//  - A request id reused while its request is in flight (answer not yet
//    written), or a message that is not a StreamRequest, ends the stream with
//    INVALID_ARGUMENT naming it, after the answers already queued are written.
//  - An Allocate whose answer was not written when the stream ended (client
//    gone, stream cancelled) is freed: the client never learned its id.
//  - Memory pressure: the broker's reclaims (MemoryBroker::SetReclaimSender)
//    are pushed as StreamReply.reclaim on every live stream of the session;
//    the pushing thread only queues it and sets a grpc::Alarm on the
//    stream's queue, whose thread writes it. At most one push waits per
//    stream. A client answers with a StreamRequest.reclaimed (answered like
//    any request).
//  - Threads: `threads` + `backend_threads`, whatever the number of streams.
//  - Answers may come back out of order (an offloaded request's answer
//    after those of later requests); each carries its request id.
#ifndef GPUMEMD_SERVER_SERVICE_STREAM_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_STREAM_SERVICE_H_

#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include <grpcpp/server_builder.h>

#include <grpcpp/alarm.h>

#include "absl/synchronization/mutex.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "server/service/backend_workers.h"
#include "server/service/cq_event.h"
#include "server/service/memory_broker.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

// The GpuMemory service type whose Stream method is served raw and async
// (the unary methods stay synchronous). GpuMemoryService derives from it.
using GpuMemoryWithAsyncStream =
    v1::GpuMemory::WithRawMethod_Stream<v1::GpuMemory::Service>;

struct StreamServiceOptions {
  // Completion queues, one thread each.
  int threads = 1;
  // Threads that run Allocates needing backend work (BackendWorkers).
  int backend_threads = 2;
  // Answers a stream may have waiting to be written before its requests are
  // no longer read.
  size_t max_queued_replies = 64;
  // Observers of each Allocate (its status, answer and time taken) and Free
  // (its status), as the unary service's metrics adaptor records them
  // (server/metrics/); unset: nothing is observed. Called on the queue thread
  // (on a backend worker for an offloaded Allocate).
  std::function<void(const absl::Status&, const v1::AllocateResponse&, absl::Duration)>
      on_allocate;
  std::function<void(const absl::Status&)> on_free;
};

class StreamService {
 public:
  // `service` is (or will be) registered with the same ServerBuilder; all
  // pointers must outlive this object.
  StreamService(MemoryBroker* broker, const PeerTable* peers,
                GpuMemoryWithAsyncStream* service, StreamServiceOptions options);
  ~StreamService();  // Shutdown()
  StreamService(const StreamService&) = delete;
  StreamService& operator=(const StreamService&) = delete;

  // Before builder->BuildAndStart().
  void AddCompletionQueues(grpc::ServerBuilder* builder);
  // After the server started: accepts streams and starts the threads.
  void Start();
  // The first completion queue, for other async services (their tags must
  // be CqEvents, see cq_event.h); valid after AddCompletionQueues, drained
  // once Start()ed.
  EventQueue* shared_queue() const { return &queues_[0]->events; }
  // After grpc::Server::Shutdown() (which ends every stream): drains the
  // queues and joins the threads. Idempotent.
  void Shutdown();

  class Call;  // one stream (stream_service.cc)

 private:
  // Shuts its queue down from the queue's own thread.
  struct StopEvent final : CqEvent {
    explicit StopEvent(EventQueue* q) : queue(q) {}
    void OnEvent(bool) override {
      queue->stopping = true;
      queue->cq->Shutdown();
    }
    EventQueue* queue;
  };
  struct Queue {
    EventQueue events;
    std::thread thread;
    StopEvent stop{&events};
    grpc::Alarm stop_alarm;
  };

  MemoryBroker* broker_;
  const PeerTable* peers_;
  GpuMemoryWithAsyncStream* service_;
  StreamServiceOptions options_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::unique_ptr<BackendWorkers> workers_;
  bool shut_down_ = false;
  // Live streams by session, for pushes. A Call registers once accepted and
  // unregisters before it is deleted.
  absl::Mutex registry_mu_;
  std::unordered_multimap<uint64_t, Call*> registry_ ABSL_GUARDED_BY(registry_mu_);
  bool registry_closed_ ABSL_GUARDED_BY(registry_mu_) = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_STREAM_SERVICE_H_
