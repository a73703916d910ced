// EventQueues: the daemon's gRPC completion queues, each drained by one
// thread, shared by every async service (unary calls, the Stream RPC, the
// health Watch).
//
// Every thread blocked on a server completion queue also polls every
// connection, so the daemon keeps few queues and puts every service on
// them, rather than a queue (and thread) per service. A queue's thread
// calls CqEvent::OnEvent(ok) for each tag it dequeues (cq_event.h).
//
// Shutdown stops each queue from its own thread (a stop event set with an
// alarm): the thread sets EventQueue::stopping, shuts the queue down and
// drains what is left, so no operation is ever started on a queue that is
// shut down (gRPC aborts on that). Call it after grpc::Server::Shutdown and
// after everything that may still start operations from other threads
// (worker pools, admission) has stopped.
#ifndef GPUMEMD_SERVER_SERVICE_EVENT_QUEUES_H_
#define GPUMEMD_SERVER_SERVICE_EVENT_QUEUES_H_

#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/server_builder.h>

#include "server/service/cq_event.h"

namespace gpumem {

class EventQueues {
 public:
  explicit EventQueues(int count);
  ~EventQueues();  // Shutdown()
  EventQueues(const EventQueues&) = delete;
  EventQueues& operator=(const EventQueues&) = delete;

  // Before builder->BuildAndStart().
  void AddTo(grpc::ServerBuilder* builder);
  // After the server started (and services posted their first calls).
  void Start();
  // See above. Idempotent.
  void Shutdown();

  const std::vector<EventQueue*>& queues() const { return views_; }
  EventQueue* first() const { return views_.front(); }

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

  const int count_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::vector<EventQueue*> views_;
  bool shut_down_ = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_EVENT_QUEUES_H_
