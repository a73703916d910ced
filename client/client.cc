// Status mapping: gRPC codes and absl codes are the same numbers, so a
// daemon's answer reaches the caller with its code and message unchanged.
#include "client/client.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/slab_mapper.h"
#include "client/stream_transport.h"
#include "common/fd_channel.h"
#include "common/grpc_status.h"
#include "common/refusal_payload.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace client {
namespace {

struct MappedSlab {
  // Shared so copies run outside the client's lock.
  std::shared_ptr<OpenedSlab> slab;
  uint64_t refs = 0;
};

}  // namespace

std::optional<v1::PlacementRefusal> PlacementRefusalOf(const absl::Status& status) {
  return RefusalFromStatus(status);
}

std::string DefaultSocketPath() {
  const char* env = std::getenv("GPUMEMD_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return "/run/gpumemd/gpumemd.sock";
}

struct Client::Impl {
  std::string socket_path;
  std::unique_ptr<v1::GpuMemory::Stub> stub;
  // The hot path; the unary stub serves a daemon without the stream.
  std::unique_ptr<StreamTransport> stream;
  // Set when the daemon cannot see this process's pid (another pid
  // namespace): the session bound to our slab channel, sent with each call.
  std::string session_token;

  void Prepare(grpc::ClientContext* ctx) const {
    if (!session_token.empty()) ctx->AddMetadata(kSessionTokenHeader, session_token);
  }
  absl::Mutex mu;
  int channel_fd ABSL_GUARDED_BY(mu) = -1;
  absl::flat_hash_map<uint64_t, MappedSlab> slabs ABSL_GUARDED_BY(mu);
  // Slabs of abandoned Buffers: memory given back, addresses kept reserved
  // until this Client goes (OpenedSlab::Retire).
  std::vector<std::shared_ptr<OpenedSlab>> retired ABSL_GUARDED_BY(mu);
  // One mapper per handle kind, made on first use.
  absl::flat_hash_map<int, std::unique_ptr<SlabMapper>> mappers ABSL_GUARDED_BY(mu);
  v1::HandleKind handle_kind ABSL_GUARDED_BY(mu) = v1::HANDLE_KIND_UNSPECIFIED;
  std::optional<v1::UsageReport> usage ABSL_GUARDED_BY(mu);
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  absl::MutexLock lock(&impl_->mu);
  impl_->slabs.clear();  // closes every opened slab
  impl_->retired.clear();
  if (impl_->channel_fd >= 0) close(impl_->channel_fd);
}

const std::string& Client::socket_path() const { return impl_->socket_path; }

void Client::SetHandleKind(v1::HandleKind kind) {
  absl::MutexLock lock(&impl_->mu);
  impl_->handle_kind = kind;
}

void Client::OnReclaimRequest(
    std::function<void(const v1::ReclaimRequest&)> on_reclaim) {
  impl_->stream->StartPushReader(
      [on_reclaim = std::move(on_reclaim)](const v1::StreamReply& push) {
        if (push.has_reclaim()) on_reclaim(push.reclaim());
      });
}

absl::Status Client::ReportReclaimed(uint64_t freed_bytes) {
  return impl_->stream->Reclaimed(freed_bytes);
}

void Client::SetUsageReport(const v1::UsageReport& usage) {
  absl::MutexLock lock(&impl_->mu);
  impl_->usage = usage;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(std::string socket_path) {
  if (socket_path.empty()) socket_path = DefaultSocketPath();
  auto impl = std::make_unique<Impl>();
  impl->socket_path = socket_path;
  // The slab channel first: it fails fast with a clear message when nobody
  // is listening, and its hello tells whether this process needs a
  // connection-bound session (then the channel is its lifeline).
  absl::StatusOr<int> channel_fd = ConnectFdChannel(socket_path);
  if (!channel_fd.ok()) return channel_fd.status();
  absl::StatusOr<std::string> token = HelloFdChannel(*channel_fd);
  if (!token.ok()) {
    close(*channel_fd);
    return token.status();
  }
  impl->session_token = *token;
  impl->channel_fd = *channel_fd;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // A channel of its own: a Client made after a daemon restart must not
  // share the old Client's (dead) connection from gRPC's global pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(
      "unix:" + socket_path, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::GpuMemory::NewStub(channel);
  impl->stream = std::make_unique<StreamTransport>(impl->stub.get(), impl->session_token);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<v1::AllocateResponse> Client::AllocateRaw(
    const v1::AllocateRequest& request) {
  // A request that may wait goes unary: the daemon serves waiting only
  // there (a waiting request would hold up its stream's queue).
  if (request.wait_ms() == 0) {
    absl::StatusOr<v1::AllocateResponse> streamed = impl_->stream->Allocate(request);
    if (!impl_->stream->unsupported()) return streamed;
  }
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::AllocateResponse response;
  absl::Status s = FromGrpcStatus(impl_->stub->Allocate(&ctx, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::Status Client::Free(uint64_t allocation_id) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::FreeRequest req;
  req.set_id(allocation_id);
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->usage.has_value()) *req.mutable_usage() = *impl_->usage;
  }
  absl::StatusOr<v1::FreeResponse> streamed = impl_->stream->Free(req);
  if (!impl_->stream->unsupported()) return streamed.status();
  v1::FreeResponse resp;
  return FromGrpcStatus(impl_->stub->Free(&ctx, req, &resp));
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(bool include_slabs) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::GetStatsRequest req;
  req.set_include_slabs(include_slabs);
  v1::GetStatsResponse resp;
  absl::Status s = FromGrpcStatus(impl_->stub->GetStats(&ctx, req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Session> Client::GetSession() {
  absl::StatusOr<v1::Session> streamed = impl_->stream->GetSession();
  if (!impl_->stream->unsupported()) return streamed;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::Session resp;
  absl::Status s =
      FromGrpcStatus(impl_->stub->GetSession(&ctx, v1::GetSessionRequest(), &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::GetUsageResponse> Client::GetUsage() {
  grpc::ClientContext ctx;
  v1::GetUsageResponse resp;
  absl::Status s = FromGrpcStatus(impl_->stub->GetUsage(&ctx, v1::GetUsageRequest(), &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::GetLedgerResponse> Client::GetLedger(const v1::GetLedgerRequest& request) {
  grpc::ClientContext ctx;
  v1::GetLedgerResponse resp;
  absl::Status s = FromGrpcStatus(impl_->stub->GetLedger(&ctx, request, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::SetQuotaResponse> Client::SetQuota(const v1::SetQuotaRequest& request) {
  grpc::ClientContext ctx;
  v1::SetQuotaResponse resp;
  absl::Status s = FromGrpcStatus(impl_->stub->SetQuota(&ctx, request, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<void*> Client::MapBlock(const v1::Allocation& a) {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->slabs.find(a.slab_id());
  if (it == impl_->slabs.end()) {
    auto m = impl_->mappers.find(a.handle_kind());
    if (m == impl_->mappers.end()) {
      absl::StatusOr<std::unique_ptr<SlabMapper>> made = NewSlabMapper(a.handle_kind());
      if (!made.ok()) return made.status();
      m = impl_->mappers.emplace(a.handle_kind(), *std::move(made)).first;
    }
    Impl* impl = impl_.get();
    // Called by fd kinds only, under impl->mu (held by this function).
    auto fetch_fd = [impl, &a]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<SlabFd> {
      if (impl->channel_fd < 0) {
        absl::StatusOr<int> fd = ConnectFdChannel(impl->socket_path);
        if (!fd.ok()) return fd.status();
        impl->channel_fd = *fd;
      }
      absl::StatusOr<SlabFd> slab = RequestSlabFd(impl->channel_fd, a.slab_id());
      if (!slab.ok() && slab.status().code() == absl::StatusCode::kUnavailable) {
        close(impl->channel_fd);
        impl->channel_fd = -1;
      }
      return slab;
    };
    absl::StatusOr<std::unique_ptr<OpenedSlab>> opened = m->second->Open(a, fetch_fd);
    if (!opened.ok()) return opened.status();
    it = impl_->slabs.emplace(a.slab_id(), MappedSlab{*std::move(opened), 0}).first;
  }
  const uint64_t size = it->second.slab->size();
  if (a.offset() > size || a.size_bytes() > size - a.offset()) {
    return absl::InternalError("block lies outside its slab");
  }
  ++it->second.refs;
  return it->second.slab->base() + a.offset();
}

void Client::UnmapBlock(const v1::Allocation& a, bool retire) {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->slabs.find(a.slab_id());
  if (it == impl_->slabs.end()) return;
  if (--it->second.refs == 0 && retire) {
    // The daemon that lent it is gone: nobody to tell; keep the addresses.
    it->second.slab->Retire();
    impl_->retired.push_back(std::move(it->second.slab));
    impl_->slabs.erase(it);
    return;
  }
  if (it->second.refs == 0) {
    impl_->slabs.erase(it);  // closes the slab
    // Legacy IPC handles came with the allocation, not over the channel:
    // open it now to say the slab is closed.
    if (impl_->channel_fd < 0 && a.handle_kind() == v1::HANDLE_KIND_CUDA_IPC) {
      absl::StatusOr<int> fd = ConnectFdChannel(impl_->socket_path);
      if (fd.ok()) impl_->channel_fd = *fd;
    }
    // Tell the daemon, so a released slab is not kept retained for us.
    if (impl_->channel_fd >= 0 &&
        CloseSlabFd(impl_->channel_fd, a.slab_id()).code() == absl::StatusCode::kUnavailable) {
      close(impl_->channel_fd);
      impl_->channel_fd = -1;
    }
  }
}

absl::Status Client::CopyBlock(const v1::Allocation& a, uint64_t offset, const void* src,
                               void* dst, uint64_t n) {
  if (offset > a.size_bytes() || n > a.size_bytes() - offset) {
    return absl::OutOfRangeError(absl::StrCat("[", offset, ", +", n, ") is outside the ",
                                              a.size_bytes(), "-byte buffer"));
  }
  std::shared_ptr<OpenedSlab> slab;
  {
    absl::MutexLock lock(&impl_->mu);
    auto it = impl_->slabs.find(a.slab_id());
    if (it == impl_->slabs.end()) return absl::FailedPreconditionError("buffer is not mapped");
    slab = it->second.slab;
  }
  return src != nullptr ? slab->Write(a.offset() + offset, src, n)
                        : slab->Read(a.offset() + offset, dst, n);
}

absl::StatusOr<Buffer> Client::Allocate(uint64_t size,
                                        const v1::PlacementRequest& placement,
                                        uint64_t alignment) {
  v1::AllocateRequest req;
  req.set_size_bytes(size);
  *req.mutable_placement() = placement;
  req.set_alignment(alignment);
  {
    absl::MutexLock lock(&impl_->mu);
    req.set_handle_kind(impl_->handle_kind);
    if (impl_->usage.has_value()) *req.mutable_usage() = *impl_->usage;
  }
  absl::StatusOr<v1::AllocateResponse> resp = AllocateRaw(req);
  if (!resp.ok()) return resp.status();
  if (resp->allocations_size() != 1) {
    return absl::InternalError("daemon returned no allocation");
  }
  const v1::Allocation& a = resp->allocations(0);
  absl::StatusOr<void*> data = MapBlock(a);
  if (!data.ok()) {
    Free(a.id()).IgnoreError();
    return data.status();
  }
  return Buffer(this, a, *data);
}

absl::StatusOr<std::vector<Buffer>> Client::AllocateSharded(
    uint64_t total_size, uint32_t shards, const v1::PlacementRequest& placement) {
  v1::AllocateRequest req;
  req.set_size_bytes(total_size);
  req.set_shard_count(shards);
  *req.mutable_placement() = placement;
  {
    absl::MutexLock lock(&impl_->mu);
    req.set_handle_kind(impl_->handle_kind);
    if (impl_->usage.has_value()) *req.mutable_usage() = *impl_->usage;
  }
  absl::StatusOr<v1::AllocateResponse> resp = AllocateRaw(req);
  if (!resp.ok()) return resp.status();
  std::vector<Buffer> out;
  for (const v1::Allocation& a : resp->allocations()) {
    absl::StatusOr<void*> data = MapBlock(a);
    if (!data.ok()) {
      for (int i = static_cast<int>(out.size()); i < resp->allocations_size(); ++i) {
        Free(resp->allocations(i).id()).IgnoreError();
      }
      return data.status();  // `out` frees the mapped ones
    }
    out.push_back(Buffer(this, a, *data));
  }
  return out;
}

Buffer::Buffer(Buffer&& other) noexcept
    : client_(other.client_), info_(std::move(other.info_)), data_(other.data_) {
  other.client_ = nullptr;
  other.data_ = nullptr;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    client_ = other.client_;
    info_ = std::move(other.info_);
    data_ = other.data_;
    other.client_ = nullptr;
    other.data_ = nullptr;
  }
  return *this;
}

Buffer::~Buffer() { Reset(); }

void Buffer::Reset() {
  if (client_ == nullptr) return;
  Free().IgnoreError();
}

absl::Status Buffer::Write(uint64_t offset, const void* src, uint64_t n) const {
  if (client_ == nullptr) return absl::FailedPreconditionError("empty Buffer");
  if (src == nullptr) return absl::InvalidArgumentError("null source");
  return client_->CopyBlock(info_, offset, src, nullptr, n);
}

absl::Status Buffer::Read(uint64_t offset, void* dst, uint64_t n) const {
  if (client_ == nullptr) return absl::FailedPreconditionError("empty Buffer");
  if (dst == nullptr) return absl::InvalidArgumentError("null destination");
  return client_->CopyBlock(info_, offset, nullptr, dst, n);
}

absl::Status Buffer::Free() {
  if (client_ == nullptr) return absl::FailedPreconditionError("empty Buffer");
  Client* c = client_;
  client_ = nullptr;
  c->UnmapBlock(info_, /*retire=*/false);
  data_ = nullptr;
  return c->Free(info_.id());
}

void Buffer::Abandon() {
  if (client_ == nullptr) return;
  client_->UnmapBlock(info_, /*retire=*/true);
  client_ = nullptr;
  data_ = nullptr;
}

}  // namespace client
}  // namespace gpumem
