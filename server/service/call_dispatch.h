// CallDispatch: where a request runs, decided in one place for every
// transport (the unary service and the Stream alike): inline on the calling
// completion-queue thread, on a worker pool, or waiting in admission, which
// holds no thread. Each transport hands over a request and one callback and
// gets the answer through that callback, wherever it was made.
//
// Invariants: the callback is called exactly once per request; a request
// answered inline is answered before the dispatch call returns, on the
// calling thread (Delivery::kInline), any other later, from a worker's or
// admission's thread (Delivery::kLater). The calling thread never calls the
// backend. The observer, if any, is told of every Allocate and Free answer
// once, just before the callback.
#ifndef GPUMEMD_SERVER_SERVICE_CALL_DISPATCH_H_
#define GPUMEMD_SERVER_SERVICE_CALL_DISPATCH_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/core/memory_broker.h"
#include "server/service/call_observer.h"
#include "server/service/wait_cancel.h"
#include "server/service/worker_pool.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

class CallDispatch {
 public:
  struct Parts {
    MemoryBroker* broker = nullptr;
    // Requests that need backend work (a new slab; a dedicated slab given
    // back).
    WorkerPool* backend_workers = nullptr;
    // Queries (Query); may be null for a transport that sends none.
    WorkerPool* query_workers = nullptr;
    CallObserver* observer = nullptr;  // may be null
  };
  // Everything in `parts` must outlive the dispatch.
  explicit CallDispatch(Parts parts) : p_(parts) {}

  // Where a request went.
  enum class Route {
    kInline,   // answered already, on this thread
    kWorker,   // on a worker; it may go on to wait in admission
    kWaiting,  // held by admission (wait_ms, or a hold for reclaims)
  };
  // Where its answer is given (see the file comment).
  enum class Delivery { kInline, kLater };

  template <typename Response>
  using Done = std::function<void(absl::StatusOr<Response>, Delivery)>;
  using AllocateDone = Done<v1::AllocateResponse>;
  using FreeDone = Done<v1::FreeResponse>;

  struct Dispatched {
    Route route = Route::kInline;
    // A wait_ms Allocate not answered inline: the transport's way to give it
    // up when its caller goes away (the call is cancelled, the stream ends):
    // a waiting request is then answered CANCELLED through its callback and
    // its place is freed at once. Null otherwise.
    std::shared_ptr<WaitCancel> cancel;
  };

  // Allocate: inline through MemoryBroker::TryAllocate; on a backend worker
  // when that needs backend work (refused with MemoryBroker::StoppingError
  // once the workers stop); a request the broker holds waits in admission
  // and is answered from its thread. `caller` is who calls as the transport
  // established it (its error is the answer); `arrived` starts the latency
  // the observer is told.
  Dispatched Allocate(const absl::StatusOr<PeerCred>& caller, const v1::AllocateRequest& request,
                      absl::Time arrived, AllocateDone done);

  // Free: inline through MemoryBroker::TryFree; on a backend worker when the
  // block's slab goes back to the backend (inline once the workers stop:
  // a draining daemon still takes memory back).
  Route Free(const absl::StatusOr<PeerCred>& caller, const v1::FreeRequest& request,
             FreeDone done);

  // A query that reads the disk or walks every session or allocation: on
  // the query workers (inline once they stop).
  template <typename Response>
  Route Query(std::function<absl::StatusOr<Response>()> query, Done<Response> done) {
    auto run = [query = std::move(query), done = std::move(done)](Delivery where) {
      done(query(), where);
    };
    if (p_.query_workers->Submit([run] { run(Delivery::kLater); })) return Route::kWorker;
    run(Delivery::kInline);
    return Route::kInline;
  }

  // GetSession and a stream's `reclaimed` run inline, by the transport
  // itself: they touch one session and never the backend.

  MemoryBroker* broker() const { return p_.broker; }

 private:
  void AnswerAllocate(MemoryBroker::AllocateAnswer answer, absl::Time arrived, Delivery where,
                      const AllocateDone& done) const;
  void AnswerFree(absl::StatusOr<v1::FreeResponse> answer, Delivery where,
                  const FreeDone& done) const;

  const Parts p_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_CALL_DISPATCH_H_
