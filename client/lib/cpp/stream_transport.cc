// See stream_transport.h.
//
// Invariants: waiting_ holds exactly the calls that sent (or are sending) a
// request and have no answer yet, each tagged with the Open it went on. At
// most one thread reads a given Open at a time (Open::reader_busy). When an
// Open ends, every call waiting on it is failed and open_ no longer points
// to it, both under mu_, so no call can register on an ended stream.
#include "client/lib/cpp/stream_transport.h"

#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/rpc_status.h"

namespace gpumem {
namespace client {

struct StreamTransport::Open {
  grpc::ClientContext ctx;  // declared first: outlives `stream`
  std::unique_ptr<grpc::ClientReaderWriterInterface<v1::StreamRequest, v1::StreamReply>>
      stream;
  std::mutex write_mu;  // one Write (or the final Finish) at a time
  // Guarded by the transport's mu_:
  bool reader_busy = false;
  bool ended = false;
};

struct StreamTransport::Waiter {
  std::shared_ptr<Open> open;
  bool done = false;
  absl::Status status;  // of the transport; the request's own is in `answer`
  v1::StreamAnswer answer;
};

StreamTransport::~StreamTransport() {
  if (reader_.joinable()) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_reader_ = true;
      // Ends a Read the reader is blocked in; the stream is over anyway.
      if (open_ != nullptr) open_->ctx.TryCancel();
      answered_.notify_all();
    }
    reader_.join();
  }
  std::shared_ptr<Open> open;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (open_ == nullptr || open_->ended) return;
    open = std::move(open_);
  }
  // No call is in flight (destroying a transport in use is a caller's bug);
  // cancelling ends the daemon's side at once, whatever its state.
  open->ctx.TryCancel();
  v1::StreamReply ignored;
  while (open->stream->Read(&ignored)) {
  }
  std::lock_guard<std::mutex> lock(open->write_mu);
  open->stream->Finish().IgnoreError();
}

absl::StatusOr<v1::StreamAnswer> StreamTransport::Call(v1::StreamRequest request) {
  Waiter me;
  uint64_t id = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (unsupported()) {
      return absl::UnimplementedError("gpumemd does not serve GpuMemory.Stream");
    }
    if (open_ == nullptr) {
      open_ = std::make_shared<Open>();
      if (!session_token_.empty()) {
        open_->ctx.AddMetadata(kSessionTokenHeader, session_token_);
      }
      open_->stream = stub_->Stream(&open_->ctx);
      answered_.notify_all();  // the push reader may start reading it
    }
    me.open = open_;
    id = next_id_++;
    waiting_[id] = &me;
  }
  request.set_request_id(id);
  {
    // A failed write needs no handling here: the stream has ended, and the
    // read below learns why.
    std::lock_guard<std::mutex> lock(me.open->write_mu);
    me.open->stream->Write(request);
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!me.done) {
    if (!me.open->reader_busy) {
      me.open->reader_busy = true;
      lock.unlock();
      ReadOne(me.open);
      lock.lock();
    } else {
      answered_.wait(lock);
    }
  }
  if (!me.status.ok()) return me.status;
  return std::move(me.answer);
}

void StreamTransport::ReadOne(const std::shared_ptr<Open>& open) {
  v1::StreamReply reply;
  if (open->stream->Read(&reply)) {
    std::unique_lock<std::mutex> lock(mu_);
    open->reader_busy = false;
    // Daemon-initiated messages go to the push reader (dropped without
    // one, or when a few already wait); an answer to no waiting call is
    // skipped.
    if (!reply.has_answer() && reply.kind_case() != v1::StreamReply::KIND_NOT_SET) {
      if (push_handler_ && pushes_.size() < 4) pushes_.push_back(std::move(reply));
    } else if (reply.has_answer()) {
      auto it = waiting_.find(reply.answer().request_id());
      if (it != waiting_.end() && it->second->open == open) {
        it->second->answer = std::move(*reply.mutable_answer());
        it->second->done = true;
        waiting_.erase(it);
      }
    }
    answered_.notify_all();
    return;
  }
  grpc::Status end;
  {
    std::lock_guard<std::mutex> lock(open->write_mu);
    end = open->stream->Finish();
  }
  absl::Status failure;
  if (end.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    unsupported_.store(true, std::memory_order_release);
    failure = absl::UnimplementedError(absl::StrCat(
        "gpumemd does not serve GpuMemory.Stream: ", end.error_message()));
  } else {
    failure = absl::UnavailableError(absl::StrCat(
        "the stream to gpumemd ended (gRPC code ", end.error_code(), ": ",
        end.error_message(), "); the request may or may not have been carried out"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  open->reader_busy = false;
  open->ended = true;
  if (open_ == open) open_.reset();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto here = it++;
    if (here->second->open == open) {
      here->second->status = failure;
      here->second->done = true;
      waiting_.erase(here);
    }
  }
  answered_.notify_all();
}

void StreamTransport::StartPushReader(PushHandler handler) {
  std::unique_lock<std::mutex> lock(mu_);
  if (push_handler_) return;
  push_handler_ = std::move(handler);
  reader_ = std::thread([this] { PushReaderLoop(); });
}

void StreamTransport::PushReaderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_reader_) {
    if (!pushes_.empty()) {
      v1::StreamReply push = std::move(pushes_.front());
      pushes_.pop_front();
      lock.unlock();
      push_handler_(push);
      lock.lock();
    } else if (open_ != nullptr && !open_->ended && !open_->reader_busy) {
      std::shared_ptr<Open> open = open_;
      open->reader_busy = true;
      lock.unlock();
      ReadOne(open);
      lock.lock();
    } else {
      answered_.wait(lock);
    }
  }
}

namespace {

// The request's own status, or `missing` when the answer lacks its result.
absl::Status RequestStatus(const v1::StreamAnswer& answer, bool has_result,
                           const char* what) {
  if (answer.has_status() && answer.status().code() != 0) {
    return FromRpcStatus(answer.status());
  }
  if (!has_result) {
    return absl::InternalError(absl::StrCat(
        "gpumemd answered ", what, " on the stream without a result"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::AllocateResponse> StreamTransport::Allocate(
    const v1::AllocateRequest& request) {
  v1::StreamRequest r;
  *r.mutable_allocate() = request;
  absl::StatusOr<v1::StreamAnswer> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  absl::Status s = RequestStatus(*a, a->has_allocate(), "Allocate");
  if (!s.ok()) return s;
  return std::move(*a->mutable_allocate());
}

absl::StatusOr<v1::FreeResponse> StreamTransport::Free(const v1::FreeRequest& request) {
  v1::StreamRequest r;
  *r.mutable_free() = request;
  absl::StatusOr<v1::StreamAnswer> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  absl::Status s = RequestStatus(*a, a->has_free(), "Free");
  if (!s.ok()) return s;
  return std::move(*a->mutable_free());
}

absl::Status StreamTransport::Reclaimed(uint64_t freed_bytes) {
  v1::StreamRequest r;
  r.mutable_reclaimed()->set_freed_bytes(freed_bytes);
  absl::StatusOr<v1::StreamAnswer> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  return RequestStatus(*a, /*has_result=*/true, "reclaimed");
}

absl::StatusOr<v1::Session> StreamTransport::GetSession() {
  v1::StreamRequest r;
  r.mutable_get_session();
  absl::StatusOr<v1::StreamAnswer> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  absl::Status s = RequestStatus(*a, a->has_session(), "GetSession");
  if (!s.ok()) return s;
  return std::move(*a->mutable_session());
}

}  // namespace client
}  // namespace gpumem
