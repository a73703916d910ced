// See health_service.h. A WatchCall lives from its accept to the end of its
// stream: accepted -> status written -> (a change: written again) ->
// (client leaves or server stops: the done event) -> Finish -> deleted. Its
// events, and the change alarm's, arrive on one queue drained by one
// thread, so neither it nor the set of open watches needs a lock.
#include "server/service/health_service.h"

#include <chrono>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/service/cq_event.h"

namespace gpumem {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthService::WatchCall {
  // A tag handed to gRPC: which call, which event. Passed as CqEvent*.
  enum class Event { kAccepted, kWritten, kDone, kFinished };
  using Tag = CallTag<WatchCall, Event>;
  friend Tag;

 public:
  WatchCall(HealthService* service, EventQueue* queue)
      : service_(service), queue_(queue), cq_(queue->cq.get()), writer_(&ctx_) {
    ctx_.AsyncNotifyWhenDone(done_tag_.tag());
    service_->RequestWatch(&ctx_, &request_, &writer_, cq_, cq_, accept_tag_.tag());
  }
  ~WatchCall() { service_->open_.erase(this); }

  // The status may have changed: send it if it did (after a write under
  // way). On the queue's thread, which is not stopping.
  void SendIfChanged() {
    if (done_ || finishing_) return;
    if (writing_) {
      recheck_ = true;
      return;
    }
    const HealthCheckResponse::ServingStatus now = service_->StatusOf(request_.service());
    if (now == response_.status()) return;
    response_.set_status(now);
    writing_ = true;
    writer_.Write(response_, write_tag_.tag());
  }

 private:
  void OnEvent(Event event, bool ok) {
    switch (event) {
      case Event::kAccepted:
        if (!ok) {  // shutting down; the call never started
          delete this;
          return;
        }
        if (queue_->stopping) break;  // no new operation; ends at its done event
        new WatchCall(service_, queue_);
        service_->open_.insert(this);
        response_.set_status(service_->StatusOf(request_.service()));
        writing_ = true;
        writer_.Write(response_, write_tag_.tag());
        return;
      case Event::kWritten:
        writing_ = false;
        if (recheck_ && ok && !queue_->stopping) {
          recheck_ = false;
          SendIfChanged();
        }
        break;
      case Event::kDone:
        done_ = true;
        break;
      case Event::kFinished:
        delete this;
        return;
    }
    if (done_ && !writing_ && !finishing_) {
      if (queue_->stopping) {  // no new operation on a stopping queue
        delete this;
        return;
      }
      finishing_ = true;
      writer_.Finish(grpc::Status::OK, finish_tag_.tag());
    }
  }

  HealthService* service_;
  EventQueue* queue_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  HealthCheckRequest request_;
  HealthCheckResponse response_;
  grpc::ServerAsyncWriter<HealthCheckResponse> writer_;
  Tag accept_tag_{this, Event::kAccepted};
  Tag write_tag_{this, Event::kWritten};
  Tag done_tag_{this, Event::kDone};
  Tag finish_tag_{this, Event::kFinished};
  bool writing_ = false;
  bool recheck_ = false;  // a change came while writing
  bool done_ = false;
  bool finishing_ = false;
};

void HealthService::Changed::OnEvent(bool ok) {
  if (!ok || service->queue_->stopping) return;
  for (WatchCall* call : service->open_) call->SendIfChanged();  // deletes none
}

void HealthService::SetNotServing() {
  if (!serving_.exchange(false, std::memory_order_relaxed)) return;  // once
  if (queue_ != nullptr) {
    changed_alarm_ = std::make_unique<grpc::Alarm>();
    changed_alarm_->Set(queue_->cq.get(), std::chrono::system_clock::now(),
                        static_cast<CqEvent*>(&changed_));
  }
}

HealthCheckResponse::ServingStatus HealthService::StatusOf(
    const std::string& service) const {
  if (!service.empty() && service != "gpumem.v1.GpuMemory") {
    return HealthCheckResponse::SERVICE_UNKNOWN;
  }
  return serving_.load(std::memory_order_relaxed) ? HealthCheckResponse::SERVING
                                                  : HealthCheckResponse::NOT_SERVING;
}

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  HealthCheckResponse::ServingStatus status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown service \"", request->service(),
                                     "\" (this daemon serves \"\" and gpumem.v1.GpuMemory)"));
  }
  response->set_status(status);
  return grpc::Status::OK;
}

void HealthService::Start(EventQueue* queue) {
  queue_ = queue;
  new WatchCall(this, queue);
}

}  // namespace gpumem
