// See reflection_service.h. A Call lives from its accept to the end of its
// stream: accepted -> (uid over its limit: Finish RESOURCE_EXHAUSTED) ->
// read -> answer written -> read ... -> (client half-closes: Finish OK; no
// request for idle_timeout: Finish DEADLINE_EXCEEDED, or cancel if a write
// is stuck) -> the done event -> deleted once nothing of it is outstanding.
// Its events arrive on one queue drained by one thread, so a Call needs no
// lock; only the per-uid counts, shared by every queue, take mu_.
//
// Idle timing: one grpc::Alarm per stream, set for the idle deadline; when
// it fires before the deadline (a request came meanwhile) it is set again
// for the new one, so a busy stream costs no alarm per request.
#include "server/service/reflection_service.h"

#include <chrono>
#include <set>
#include <utility>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/alarm.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>

#include "absl/strings/str_cat.h"
#include "grpc/reflection/v1/reflection.pb.h"

namespace gpumem {

namespace {

using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
namespace pb = google::protobuf;

void SetError(ServerReflectionResponse* response, grpc::StatusCode code, std::string message) {
  response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response->mutable_error_response()->set_error_message(std::move(message));
}

// `file` and those of its transitive imports not in `sent` (the requested
// file always), each once, added to `response` and to `sent`.
void AddFiles(const pb::FileDescriptor* file, std::set<std::string>* sent,
              ServerReflectionResponse* response) {
  std::vector<const pb::FileDescriptor*> todo{file};
  sent->insert(file->name());
  while (!todo.empty()) {
    const pb::FileDescriptor* f = todo.back();
    todo.pop_back();
    pb::FileDescriptorProto proto;
    f->CopyTo(&proto);
    proto.SerializeToString(
        response->mutable_file_descriptor_response()->add_file_descriptor_proto());
    for (int i = 0; i < f->dependency_count(); ++i) {
      const pb::FileDescriptor* dep = f->dependency(i);
      if (sent->insert(dep->name()).second) todo.push_back(dep);
    }
  }
}

// The answer to `request`, as ProtoServerReflection's protocol says.
void Answer(const ServerReflectionRequest& request, const std::vector<std::string>& services,
            std::set<std::string>* sent, ServerReflectionResponse* response) {
  response->Clear();
  response->set_valid_host(request.host());
  *response->mutable_original_request() = request;
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services) {
        if (pool->FindServiceByName(name) == nullptr) continue;
        response->mutable_list_services_response()->add_service()->set_name(name);
      }
      // An empty list is still a list.
      response->mutable_list_services_response();
      return;
    case ServerReflectionRequest::kFileByFilename: {
      const pb::FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no file \"", request.file_by_filename(), "\" in this daemon"));
        return;
      }
      AddFiles(file, sent, response);
      return;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const pb::FileDescriptor* file =
          pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no symbol \"", request.file_containing_symbol(),
                              "\" in this daemon"));
        return;
      }
      AddFiles(file, sent, response);
      return;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      const pb::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no extension ", ext.extension_number(), " of \"",
                              ext.containing_type(), "\" in this daemon"));
        return;
      }
      AddFiles(field->file(), sent, response);
      return;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no message type \"", request.all_extension_numbers_of_type(),
                              "\" in this daemon"));
        return;
      }
      std::vector<const pb::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response->mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* e : extensions) numbers->add_extension_number(e->number());
      return;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      break;
  }
  SetError(response, grpc::StatusCode::INVALID_ARGUMENT,
           "a ServerReflectionRequest sets none of the requests this daemon answers "
           "(list_services, file_by_filename, file_containing_symbol, "
           "file_containing_extension, all_extension_numbers_of_type)");
}

}  // namespace

// One async bidi-streaming method, "/grpc.reflection.<version>.
// ServerReflection/ServerReflectionInfo"; both versions read and write v1's
// messages (the same wire format).
class ReflectionService::Method final : public grpc::Service {
 public:
  explicit Method(const char* name) {  // a literal: gRPC keeps the pointer
    AddMethod(new grpc::internal::RpcServiceMethod(
        name, grpc::internal::RpcMethod::BIDI_STREAMING, nullptr));
    MarkMethodAsync(0);
  }
  void Request(grpc::ServerContext* ctx,
               grpc::ServerAsyncReaderWriter<ServerReflectionResponse, ServerReflectionRequest>*
                   stream,
               grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncBidiStreaming(0, ctx, stream, cq, cq, tag);
  }
};

class ReflectionService::Call {
  enum class Event { kAccepted, kRead, kWritten, kIdle, kDone, kFinished };
  using Tag = CallTag<Call, Event>;
  friend Tag;

 public:
  Call(ReflectionService* service, Method* method, EventQueue* queue)
      : service_(service), method_(method), queue_(queue), stream_(&ctx_) {
    ctx_.AsyncNotifyWhenDone(done_tag_.tag());
    method_->Request(&ctx_, &stream_, queue_->cq.get(), accept_tag_.tag());
  }
  ~Call() {
    if (counted_) service_->Release(uid_);
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
        new Call(service_, method_, queue_);
        Begin();
        break;
      case Event::kRead:
        reading_ = false;
        if (!ok) {  // half-closed, cancelled or ended
          client_done_ = true;
          break;
        }
        last_request_ = absl::Now();
        if (queue_->stopping || finish_called_) break;
        Answer(request_, service_->services_, &sent_files_, &response_);
        writing_ = true;
        stream_.Write(response_, write_tag_.tag());
        break;
      case Event::kWritten:
        writing_ = false;
        if (!ok) {
          client_done_ = true;
          break;
        }
        if (queue_->stopping || finish_called_ || done_) break;
        reading_ = true;
        stream_.Read(&request_, read_tag_.tag());
        break;
      case Event::kIdle:
        alarm_set_ = false;
        if (!ok || queue_->stopping || finish_called_ || done_) break;
        if (absl::Now() - last_request_ < service_->limits_.idle_timeout) {
          ArmIdle();
          break;
        }
        end_ = grpc::Status(
            grpc::StatusCode::DEADLINE_EXCEEDED,
            absl::StrCat("reflection stream sent no request for ",
                         absl::FormatDuration(service_->limits_.idle_timeout),
                         ", the most this daemon keeps one open idle (fixed)"));
        if (writing_) {
          ctx_.TryCancel();  // its client reads nothing: no Finish beside the write
        } else {
          StartFinish();  // ends the pending read too
        }
        break;
      case Event::kDone:
        done_ = true;
        if (alarm_set_) alarm_->Cancel();  // its event comes back, not ok
        break;
      case Event::kFinished:
        finish_pending_ = false;
        break;
    }
    if ((client_done_ || done_) && !writing_ && !finish_called_ && !queue_->stopping) {
      StartFinish();
    }
    if (done_ && !reading_ && !writing_ && !alarm_set_ && !finish_pending_) delete this;
  }

  // Just accepted: who, whether one more of theirs may be open, then the
  // first read and the idle alarm.
  void Begin() {
    absl::StatusOr<PeerCred> caller = service_->peers_->Lookup(ctx_.peer());
    if (!caller.ok()) {
      end_ = grpc::Status(static_cast<grpc::StatusCode>(caller.status().code()),
                          std::string(caller.status().message()));
      StartFinish();
      return;
    }
    uid_ = caller->uid;
    if (!service_->Admit(uid_)) {
      end_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("uid ", uid_, " already has ", service_->limits_.max_streams_per_uid,
                       " reflection streams open, the most one uid may "
                       "(--max_reflection_streams_per_uid; a stream idle for ",
                       absl::FormatDuration(service_->limits_.idle_timeout),
                       " is closed)"));
      StartFinish();
      return;
    }
    counted_ = true;
    last_request_ = absl::Now();
    ArmIdle();
    reading_ = true;
    stream_.Read(&request_, read_tag_.tag());
  }

  void ArmIdle() {
    const absl::Time deadline = last_request_ + service_->limits_.idle_timeout;
    if (alarm_ == nullptr) alarm_ = std::make_unique<grpc::Alarm>();
    alarm_set_ = true;
    alarm_->Set(queue_->cq.get(), absl::ToChronoTime(deadline), idle_tag_.tag());
  }

  void StartFinish() {
    finish_called_ = true;
    finish_pending_ = true;
    stream_.Finish(end_, finish_tag_.tag());
  }

  ReflectionService* const service_;
  Method* const method_;
  EventQueue* const queue_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<ServerReflectionResponse, ServerReflectionRequest> stream_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
  std::set<std::string> sent_files_;  // at most every file of the pool
  std::unique_ptr<grpc::Alarm> alarm_;  // made once the stream is admitted
  Tag accept_tag_{this, Event::kAccepted};
  Tag read_tag_{this, Event::kRead};
  Tag write_tag_{this, Event::kWritten};
  Tag idle_tag_{this, Event::kIdle};
  Tag done_tag_{this, Event::kDone};
  Tag finish_tag_{this, Event::kFinished};
  grpc::Status end_ = grpc::Status::OK;
  absl::Time last_request_;
  uid_t uid_ = 0;
  bool counted_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool alarm_set_ = false;
  bool client_done_ = false;
  bool done_ = false;
  bool finish_called_ = false;
  bool finish_pending_ = false;
};

ReflectionService::ReflectionService(const PeerTable* peers, std::vector<std::string> services,
                                     ReflectionLimits limits)
    : peers_(peers),
      services_(std::move(services)),
      limits_(limits),
      v1_(std::make_unique<Method>("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")),
      v1alpha_(std::make_unique<Method>(
          "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")) {}

ReflectionService::~ReflectionService() = default;

void ReflectionService::AddTo(grpc::ServerBuilder* builder) {
  builder->RegisterService(v1_.get());
  builder->RegisterService(v1alpha_.get());
}

void ReflectionService::Start(const std::vector<EventQueue*>& queues) {
  for (EventQueue* queue : queues) {
    new Call(this, v1_.get(), queue);
    new Call(this, v1alpha_.get(), queue);
  }
}

bool ReflectionService::Admit(uid_t uid) {
  absl::MutexLock lock(&mu_);
  int& open = open_[uid];
  if (open >= limits_.max_streams_per_uid) {
    if (open == 0) open_.erase(uid);
    return false;
  }
  ++open;
  return true;
}

void ReflectionService::Release(uid_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(uid);
  if (it != open_.end() && --it->second == 0) open_.erase(it);
}

}  // namespace gpumem
