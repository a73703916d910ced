// CqEvent and EventQueue: the completion queues the daemon's async services
// share, and what their tags point to. Every async part of the daemon (the
// unary calls, the Stream RPC, the health Watch) shares the queues of
// EventQueues (event_queues.h): every thread blocked on a server completion
// queue also polls every connection, so each extra queue thread costs every
// call wake-ups. Invariant: no operation is ever started on a queue that was
// shut down (gRPC aborts then): see EventQueue::stopping.
#ifndef GPUMEMD_SERVER_SERVICE_CQ_EVENT_H_
#define GPUMEMD_SERVER_SERVICE_CQ_EVENT_H_

#include <memory>

#include <grpcpp/completion_queue.h>

namespace gpumem {

class CqEvent {
 public:
  // Called by a queue's thread for each tag it dequeues; the object behind
  // the tag decides what the event means and may delete its owner.
  virtual void OnEvent(bool ok) = 0;

 protected:
  ~CqEvent() = default;
};

// The tag of one kind of event of one call: OnEvent(ok) calls
// call->OnEvent(event, ok). A call class keeps one per event it waits for
// and befriends the type (`using Tag = CallTag<MyCall, Event>; friend Tag;`).
template <typename Call, typename Event>
struct CallTag final : CqEvent {
  CallTag(Call* c, Event e) : call(c), event(e) {}
  void OnEvent(bool ok) override { call->OnEvent(event, ok); }
  void* tag() { return static_cast<CqEvent*>(this); }
  Call* const call;
  const Event event;
};

struct EventQueue {
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  // The draining thread itself shuts its queue down (on a stop event) and
  // sets this first: handlers, which run on that thread only, start no new
  // operation once it is set, and free their objects when nothing of theirs
  // is outstanding. Read and written by the draining thread only.
  bool stopping = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_CQ_EVENT_H_
