// Status mapping: gRPC codes and absl codes are the same numbers, so a
// daemon's answer reaches the caller with its code and message unchanged.
#include "client/client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fd_channel.h"
#include "common/refusal_payload.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace {

// Keeps the code and message; a PlacementRefusal in the binary error details
// becomes a payload (see PlacementRefusalOf).
absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  v1::RpcStatus details;
  if (!s.error_details().empty() && details.ParseFromString(s.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      if (any.Is<v1::PlacementRefusal>()) {
        out.SetPayload(kPlacementRefusalTypeUrl, absl::Cord(any.value()));
      }
    }
  }
  return out;
}

struct MappedSlab {
  char* base = nullptr;
  uint64_t size = 0;
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
  // Set when the daemon cannot see this process's pid (another pid
  // namespace): the session bound to our slab channel, sent with each call.
  std::string session_token;

  void Prepare(grpc::ClientContext* ctx) const {
    if (!session_token.empty()) ctx->AddMetadata(kSessionTokenHeader, session_token);
  }
  absl::Mutex mu;
  int channel_fd ABSL_GUARDED_BY(mu) = -1;
  absl::flat_hash_map<uint64_t, MappedSlab> slabs ABSL_GUARDED_BY(mu);
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  absl::MutexLock lock(&impl_->mu);
  for (auto& [id, m] : impl_->slabs) munmap(m.base, m.size);
  if (impl_->channel_fd >= 0) close(impl_->channel_fd);
}

const std::string& Client::socket_path() const { return impl_->socket_path; }

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
  auto channel = grpc::CreateCustomChannel(
      "unix:" + socket_path, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::GpuMemory::NewStub(channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<v1::AllocateResponse> Client::AllocateRaw(
    const v1::AllocateRequest& request) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::AllocateResponse response;
  absl::Status s = FromGrpc(impl_->stub->Allocate(&ctx, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::Status Client::Free(uint64_t allocation_id) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::FreeRequest req;
  req.set_id(allocation_id);
  v1::FreeResponse resp;
  return FromGrpc(impl_->stub->Free(&ctx, req, &resp));
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(bool include_slabs) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::GetStatsRequest req;
  req.set_include_slabs(include_slabs);
  v1::GetStatsResponse resp;
  absl::Status s = FromGrpc(impl_->stub->GetStats(&ctx, req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Session> Client::GetSession() {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::Session resp;
  absl::Status s =
      FromGrpc(impl_->stub->GetSession(&ctx, v1::GetSessionRequest(), &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<void*> Client::MapBlock(const v1::Allocation& a) {
  if (a.handle_kind() != v1::HANDLE_KIND_POSIX_FD) {
    return absl::UnimplementedError("this client maps POSIX fd handles only");
  }
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->slabs.find(a.slab_id());
  if (it == impl_->slabs.end()) {
    if (impl_->channel_fd < 0) {
      absl::StatusOr<int> fd = ConnectFdChannel(impl_->socket_path);
      if (!fd.ok()) return fd.status();
      impl_->channel_fd = *fd;
    }
    absl::StatusOr<SlabFd> slab = RequestSlabFd(impl_->channel_fd, a.slab_id());
    if (!slab.ok()) {
      if (slab.status().code() == absl::StatusCode::kUnavailable) {
        close(impl_->channel_fd);
        impl_->channel_fd = -1;
      }
      return slab.status();
    }
    void* base = mmap(nullptr, slab->size, PROT_READ | PROT_WRITE, MAP_SHARED,
                      slab->fd, 0);
    close(slab->fd);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of slab ", a.slab_id(), " failed"));
    }
    it = impl_->slabs.emplace(a.slab_id(),
                              MappedSlab{static_cast<char*>(base), slab->size, 0})
             .first;
  }
  if (a.offset() > it->second.size || a.size_bytes() > it->second.size - a.offset()) {
    return absl::InternalError("block lies outside its slab");
  }
  ++it->second.refs;
  return it->second.base + a.offset();
}

void Client::UnmapBlock(const v1::Allocation& a) {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->slabs.find(a.slab_id());
  if (it == impl_->slabs.end()) return;
  if (--it->second.refs == 0) {
    munmap(it->second.base, it->second.size);
    impl_->slabs.erase(it);
    // Tell the daemon, so a released slab is not kept retained for us.
    if (impl_->channel_fd >= 0 &&
        CloseSlabFd(impl_->channel_fd, a.slab_id()).code() == absl::StatusCode::kUnavailable) {
      close(impl_->channel_fd);
      impl_->channel_fd = -1;
    }
  }
}

absl::StatusOr<Buffer> Client::Allocate(uint64_t size,
                                        const v1::PlacementRequest& placement,
                                        uint64_t alignment) {
  v1::AllocateRequest req;
  req.set_size_bytes(size);
  *req.mutable_placement() = placement;
  req.set_alignment(alignment);
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

absl::Status Buffer::Free() {
  if (client_ == nullptr) return absl::FailedPreconditionError("empty Buffer");
  Client* c = client_;
  client_ = nullptr;
  c->UnmapBlock(info_);
  data_ = nullptr;
  return c->Free(info_.id());
}

}  // namespace gpumem
