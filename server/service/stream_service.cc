// See stream_service.h. One Call per stream, driven by the events of its
// completion queue (accepted, read done, write done, finish done, call done);
// all of a Call's events arrive on one queue, drained by one thread. Tags
// are CqEvents (cq_event.h), so other async services may share the queues.
#include "server/service/stream_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/alarm.h>
#include <grpcpp/server_context.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc_status.h"
#include "server/service/cq_event.h"
#include "server/service/caller.h"
#include "server/service/message_limits.h"
#include "server/service/wait_cancel.h"

namespace gpumem {

// Invariants of a Call:
//  - at most one Read and one Write outstanding (gRPC's rule); Finish only
//    when neither is, and once;
//  - outbox_ holds the answers not yet written, oldest first; while writing_
//    its front is the one being written; in_flight_ holds the request ids of
//    exactly the answers in outbox_;
//  - offloads_ counts the requests a worker or admission still owes an
//    answer (waiting ones included); waits_ holds the cancels of the wait_ms
//    Allocates among them, until their answers reach OnOffloaded or the
//    stream's end cancels them all (CancelWaits);
//  - deleted only when its accept failed, or when Finish completed, the done
//    event arrived and nothing is outstanding.
class StreamService::Call {
  // A tag handed to gRPC: which call, which event. Passed as CqEvent*.
  enum class Event { kAccepted, kRead, kWritten, kFinished, kDone, kPush, kOffloaded };
  struct Tag final : CqEvent {
    Tag(Call* c, Event e) : call(c), event(e) {}
    void OnEvent(bool ok) override { Call::OnEvent(this, ok); }
    void* tag() { return static_cast<CqEvent*>(this); }
    Call* const call;
    const Event event;
  };

 public:
  Call(StreamService* owner, EventQueue* queue)
      : owner_(owner), queue_(queue), cq_(queue->cq.get()), stream_(&ctx_) {}

  // Posts the request for the next stream on `cq`.
  void Listen() {
    ctx_.AsyncNotifyWhenDone(done_tag_.tag());
    owner_->service_->RequestStream(&ctx_, &stream_, cq_, cq_, accept_tag_.tag());
  }

  // Handles one event of this call; deletes the call when it is over.
  static void OnEvent(const Tag* t, bool ok) {
    Call* call = t->call;
    switch (t->event) {
      case Event::kAccepted:
        if (!ok) {  // the server is shutting down; no stream was started
          delete call;
          return;
        }
        call->OnAccepted();
        break;
      case Event::kRead:
        call->OnRead(ok);
        break;
      case Event::kWritten:
        call->OnWritten(ok);
        break;
      case Event::kFinished:
        call->finished_ = true;
        break;
      case Event::kDone:
        call->done_ = true;
        if (call->ctx_.IsCancelled()) {
          call->broken_ = true;
          call->CancelWaits();
        }
        break;
      case Event::kPush:
        call->OnPush(ok);
        break;
      case Event::kOffloaded:
        call->OnOffloaded();
        break;
    }
    call->MaybeFinish();
    if (call->finished_ && call->done_ && !call->reading_ && !call->writing_) {
      // No push can be started once unregistered; one already started
      // brings its event later, and the call is deleted then.
      call->Unregister();
      // An Allocate still on a backend worker brings its answer (and an
      // event) later; the call is deleted once that is handled.
      if (call->offloads_ > 0) return;
      {
        std::lock_guard<std::mutex> lock(call->push_mu_);
        if (call->push_pending_ || call->offload_wake_pending_) return;
      }
      delete call;
    }
  }

  // From any thread, under the owner's registry lock (so the call is alive
  // and registered): queues `reply` for this stream and wakes its queue
  // thread with an alarm; only that thread touches the stream. At most one
  // push waits at a time (a second is dropped: one reclaim says it all).
  void Push(v1::StreamReply reply) {
    std::lock_guard<std::mutex> lock(push_mu_);
    if (push_pending_) return;
    push_pending_ = true;
    pushed_ = std::move(reply);
    push_alarm_.Set(cq_, gpr_now(GPR_CLOCK_MONOTONIC), push_tag_.tag());
  }

 private:
  struct Outgoing {
    bool push = false;  // daemon-initiated: no request id in flight
    uint64_t request_id = 0;
    grpc::ByteBuffer bytes;
    std::vector<uint64_t> allocation_ids;  // freed if never delivered
  };
  // A request a backend worker ran (see Offload), and its answer.
  struct Offloaded {
    uint64_t request_id = 0;
    v1::StreamReply reply;
    std::vector<uint64_t> allocation_ids;  // freed if never delivered
  };

  void OnAccepted() {
    // The next stream on this queue gets a fresh Call.
    if (!queue_->stopping) (new Call(owner_, queue_))->Listen();
    absl::StatusOr<PeerCred> caller = CallerOf(&ctx_, *owner_->peers_, *owner_->broker_);
    if (!caller.ok()) {
      Fail(ToGrpcStatus(caller.status()));
      return;
    }
    caller_ = *caller;
    absl::StatusOr<v1::Session> session = owner_->broker_->GetSession(caller_);
    if (session.ok()) {
      session_id_ = session->session_id();
      absl::MutexLock lock(&owner_->registry_mu_);
      if (!owner_->registry_closed_) {
        owner_->registry_.emplace(session_id_, this);
        registered_ = true;
      }
    }
    StartRead();
  }

  void Unregister() {
    if (!registered_) return;
    absl::MutexLock lock(&owner_->registry_mu_);
    auto range = owner_->registry_.equal_range(session_id_);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == this) {
        owner_->registry_.erase(it);
        break;
      }
    }
    registered_ = false;
  }

  // The queue thread's half of Push: the reply joins the outbox.
  void OnPush(bool ok) {
    v1::StreamReply reply;
    {
      std::lock_guard<std::mutex> lock(push_mu_);
      push_pending_ = false;
      reply = std::move(pushed_);
    }
    // One push at most in the outbox: a client that does not read gets
    // no more than that, however many refusals name it.
    if (!ok || broken_ || failed_ || reads_closed_ || finish_started_ ||
        queue_->stopping || push_queued_) {
      return;
    }
    push_queued_ = true;
    Outgoing out;
    out.push = true;
    bool own_buffer = false;
    grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::StreamReply>(
        reply, &out.bytes, &own_buffer);
    outbox_.push_back(std::move(out));
    StartWriteIfIdle();
  }

  void StartRead() {
    if (queue_->stopping) return;
    reading_ = true;
    stream_.Read(&incoming_, read_tag_.tag());
  }

  void OnRead(bool ok) {
    reading_ = false;
    if (!ok || broken_) {  // the client half-closed, or the stream broke
      reads_closed_ = true;
      return;
    }
    ++messages_read_;
    if (absl::Status big = CheckStreamMessageSize(messages_read_, incoming_.Length()); !big.ok()) {
      return Fail(ToGrpcStatus(big));
    }
    v1::StreamRequest request;
    if (!grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::StreamRequest>(
             &incoming_, &request).ok()) {
      Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("stream message ", messages_read_,
                                     " is not a gpumem.v1.StreamRequest")));
      return;
    }
    if (!in_flight_.insert(request.request_id()).second) {
      Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("request id ", request.request_id(),
                                     " reused while its request is in flight; "
                                     "use a new id per request")));
      return;
    }
    Answer(request);
    StartWriteIfIdle();
    if (Queued() < owner_->options_.max_queued_replies) StartRead();
  }

  // Answers waiting to be written, and Allocates on a backend worker.
  size_t Queued() const { return outbox_.size() + static_cast<size_t>(offloads_); }

  // Runs the request against the broker and queues its answer.
  void Answer(const v1::StreamRequest& request) {
    v1::StreamReply reply;
    v1::StreamAnswer* answer = reply.mutable_answer();
    answer->set_request_id(request.request_id());
    Outgoing out;
    out.request_id = request.request_id();
    absl::Status status;
    switch (request.request_case()) {
      case v1::StreamRequest::kAllocate: {
        const absl::Time start = absl::Now();
        // A request with wait_ms may wait for memory (admission's limits and
        // refusals apply, as on the unary Allocate); the stream's end
        // cancels it.
        std::shared_ptr<WaitCancel> cancel =
            request.allocate().wait_ms() != 0 ? std::make_shared<WaitCancel>() : nullptr;
        MemoryBroker::AllocateOutcome r = owner_->broker_->TryAllocate(
            caller_, request.allocate(), HeldAnswer(request.request_id(), start));
        if (r.kind == MemoryBroker::AllocateOutcome::Kind::kWaiting) {
          // Waiting, or held while other sessions give back idle leases:
          // answered from admission's thread through offload_alarm_, like an
          // offloaded request, and counted with them against
          // max_queued_replies.
          ++offloads_;
          if (cancel != nullptr) {
            cancel->Waiting(owner_->broker_, r.wait_ticket);
            waits_.emplace(request.request_id(), std::move(cancel));
          }
          return;
        }
        if (r.kind == MemoryBroker::AllocateOutcome::Kind::kNeedsBackendWork) {
          // A new slab (or releasing empty ones): not on this thread, which
          // serves every stream of the queue. Answered when it is done.
          if (Offload(request, start, std::move(cancel))) return;
          status = MemoryBroker::StoppingError();
          break;
        }
        status = AnswerAllocate(owner_, std::move(r.answer), start, answer, &out.allocation_ids);
        break;
      }
      case v1::StreamRequest::kFree: {
        std::optional<absl::StatusOr<v1::FreeResponse>> now =
            owner_->broker_->TryFree(caller_, request.free());
        if (!now.has_value()) {
          // A dedicated slab goes back to the backend: not here.
          if (Offload(request, absl::Now())) return;
          now = owner_->broker_->Free(caller_, request.free());  // stopping: inline
        }
        absl::StatusOr<v1::FreeResponse> r = *std::move(now);
        status = r.status();
        if (owner_->observer_ != nullptr) owner_->observer_->OnFree(status);
        if (r.ok()) *answer->mutable_free() = std::move(*r);
        break;
      }
      case v1::StreamRequest::kGetSession: {
        absl::StatusOr<v1::Session> r = owner_->broker_->GetSession(caller_);
        status = r.status();
        if (r.ok()) *answer->mutable_session() = std::move(*r);
        break;
      }
      case v1::StreamRequest::kReclaimed:
        // The give-back itself came as Frees (answered before this, in
        // order); requests held for this session's answer go on now.
        owner_->broker_->ReclaimAnswered(caller_);
        break;
      case v1::StreamRequest::REQUEST_NOT_SET:
        status = absl::InvalidArgumentError(absl::StrCat(
            "StreamRequest ", request.request_id(),
            " carries no request: set allocate, free or get_session"));
        break;
    }
    if (!status.ok()) *answer->mutable_status() = ToRpcStatus(status);
    bool own_buffer = false;
    grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::StreamReply>(
        reply, &out.bytes, &own_buffer);
    outbox_.push_back(std::move(out));
  }

  // Puts an Allocate's result in `answer` (the ids it allocated in `ids`)
  // and tells the observer; returns its status.
  static absl::Status AnswerAllocate(StreamService* owner,
                                     absl::StatusOr<v1::AllocateResponse> r, absl::Time start,
                                     v1::StreamAnswer* answer, std::vector<uint64_t>* ids) {
    if (owner->observer_ != nullptr) {
      owner->observer_->OnAllocate(r.status(), r.ok() ? *r : v1::AllocateResponse(),
                                   absl::Now() - start);
    }
    if (!r.ok()) return r.status();
    for (const v1::Allocation& a : r->allocations()) ids->push_back(a.id());
    *answer->mutable_allocate() = *std::move(r);
    return absl::OkStatus();
  }

  // Queues a finished request's answer for the queue thread (OnOffloaded),
  // from any thread.
  void CompleteOffload(Offloaded done) {
    std::lock_guard<std::mutex> lock(push_mu_);
    offload_done_.push_back(std::move(done));
    if (!offload_wake_pending_) {
      offload_wake_pending_ = true;
      offload_alarm_.Set(cq_, gpr_now(GPR_CLOCK_MONOTONIC), offload_tag_.tag());
    }
  }

  // The callback of an Allocate the broker may hold (a reclaim hold): its
  // answer, from admission's thread, goes the offloaded requests' way. The
  // call outlives it: the request counts in offloads_ until OnOffloaded.
  MemoryBroker::AllocateCallback HeldAnswer(uint64_t request_id, absl::Time start) {
    StreamService* owner = owner_;
    return [this, owner, request_id, start](MemoryBroker::AllocateAnswer r) {
      Offloaded done;
      done.request_id = request_id;
      v1::StreamAnswer* answer = done.reply.mutable_answer();
      answer->set_request_id(request_id);
      absl::Status status =
          AnswerAllocate(owner, std::move(r), start, answer, &done.allocation_ids);
      if (!status.ok()) *answer->mutable_status() = ToRpcStatus(status);
      CompleteOffload(std::move(done));
    };
  }

  // Runs an Allocate or Free that needs backend work on a backend worker;
  // its answer comes back through offload_alarm_ (OnOffloaded). `cancel`:
  // a wait_ms Allocate's, told the ticket if it waits. False if the workers
  // are stopping (nothing was started).
  bool Offload(const v1::StreamRequest& request, absl::Time start,
               std::shared_ptr<WaitCancel> cancel = nullptr) {
    StreamService* owner = owner_;
    const bool submitted = owner->workers_->Submit(
        [this, owner, caller = caller_, start, request, cancel] {
          Offloaded done;
          done.request_id = request.request_id();
          v1::StreamAnswer* answer = done.reply.mutable_answer();
          answer->set_request_id(request.request_id());
          absl::Status status;
          if (request.has_allocate()) {
            MemoryBroker::AllocateOutcome r = owner->broker_->Allocate(
                caller, request.allocate(), HeldAnswer(request.request_id(), start));
            // Held: the callback answers it (it still counts as offloaded),
            // maybe already, and the call may be gone: only `cancel` and
            // `owner` are used.
            if (r.kind == MemoryBroker::AllocateOutcome::Kind::kWaiting) {
              if (cancel != nullptr) cancel->Waiting(owner->broker_, r.wait_ticket);
              return;
            }
            status = AnswerAllocate(owner, std::move(r.answer), start, answer,
                                    &done.allocation_ids);
          } else {
            absl::StatusOr<v1::FreeResponse> r = owner->broker_->Free(caller, request.free());
            status = r.status();
            if (owner->observer_ != nullptr) owner->observer_->OnFree(status);
            if (r.ok()) *answer->mutable_free() = *std::move(r);
          }
          if (!status.ok()) *answer->mutable_status() = ToRpcStatus(status);
          CompleteOffload(std::move(done));
        });
    if (!submitted) return false;
    ++offloads_;
    if (cancel != nullptr) waits_.emplace(request.request_id(), std::move(cancel));
    return true;
  }

  // The stream can carry no more answers, or ends with an error: its
  // waiting requests give up their places now. Each is answered CANCELLED
  // through its callback, so it leaves offloads_ the usual way.
  void CancelWaits() {
    for (auto& [request_id, cancel] : waits_) cancel->Cancel(owner_->broker_);
    waits_.clear();
  }

  // The queue thread's half of Offload: finished requests' answers join the
  // outbox, or (Allocates) are freed if their stream can no longer carry them.
  void OnOffloaded() {
    std::vector<Offloaded> done;
    {
      std::lock_guard<std::mutex> lock(push_mu_);
      offload_wake_pending_ = false;
      done.swap(offload_done_);
    }
    offloads_ -= static_cast<int>(done.size());
    for (Offloaded& d : done) {
      if (!waits_.empty()) waits_.erase(d.request_id);
      Outgoing out;
      out.request_id = d.request_id;
      out.allocation_ids = std::move(d.allocation_ids);
      if (broken_ || finish_started_ || queue_->stopping) {
        in_flight_.erase(d.request_id);
        FreeAllocations(out);
        continue;
      }
      bool own_buffer = false;
      grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::StreamReply>(
          d.reply, &out.bytes, &own_buffer);
      outbox_.push_back(std::move(out));
    }
    StartWriteIfIdle();
    if (!reading_ && !reads_closed_ && !failed_ && !broken_ && !queue_->stopping &&
        Queued() < owner_->options_.max_queued_replies) {
      StartRead();
    }
  }

  void StartWriteIfIdle() {
    if (writing_ || outbox_.empty() || broken_ || queue_->stopping) return;
    writing_ = true;
    stream_.Write(outbox_.front().bytes, write_tag_.tag());
  }

  void OnWritten(bool ok) {
    writing_ = false;
    if (!ok) {  // the client is gone; what is left was never delivered
      broken_ = true;
      CancelWaits();
      return;
    }
    if (outbox_.front().push) {
      push_queued_ = false;
    } else {
      in_flight_.erase(outbox_.front().request_id);
    }
    outbox_.pop_front();
    StartWriteIfIdle();
    if (!reading_ && !reads_closed_ && !failed_ && !broken_ &&
        Queued() < owner_->options_.max_queued_replies) {
      StartRead();
    }
  }

  // Ends the stream with `status` once the queued answers are written.
  void Fail(grpc::Status status) {
    failed_ = true;
    final_status_ = std::move(status);
    CancelWaits();  // the stream ends once they are answered
  }

  // Finishes when nothing more will be read, nothing is outstanding and the
  // answers are written (or can no longer be).
  void MaybeFinish() {
    if (finish_started_ || reading_ || writing_) return;
    if (queue_->stopping) {  // no new operation: the call just ends
      FreeUndelivered();
      finish_started_ = finished_ = true;
      return;
    }
    if (!reads_closed_ && !failed_ && !broken_) return;
    if ((!outbox_.empty() || offloads_ > 0) && !broken_) return;
    FreeUndelivered();
    finish_started_ = true;
    stream_.Finish(final_status_, finish_tag_.tag());
  }

  void FreeUndelivered() {
    for (const Outgoing& out : outbox_) FreeAllocations(out);
    outbox_.clear();
    in_flight_.clear();
  }

  // Frees what an answer that will never be delivered had allocated.
  void FreeAllocations(const Outgoing& out) {
    for (uint64_t id : out.allocation_ids) {
      v1::FreeRequest free;
      free.set_id(id);
      owner_->broker_->Free(caller_, free).IgnoreError();
    }
  }

  StreamService* owner_;
  EventQueue* queue_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Tag accept_tag_{this, Event::kAccepted};
  Tag read_tag_{this, Event::kRead};
  Tag write_tag_{this, Event::kWritten};
  Tag finish_tag_{this, Event::kFinished};
  Tag done_tag_{this, Event::kDone};
  Tag push_tag_{this, Event::kPush};
  Tag offload_tag_{this, Event::kOffloaded};
  grpc::Alarm push_alarm_;
  grpc::Alarm offload_alarm_;
  std::mutex push_mu_;
  bool push_pending_ = false;  // guarded by push_mu_
  v1::StreamReply pushed_;     // guarded by push_mu_
  // Finished offloaded Allocates, and whether offload_alarm_ is set for
  // them; guarded by push_mu_.
  std::vector<Offloaded> offload_done_;
  bool offload_wake_pending_ = false;
  int offloads_ = 0;  // submitted, not yet handled by OnOffloaded (queue thread only)
  // The cancels of waiting wait_ms Allocates, by request id (queue thread only).
  absl::flat_hash_map<uint64_t, std::shared_ptr<WaitCancel>> waits_;
  uint64_t session_id_ = 0;
  bool registered_ = false;    // queue thread only
  bool push_queued_ = false;   // a push is in outbox_ (queue thread only)

  PeerCred caller_;
  grpc::ByteBuffer incoming_;
  uint64_t messages_read_ = 0;
  std::deque<Outgoing> outbox_;
  absl::flat_hash_set<uint64_t> in_flight_;
  grpc::Status final_status_;  // OK unless Fail()
  bool reading_ = false;
  bool writing_ = false;
  bool reads_closed_ = false;
  bool failed_ = false;
  bool broken_ = false;
  bool finish_started_ = false;
  bool finished_ = false;
  bool done_ = false;
};

StreamService::StreamService(MemoryBroker* broker, const PeerTable* peers,
                             AsyncGpuMemory* service, WorkerPool* backend_workers,
                             CallObserver* observer, StreamServiceOptions options)
    : broker_(broker),
      peers_(peers),
      service_(service),
      workers_(backend_workers),
      observer_(observer),
      options_(options) {
  if (options_.max_queued_replies < 1) options_.max_queued_replies = 1;
  broker_->SetReclaimSender([this](uint64_t session, const v1::ReclaimRequest& r) {
    v1::StreamReply reply;
    *reply.mutable_reclaim() = r;
    absl::MutexLock lock(&registry_mu_);
    if (registry_closed_) return false;
    auto range = registry_.equal_range(session);
    bool reached = false;
    for (auto it = range.first; it != range.second; ++it) {
      it->second->Push(reply);
      reached = true;  // a push already waiting says the same
    }
    return reached;
  });
}

StreamService::~StreamService() {
  Close();
  // After the queue threads are gone (they call the broker, which reads it).
  broker_->SetReclaimSender(nullptr);
}

void StreamService::Start(const std::vector<EventQueue*>& queues) {
  for (EventQueue* q : queues) (new Call(this, q))->Listen();
}

void StreamService::Close() {
  // No alarm is set on a queue from now on (gRPC aborts on an operation
  // started on a queue that is shut down).
  absl::MutexLock lock(&registry_mu_);
  registry_closed_ = true;
}

}  // namespace gpumem
