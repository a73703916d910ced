// See gpumem_service.h. One UnaryCall per call in flight, driven by the
// events of its completion queue (accepted, finished, done); all of them
// arrive on the queue's one thread, so its flags need no lock. Reply may be
// called from any thread (a worker, admission's): it starts Finish and
// touches the call no more, because the queue thread may delete it as soon
// as Finish completes.
//
// Invariants of a UnaryCall:
//  - Reply is called exactly once per accepted call (or never, when the
//    queue was stopping at accept: then the call just ends at its done
//    event);
//  - deleted only when its accept failed, or when it is finished (Finish
//    completed, or never started) and its done event arrived.
#include "server/service/gpumem_service.h"

#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/service/caller.h"
#include "server/service/message_limits.h"
#include "server/service/stats_proto.h"
#include "server/service/wait_cancel.h"

namespace gpumem {

template <typename Request, typename Response>
class UnaryCall {
 public:
  using RequestFn = void (AsyncGpuMemory::*)(grpc::ServerContext*, Request*,
                                             grpc::ServerAsyncResponseWriter<Response>*,
                                             grpc::CompletionQueue*,
                                             grpc::ServerCompletionQueue*, void*);

  UnaryCall(GpuMemoryService* owner, AsyncGpuMemory* service, EventQueue* queue,
            RequestFn request_fn)
      : owner_(owner), service_(service), queue_(queue), request_fn_(request_fn),
        writer_(&ctx_) {}

  // Posts the request for the next call of this method on the queue.
  void Listen() {
    ctx_.AsyncNotifyWhenDone(done_tag_.tag());
    (service_->*request_fn_)(&ctx_, &request_, &writer_, queue_->cq.get(), queue_->cq.get(),
                             accept_tag_.tag());
  }

  grpc::ServerContext* ctx() { return &ctx_; }
  const Request& request() const { return request_; }
  absl::Time arrived() const { return arrived_; }
  // A waiting Allocate's cancellation (CallDispatch::Dispatched::cancel),
  // used if the call is cancelled. On the queue thread, which alone deletes
  // the call, so the call is still there even if it was answered already.
  void set_wait_cancel(std::shared_ptr<WaitCancel> cancel) { wait_cancel_ = std::move(cancel); }

  // Answers the call. From any thread, once; the call may be deleted by the
  // time this returns.
  void Reply(const absl::StatusOr<Response>& answer) {
    // Held while Finish starts, and taken by the queue thread before it
    // deletes the call: the hand-over from this thread to that one is then
    // one ThreadSanitizer sees (gRPC's own, through its queue, it cannot).
    std::lock_guard<std::mutex> lock(reply_mu_);
    if (answer.ok()) {
      writer_.Finish(*answer, grpc::Status::OK, finish_tag_.tag());
    } else {
      writer_.FinishWithError(ToGrpcStatus(answer.status()), finish_tag_.tag());
    }
  }

 private:
  enum class Event { kAccepted, kFinished, kDone };
  using Tag = CallTag<UnaryCall, Event>;
  friend Tag;

  void OnEvent(Event event, bool ok) {
    switch (event) {
      case Event::kAccepted:
        if (!ok) {  // the server is shutting down; no call was started
          delete this;
          return;
        }
        if (queue_->stopping) {
          // No new operation on a stopping queue: the call just ends.
          finished_ = true;
          break;
        }
        (new UnaryCall(owner_, service_, queue_, request_fn_))->Listen();
        arrived_ = absl::Now();
        if (absl::Status big = CheckRequestSize(request_); !big.ok()) return Reply(big);
        owner_->Handle(this);  // replies now, or later from another thread
        return;                // `this` may be finished and deleted later only
      case Event::kFinished: {
        std::lock_guard<std::mutex> lock(reply_mu_);  // Reply has let go
        finished_ = true;
        break;
      }
      case Event::kDone:
        done_ = true;
        if (ctx_.IsCancelled() && wait_cancel_ != nullptr) wait_cancel_->Cancel(owner_->broker());
        break;
    }
    if (finished_ && done_) delete this;
  }

  GpuMemoryService* const owner_;
  AsyncGpuMemory* const service_;
  EventQueue* const queue_;
  const RequestFn request_fn_;
  grpc::ServerContext ctx_;
  Request request_;
  grpc::ServerAsyncResponseWriter<Response> writer_;
  absl::Time arrived_;
  std::shared_ptr<WaitCancel> wait_cancel_;
  std::mutex reply_mu_;
  Tag accept_tag_{this, Event::kAccepted};
  Tag finish_tag_{this, Event::kFinished};
  Tag done_tag_{this, Event::kDone};
  bool finished_ = false;  // queue thread only
  bool done_ = false;      // queue thread only
};

namespace {

template <typename Call>
void Listen(GpuMemoryService* owner, AsyncGpuMemory* service, EventQueue* queue,
            typename Call::RequestFn fn) {
  (new Call(owner, service, queue, fn))->Listen();
}

absl::Status NoTenants() {
  return absl::UnimplementedError("this daemon serves no tenant RPCs");
}

}  // namespace

void GpuMemoryService::Start(const std::vector<EventQueue*>& queues) {
  AsyncGpuMemory* s = p_.service;
  for (EventQueue* q : queues) {
    Listen<AllocateCall>(this, s, q, &AsyncGpuMemory::RequestAllocate);
    Listen<FreeCall>(this, s, q, &AsyncGpuMemory::RequestFree);
    Listen<GetStatsCall>(this, s, q, &AsyncGpuMemory::RequestGetStats);
    Listen<GetSessionCall>(this, s, q, &AsyncGpuMemory::RequestGetSession);
    Listen<GetUsageCall>(this, s, q, &AsyncGpuMemory::RequestGetUsage);
    Listen<GetLedgerCall>(this, s, q, &AsyncGpuMemory::RequestGetLedger);
    Listen<SetQuotaCall>(this, s, q, &AsyncGpuMemory::RequestSetQuota);
    Listen<PutTenantCall>(this, s, q, &AsyncGpuMemory::RequestPutTenant);
    Listen<DeleteTenantCall>(this, s, q, &AsyncGpuMemory::RequestDeleteTenant);
    Listen<ResumeCall>(this, s, q, &AsyncGpuMemory::RequestResume);
  }
}

void GpuMemoryService::Handle(AllocateCall* call) {
  CallDispatch::Dispatched d = dispatch_.Allocate(
      CallerOf(call->ctx(), *p_.peers, *p_.broker), call->request(), call->arrived(),
      [call](MemoryBroker::AllocateAnswer answer, CallDispatch::Delivery) {
        call->Reply(answer);
      });
  if (d.cancel != nullptr) call->set_wait_cancel(std::move(d.cancel));
}

void GpuMemoryService::Handle(FreeCall* call) {
  dispatch_.Free(CallerOf(call->ctx(), *p_.peers, *p_.broker), call->request(),
                 [call](absl::StatusOr<v1::FreeResponse> answer, CallDispatch::Delivery) {
                   call->Reply(answer);
                 });
}

template <typename Call, typename Fn>
void GpuMemoryService::Query(Call* call, Fn query) {
  using Response = typename std::decay_t<decltype(query())>::value_type;
  // Held until the answer is sent (the callback's copy goes then).
  absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> held = TakeQueryBudget(
      &query_budget_, *p_.peers, call->ctx()->peer(), call->request().ByteSizeLong());
  if (!held.ok()) return call->Reply(held.status());
  dispatch_.Query<Response>(
      std::move(query),
      [call, held = *std::move(held)](absl::StatusOr<Response> answer, CallDispatch::Delivery) {
        call->Reply(answer);
      });
}

void GpuMemoryService::Handle(GetStatsCall* call) {
  absl::StatusOr<PeerCred> caller = CallerOf(call->ctx(), *p_.peers, *p_.broker);
  if (!caller.ok()) return call->Reply(caller.status());
  MemoryBroker* broker = p_.broker;
  const ledger::TenantLedger* ledger = p_.ledger;
  Query(call, [broker, ledger, call,
               caller = *caller]() -> absl::StatusOr<v1::GetStatsResponse> {
    v1::GetStatsResponse out =
        RenderStats(broker->Stats(caller, call->request().include_slabs()));
    *out.mutable_ledger() = RenderLedgerStatus(ledger);
    return out;
  });
}

void GpuMemoryService::Handle(GetSessionCall* call) {
  absl::StatusOr<PeerCred> caller = CallerOf(call->ctx(), *p_.peers, *p_.broker);
  if (!caller.ok()) return call->Reply(caller.status());
  call->Reply(p_.broker->GetSession(*caller));
}

// A look over the whole table (and frees of blocks nobody re-presented):
// on the query workers, off the queue's thread.
void GpuMemoryService::Handle(ResumeCall* call) {
  absl::StatusOr<PeerCred> caller = CallerOf(call->ctx(), *p_.peers, *p_.broker);
  if (!caller.ok()) return call->Reply(caller.status());
  MemoryBroker* broker = p_.broker;
  Query(call, [broker, call, caller = *caller] { return broker->Resume(caller, call->request()); });
}

// The tenant RPCs take the caller from the kernel as every RPC does; they
// act on tenants, so a connection-bound session token is not needed.
void GpuMemoryService::Handle(GetUsageCall* call) {
  absl::StatusOr<PeerCred> caller = p_.peers->Lookup(call->ctx()->peer());
  if (!caller.ok()) return call->Reply(caller.status());
  if (p_.tenants == nullptr) return call->Reply(NoTenants());
  TenantAdmin* tenants = p_.tenants;
  Query(call, [tenants, caller = *caller] { return tenants->GetUsage(caller); });
}

void GpuMemoryService::Handle(GetLedgerCall* call) {
  absl::StatusOr<PeerCred> caller = p_.peers->Lookup(call->ctx()->peer());
  if (!caller.ok()) return call->Reply(caller.status());
  if (p_.tenants == nullptr) return call->Reply(NoTenants());
  TenantAdmin* tenants = p_.tenants;
  Query(call, [tenants, call, caller = *caller] {
    return tenants->GetLedger(caller, call->request());
  });
}

void GpuMemoryService::Handle(SetQuotaCall* call) {
  absl::StatusOr<PeerCred> caller = p_.peers->Lookup(call->ctx()->peer());
  if (!caller.ok()) return call->Reply(caller.status());
  if (p_.tenants == nullptr) return call->Reply(NoTenants());
  TenantAdmin* tenants = p_.tenants;
  Query(call, [tenants, call, caller = *caller] {
    return tenants->SetQuota(caller, call->request());
  });
}

void GpuMemoryService::Handle(PutTenantCall* call) {
  absl::StatusOr<PeerCred> caller = p_.peers->Lookup(call->ctx()->peer());
  if (!caller.ok()) return call->Reply(caller.status());
  if (p_.tenants == nullptr) return call->Reply(NoTenants());
  TenantAdmin* tenants = p_.tenants;
  Query(call, [tenants, call, caller = *caller] {
    return tenants->PutTenant(caller, call->request());
  });
}

void GpuMemoryService::Handle(DeleteTenantCall* call) {
  absl::StatusOr<PeerCred> caller = p_.peers->Lookup(call->ctx()->peer());
  if (!caller.ok()) return call->Reply(caller.status());
  if (p_.tenants == nullptr) return call->Reply(NoTenants());
  TenantAdmin* tenants = p_.tenants;
  Query(call, [tenants, call, caller = *caller] {
    return tenants->DeleteTenant(caller, call->request());
  });
}

}  // namespace gpumem
