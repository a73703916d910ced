#include "server/service/event_queues.h"

namespace gpumem {

EventQueues::EventQueues(int count) : count_(count < 1 ? 1 : count) {}

EventQueues::~EventQueues() { Shutdown(); }

void EventQueues::AddTo(grpc::ServerBuilder* builder) {
  for (int i = 0; i < count_; ++i) {
    auto q = std::make_unique<Queue>();
    q->events.cq = builder->AddCompletionQueue();
    views_.push_back(&q->events);
    queues_.push_back(std::move(q));
  }
}

void EventQueues::Start() {
  for (auto& q : queues_) {
    grpc::ServerCompletionQueue* cq = q->events.cq.get();
    q->thread = std::thread([cq] {
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) static_cast<CqEvent*>(tag)->OnEvent(ok);
    });
  }
}

void EventQueues::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& q : queues_) {
    if (q->thread.joinable()) {
      // Due at once: the queue's thread shuts the queue down itself.
      q->stop_alarm.Set(q->events.cq.get(), gpr_now(GPR_CLOCK_MONOTONIC),
                        static_cast<CqEvent*>(&q->stop));
    } else if (q->events.cq != nullptr) {
      // Never started: drain it here, as its thread would have.
      q->events.stopping = true;
      q->events.cq->Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (q->events.cq->Next(&tag, &ok)) static_cast<CqEvent*>(tag)->OnEvent(ok);
    }
  }
  for (auto& q : queues_) {
    if (q->thread.joinable()) q->thread.join();
  }
}

}  // namespace gpumem
