// See stream_service.h. One Call per stream, driven by the events of its
// completion queue (accepted, read done, write done, finish done, call done,
// mail); all of a Call's events arrive on one queue, drained by one thread.
// Its life is a StreamStateMachine (stream_state.h): what it may still do is
// read off that state. Tags are CqEvents (cq_event.h), so other async
// services may share the queues.
#include "server/service/stream_service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
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
#include "server/service/caller.h"
#include "server/service/cq_event.h"
#include "server/service/message_limits.h"
#include "server/service/stream_state.h"
#include "server/service/wait_cancel.h"

namespace gpumem {

// Invariants of a Call:
//  - at most one Read and one Write outstanding (gRPC's rule); Finish only
//    when neither is, and once (StreamState::kFinishing);
//  - outbox_ holds the answers not yet written, oldest first; while writing_
//    its front is the one being written; in_flight_ holds the request ids of
//    exactly the answers in outbox_ and of the requests owed;
//  - owed_ counts the requests a worker or admission still owes an answer
//    (waiting ones included); waits_ holds the cancels of the wait_ms
//    Allocates among them, until their answers reach OnMail or the stream's
//    end cancels them all (CancelWaits);
//  - other threads reach the call only through its mailbox (a reclaim push,
//    answers made elsewhere) and its one alarm, set while mail waits;
//  - deleted only when its accept failed, or when it is closed, the done
//    event arrived and nothing is owed or in the mailbox.
class StreamService::Call {
  // Completion-queue events of a call: the tags it hands to gRPC.
  enum class Completion { kAccepted, kRead, kWritten, kFinished, kDone, kMail };
  using Tag = CallTag<Call, Completion>;
  friend Tag;

 public:
  Call(StreamService* owner, EventQueue* queue)
      : owner_(owner), queue_(queue), cq_(queue->cq.get()), stream_(&ctx_) {}

  // Posts the request for the next stream on the queue.
  void Listen() {
    ctx_.AsyncNotifyWhenDone(done_tag_.tag());
    owner_->service_->RequestStream(&ctx_, &stream_, cq_, cq_, accept_tag_.tag());
  }

  // From any thread, under the owner's registry lock (so the call is alive
  // and registered): mails `reply` to the queue thread, which alone touches
  // the stream. At most one push waits at a time (a second is dropped: one
  // reclaim says it all).
  void Push(v1::StreamReply reply) {
    std::lock_guard<std::mutex> lock(mail_mu_);
    if (mail_push_.has_value()) return;
    mail_push_ = std::move(reply);
    WakeLocked();
  }

 private:
  struct Outgoing {
    bool push = false;  // daemon-initiated: no request id in flight
    uint64_t request_id = 0;
    grpc::ByteBuffer bytes;
    std::vector<uint64_t> allocation_ids;  // freed if never delivered
  };
  // A request's answer, before it is serialized.
  struct Answered {
    explicit Answered(uint64_t id) : request_id(id) {
      reply.mutable_answer()->set_request_id(id);
    }
    v1::StreamAnswer* answer() { return reply.mutable_answer(); }
    uint64_t request_id;
    v1::StreamReply reply;
    std::vector<uint64_t> allocation_ids;  // freed if never delivered
  };

  // Handles one event of this call; deletes the call when it is over.
  void OnEvent(Completion event, bool ok) {
    switch (event) {
      case Completion::kAccepted:
        if (!ok) {  // the server is shutting down; no stream was started
          delete this;
          return;
        }
        OnAccepted();
        break;
      case Completion::kRead:
        OnRead(ok);
        break;
      case Completion::kWritten:
        OnWritten(ok);
        break;
      case Completion::kFinished:
        state_.On(StreamEvent::kFinishDone);
        break;
      case Completion::kDone:
        done_ = true;
        if (ctx_.IsCancelled()) ClientGone();
        break;
      case Completion::kMail:
        OnMail(ok);
        break;
    }
    MaybeFinish();
    if (!state_.Closed() || !done_ || reading_ || writing_) return;
    // No push can be mailed once unregistered; one already mailed brings
    // its event later, and the call is deleted then.
    Unregister();
    // A request still owed brings its answer (and an event) later.
    if (owed_ > 0) return;
    {
      std::lock_guard<std::mutex> lock(mail_mu_);
      if (mail_wake_pending_) return;
    }
    delete this;
  }

  void OnAccepted() {
    // The next stream on this queue gets a fresh Call.
    if (!queue_->stopping) (new Call(owner_, queue_))->Listen();
    state_.On(StreamEvent::kAccepted);
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
    MaybeRead();
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

  // Reads the next request, unless the stream reads no more or has as many
  // answers queued and owed as it may (the client is then held by HTTP/2
  // flow control until it reads its answers).
  void MaybeRead() {
    if (reading_ || !state_.ReadsRequests() || queue_->stopping ||
        Queued() >= owner_->options_.max_queued_replies) {
      return;
    }
    reading_ = true;
    stream_.Read(&incoming_, read_tag_.tag());
  }

  void OnRead(bool ok) {
    reading_ = false;
    if (!ok || !state_.ReadsRequests()) {  // the client half-closed, or the stream broke
      state_.On(StreamEvent::kReadsEnded);
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
    MaybeRead();
  }

  // Answers waiting to be written, and requests owed.
  size_t Queued() const { return outbox_.size() + static_cast<size_t>(owed_); }

  // Hands the request to the dispatch (Allocate, Free) or answers it here.
  void Answer(const v1::StreamRequest& request) {
    const uint64_t id = request.request_id();
    switch (request.request_case()) {
      case v1::StreamRequest::kAllocate: {
        // A request with wait_ms may wait for memory (admission's limits and
        // refusals apply, as on the unary Allocate); the stream's end
        // cancels it.
        CallDispatch::Dispatched d = owner_->dispatch_.Allocate(
            caller_, request.allocate(), absl::Now(), AllocateAnswerOf(id));
        if (d.route == CallDispatch::Route::kInline) return;
        ++owed_;
        if (d.cancel != nullptr) waits_.emplace(id, std::move(d.cancel));
        return;
      }
      case v1::StreamRequest::kFree:
        if (owner_->dispatch_.Free(caller_, request.free(), FreeAnswerOf(id)) !=
            CallDispatch::Route::kInline) {
          ++owed_;
        }
        return;
      default:
        break;
    }
    Answered a(id);
    absl::Status status;
    switch (request.request_case()) {
      case v1::StreamRequest::kGetSession: {
        absl::StatusOr<v1::Session> r = owner_->broker_->GetSession(caller_);
        status = r.status();
        if (r.ok()) *a.answer()->mutable_session() = std::move(*r);
        break;
      }
      case v1::StreamRequest::kReclaimed:
        // The give-back itself came as Frees (answered before this, in
        // order); requests held for this session's answer go on now.
        owner_->broker_->ReclaimAnswered(caller_);
        break;
      default:
        status = absl::InvalidArgumentError(absl::StrCat(
            "StreamRequest ", id, " carries no request: set allocate, free or get_session"));
        break;
    }
    if (!status.ok()) *a.answer()->mutable_status() = ToRpcStatus(status);
    Enqueue(std::move(a));
  }

  // The callbacks the dispatch answers through. Later answers hold the call:
  // each request counts in owed_ until OnMail takes its answer.
  CallDispatch::AllocateDone AllocateAnswerOf(uint64_t id) {
    return [this, id](absl::StatusOr<v1::AllocateResponse> r, CallDispatch::Delivery where) {
      Answered a(id);
      if (r.ok()) {
        for (const v1::Allocation& x : r->allocations()) a.allocation_ids.push_back(x.id());
        *a.answer()->mutable_allocate() = *std::move(r);
      } else {
        *a.answer()->mutable_status() = ToRpcStatus(r.status());
      }
      Deliver(std::move(a), where);
    };
  }
  CallDispatch::FreeDone FreeAnswerOf(uint64_t id) {
    return [this, id](absl::StatusOr<v1::FreeResponse> r, CallDispatch::Delivery where) {
      Answered a(id);
      if (r.ok()) {
        *a.answer()->mutable_free() = *std::move(r);
      } else {
        *a.answer()->mutable_status() = ToRpcStatus(r.status());
      }
      Deliver(std::move(a), where);
    };
  }

  // An answer made inline joins the outbox now; one made on another thread
  // is mailed to the queue thread.
  void Deliver(Answered a, CallDispatch::Delivery where) {
    if (where == CallDispatch::Delivery::kInline) {
      Enqueue(std::move(a));
      return;
    }
    std::lock_guard<std::mutex> lock(mail_mu_);
    mail_answers_.push_back(std::move(a));
    WakeLocked();
  }

  // Serializes an answer into the outbox (queue thread).
  void Enqueue(Answered a) {
    Outgoing out;
    out.request_id = a.request_id;
    out.allocation_ids = std::move(a.allocation_ids);
    bool own_buffer = false;
    grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::StreamReply>(a.reply, &out.bytes,
                                                                     &own_buffer);
    outbox_.push_back(std::move(out));
  }

  // Sets the alarm that brings the mail to the queue thread, unless it is
  // set already. Under mail_mu_.
  void WakeLocked() {
    if (mail_wake_pending_) return;
    mail_wake_pending_ = true;
    mail_alarm_.Set(cq_, gpr_now(GPR_CLOCK_MONOTONIC), mail_tag_.tag());
  }

  // The stream can carry no more answers, or ends with an error: its
  // waiting requests give up their places now. Each is answered CANCELLED
  // through its callback, so it leaves owed_ the usual way.
  void CancelWaits() {
    for (auto& [request_id, cancel] : waits_) cancel->Cancel(owner_->broker_);
    waits_.clear();
  }

  // The queue thread's half of the mailbox: answers made elsewhere join the
  // outbox, or (Allocates) are freed if the stream can no longer carry them;
  // a push joins it if the client can still answer one and none is queued
  // (a client that does not read gets no more than one, however many
  // refusals name it).
  void OnMail(bool ok) {
    std::vector<Answered> answers;
    std::optional<v1::StreamReply> push;
    {
      std::lock_guard<std::mutex> lock(mail_mu_);
      mail_wake_pending_ = false;
      answers.swap(mail_answers_);
      push.swap(mail_push_);
    }
    owed_ -= static_cast<int>(answers.size());
    const bool deliver = state_.WritesAnswers() && !queue_->stopping;
    for (Answered& a : answers) {
      if (!waits_.empty()) waits_.erase(a.request_id);
      if (deliver) {
        Enqueue(std::move(a));
      } else {
        in_flight_.erase(a.request_id);
        FreeAllocations(a.allocation_ids);
      }
    }
    if (push.has_value() && ok && state_.TakesPushes() && !queue_->stopping &&
        std::none_of(outbox_.begin(), outbox_.end(), [](const Outgoing& o) { return o.push; })) {
      Outgoing out;
      out.push = true;
      bool own_buffer = false;
      grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::StreamReply>(*push, &out.bytes,
                                                                       &own_buffer);
      outbox_.push_back(std::move(out));
    }
    StartWriteIfIdle();
    MaybeRead();
  }

  void StartWriteIfIdle() {
    if (writing_ || outbox_.empty() || !state_.WritesAnswers() || queue_->stopping) return;
    writing_ = true;
    stream_.Write(outbox_.front().bytes, write_tag_.tag());
  }

  void OnWritten(bool ok) {
    writing_ = false;
    if (!ok) {  // the client is gone; what is left was never delivered
      ClientGone();
      return;
    }
    if (!outbox_.front().push) in_flight_.erase(outbox_.front().request_id);
    outbox_.pop_front();
    StartWriteIfIdle();
    MaybeRead();
  }

  // The client is gone: nothing more goes out, and its waiting requests
  // give up their places.
  void ClientGone() {
    state_.On(StreamEvent::kClientGone);
    CancelWaits();
  }

  // Ends the stream with `status` once the queued answers are written.
  void Fail(grpc::Status status) {
    final_status_ = std::move(status);
    state_.On(StreamEvent::kFault);
    CancelWaits();  // the stream ends once they are answered
  }

  // Finishes when nothing more will be read, nothing is owed and the
  // answers are written (or can no longer be).
  void MaybeFinish() {
    if (state_.Ending() || reading_ || writing_) return;
    if (queue_->stopping) {  // no new operation: the call just ends
      FreeUndelivered();
      state_.On(StreamEvent::kQueueStopped);
      return;
    }
    switch (state_.state()) {
      case StreamState::kHalfClosed:
      case StreamState::kFailing:
        if (!outbox_.empty() || owed_ > 0) return;
        break;
      case StreamState::kBroken:
        break;
      default:  // still reading
        return;
    }
    FreeUndelivered();
    state_.On(StreamEvent::kFinishStarted);
    stream_.Finish(final_status_, finish_tag_.tag());
  }

  void FreeUndelivered() {
    for (const Outgoing& out : outbox_) FreeAllocations(out.allocation_ids);
    outbox_.clear();
    in_flight_.clear();
  }

  // Frees what an answer that will never be delivered had allocated.
  void FreeAllocations(const std::vector<uint64_t>& ids) {
    for (uint64_t id : ids) {
      v1::FreeRequest free;
      free.set_id(id);
      owner_->broker_->Free(caller_, free).IgnoreError();
    }
  }

  // Constant after construction.
  StreamService* const owner_;
  EventQueue* const queue_;
  grpc::ServerCompletionQueue* const cq_;
  Tag accept_tag_{this, Completion::kAccepted};
  Tag read_tag_{this, Completion::kRead};
  Tag write_tag_{this, Completion::kWritten};
  Tag finish_tag_{this, Completion::kFinished};
  Tag done_tag_{this, Completion::kDone};
  Tag mail_tag_{this, Completion::kMail};

  // gRPC's, driven from the queue thread.
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  grpc::Alarm mail_alarm_;

  // The mailbox: what other threads hand to the queue thread.
  std::mutex mail_mu_;
  bool mail_wake_pending_ = false;           // guarded by mail_mu_: mail_alarm_ is set
  std::optional<v1::StreamReply> mail_push_;  // guarded by mail_mu_
  std::vector<Answered> mail_answers_;        // guarded by mail_mu_

  // Queue thread only.
  StreamStateMachine state_;
  bool reading_ = false;  // a Read is outstanding
  bool writing_ = false;  // a Write is outstanding
  bool done_ = false;     // the done event arrived
  int owed_ = 0;          // handed to a worker or admission, not yet in OnMail
  // The cancels of waiting wait_ms Allocates, by request id.
  absl::flat_hash_map<uint64_t, std::shared_ptr<WaitCancel>> waits_;
  PeerCred caller_;
  uint64_t session_id_ = 0;
  bool registered_ = false;  // in the owner's registry
  grpc::ByteBuffer incoming_;
  uint64_t messages_read_ = 0;
  std::deque<Outgoing> outbox_;
  absl::flat_hash_set<uint64_t> in_flight_;
  grpc::Status final_status_;  // OK unless Fail()
};

StreamService::StreamService(MemoryBroker* broker, const PeerTable* peers,
                             AsyncGpuMemory* service, WorkerPool* backend_workers,
                             CallObserver* observer, StreamServiceOptions options)
    : broker_(broker),
      peers_(peers),
      service_(service),
      dispatch_({broker, backend_workers, /*query_workers=*/nullptr, observer}),
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
