// See floor_server.h.
#include "tests/bench/floor_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/server_posix.h>

#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace bench {
namespace {

// What the daemon answers for a 64 KiB block on device 0, field by field.
v1::Allocation CannedAllocation() {
  v1::Allocation a;
  a.set_id(123456);
  a.set_device_index(0);
  a.set_device_uuid("GPU-5f1c0c2e-7a1b-4e0e-9f3e-000000000000");
  a.set_slab_id(42);
  a.set_slab_size_bytes(256ull << 20);
  a.set_offset(1ull << 20);
  a.set_size_bytes(64 << 10);
  a.set_handle_kind(v1::HANDLE_KIND_POSIX_FD);
  return a;
}

v1::Session CannedSession() {
  v1::Session s;
  s.set_session_id(7);
  s.set_pid(getpid());
  s.set_uid(getuid());
  s.set_gid(getgid());
  return s;
}

using FloorBase = v1::GpuMemory::WithRawMethod_Stream<v1::GpuMemory::Service>;
using AsyncUnaryBase = v1::GpuMemory::WithAsyncMethod_Allocate<
    v1::GpuMemory::WithAsyncMethod_Free<FloorBase>>;

// What a completion-queue tag points to.
class FloorEvent {
 public:
  virtual void OnEvent(bool ok) = 0;

 protected:
  ~FloorEvent() = default;
};

// The canned answers, in the daemon's shapes.
class FloorAnswers {
 public:
  void AnswerAllocate(v1::AllocateResponse* resp) const {
    *resp->add_allocations() = allocation_;
  }
  void AnswerFree(v1::FreeResponse* resp) const { resp->set_freed_bytes(64 << 10); }

  const v1::Session& session() const { return session_; }

  // The StreamAnswer for `request`, as the daemon would shape it.
  v1::StreamReply Answer(const v1::StreamRequest& request) const {
    v1::StreamReply reply;
    v1::StreamAnswer* a = reply.mutable_answer();
    a->set_request_id(request.request_id());
    switch (request.request_case()) {
      case v1::StreamRequest::kAllocate:
        *a->mutable_allocate()->add_allocations() = allocation_;
        break;
      case v1::StreamRequest::kFree:
        a->mutable_free()->set_freed_bytes(64 << 10);
        break;
      default:
        *a->mutable_session() = session_;
        break;
    }
    return reply;
  }

 private:
  const v1::Allocation allocation_ = CannedAllocation();
  const v1::Session session_ = CannedSession();
};

// Unary methods synchronous (gRPC's thread pool), as gpumemd serves them.
class SyncFloor final : public FloorBase, public FloorAnswers {
 public:
  grpc::Status Allocate(grpc::ServerContext*, const v1::AllocateRequest*,
                        v1::AllocateResponse* resp) override {
    AnswerAllocate(resp);
    return grpc::Status::OK;
  }
  grpc::Status Free(grpc::ServerContext*, const v1::FreeRequest*,
                    v1::FreeResponse* resp) override {
    AnswerFree(resp);
    return grpc::Status::OK;
  }
  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest*,
                          v1::Session* resp) override {
    *resp = session();
    return grpc::Status::OK;
  }
};

// Allocate and Free from the completion queue (the stream's thread).
class AsyncFloor final : public AsyncUnaryBase, public FloorAnswers {
 public:
  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest*,
                          v1::Session* resp) override {
    *resp = session();
    return grpc::Status::OK;
  }
};

// One async unary call of AsyncFloor: accepted -> answered -> deleted.
template <typename Request, typename Response>
class UnaryCall final : public FloorEvent {
 public:
  using Post = void (AsyncFloor::*)(grpc::ServerContext*, Request*,
                                    grpc::ServerAsyncResponseWriter<Response>*,
                                    grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                    void*);
  using Fill = void (FloorAnswers::*)(Response*) const;

  UnaryCall(AsyncFloor* service, grpc::ServerCompletionQueue* cq, Post post, Fill fill)
      : service_(service), cq_(cq), post_(post), fill_(fill), responder_(&ctx_) {
    (service_->*post_)(&ctx_, &request_, &responder_, cq_, cq_,
                       static_cast<FloorEvent*>(this));
  }

  void OnEvent(bool ok) override {
    if (!ok || answered_) {
      delete this;
      return;
    }
    new UnaryCall(service_, cq_, post_, fill_);
    Response response;
    (service_->*fill_)(&response);
    answered_ = true;
    responder_.Finish(response, grpc::Status::OK, static_cast<FloorEvent*>(this));
  }

 private:
  AsyncFloor* service_;
  grpc::ServerCompletionQueue* cq_;
  Post post_;
  Fill fill_;
  grpc::ServerContext ctx_;
  Request request_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  bool answered_ = false;
};

// One stream: read, answer, write, read again; finish when reads end.
class PingPongCall final : public FloorEvent {
 public:
  PingPongCall(FloorBase* service, const FloorAnswers* answers,
               grpc::ServerCompletionQueue* cq)
      : service_(service), answers_(answers), cq_(cq), stream_(&ctx_) {
    service_->RequestStream(&ctx_, &stream_, cq_, cq_, static_cast<FloorEvent*>(this));
  }

  void OnEvent(bool ok) override {
    switch (state_) {
      case State::kAccepting:
        if (!ok) {
          delete this;
          return;
        }
        new PingPongCall(service_, answers_, cq_);
        Read();
        return;
      case State::kReading:
        if (!ok) {
          state_ = State::kFinishing;
          stream_.Finish(grpc::Status::OK, static_cast<FloorEvent*>(this));
          return;
        }
        {
          v1::StreamRequest request;
          grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::StreamRequest>(
              &incoming_, &request)
              .IgnoreError();
          bool own = false;
          outgoing_.Clear();
          grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::StreamReply>(
              answers_->Answer(request), &outgoing_, &own)
              .IgnoreError();
        }
        state_ = State::kWriting;
        stream_.Write(outgoing_, static_cast<FloorEvent*>(this));
        return;
      case State::kWriting:
        if (!ok) {
          state_ = State::kFinishing;
          stream_.Finish(grpc::Status::OK, static_cast<FloorEvent*>(this));
          return;
        }
        Read();
        return;
      case State::kFinishing:
        delete this;
        return;
    }
  }

 private:
  enum class State { kAccepting, kReading, kWriting, kFinishing };
  void Read() {
    state_ = State::kReading;
    stream_.Read(&incoming_, static_cast<FloorEvent*>(this));
  }

  FloorBase* service_;
  const FloorAnswers* answers_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  grpc::ByteBuffer incoming_, outgoing_;
  State state_ = State::kAccepting;
};

int Listen(const std::string& path) {
  unlink(path.c_str());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 128) != 0) {
    perror("floor: listen");
    return -1;
  }
  return fd;
}

}  // namespace

int RunFloorServer(const std::string& socket_path, FloorAccept accept, FloorUnary unary) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  SyncFloor sync_floor;
  AsyncFloor async_floor;
  grpc::ServerBuilder builder;
  if (accept == FloorAccept::kGrpcPort) {
    unlink(socket_path.c_str());
    builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  }
  FloorBase* service = &sync_floor;
  const FloorAnswers* answers = &sync_floor;
  if (unary == FloorUnary::kAsync) {
    service = &async_floor;
    answers = &async_floor;
  }
  builder.RegisterService(service);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return 1;
  new PingPongCall(service, answers, cq.get());
  if (unary == FloorUnary::kAsync) {
    new UnaryCall<v1::AllocateRequest, v1::AllocateResponse>(
        &async_floor, cq.get(), &AsyncFloor::RequestAllocate, &FloorAnswers::AnswerAllocate);
    new UnaryCall<v1::FreeRequest, v1::FreeResponse>(
        &async_floor, cq.get(), &AsyncFloor::RequestFree, &FloorAnswers::AnswerFree);
  }
  std::thread stream_thread([&cq] {
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) static_cast<FloorEvent*>(tag)->OnEvent(ok);
  });

  int listen_fd = -1;
  std::thread accept_thread;
  if (accept == FloorAccept::kOwnAccept) {
    listen_fd = Listen(socket_path);
    if (listen_fd < 0) return 1;
    accept_thread = std::thread([&server, listen_fd] {
      for (;;) {
        int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          return;  // closed by shutdown
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        grpc::AddInsecureChannelFromFd(server.get(), fd);
      }
    });
  }
  printf("ready\n");
  fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  if (listen_fd >= 0) {
    shutdown(listen_fd, SHUT_RDWR);
    close(listen_fd);
    accept_thread.join();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  cq->Shutdown();
  stream_thread.join();
  unlink(socket_path.c_str());
  return 0;
}

}  // namespace bench
}  // namespace gpumem
