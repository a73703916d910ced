// Status mapping: gRPC codes and absl codes are the same numbers, so a
// daemon's answer reaches the caller with its code and message unchanged.
#include "client/lib/cpp/client.h"

#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client_impl.h"
#include "client/lib/cpp/process_open_slabs.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/slabs/slab_mapper.h"
#include "client/lib/cpp/stream_transport.h"
#include "common/fd_channel.h"
#include "common/grpc_status.h"
#include "common/refusal_payload.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace client {

std::optional<v1::PlacementRefusal> PlacementRefusalOf(const absl::Status& status) {
  return RefusalFromStatus(status);
}

std::string DefaultSocketPath() {
  const char* env = std::getenv("GPUMEMD_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return "/run/gpumemd/gpumemd.sock";
}

namespace {

// GPUMEM_RECONNECT_MS, else 30 s.
absl::Duration ReconnectWait() {
  const char* env = std::getenv("GPUMEM_RECONNECT_MS");
  int64_t ms = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &ms) && ms >= 0) return absl::Milliseconds(ms);
  return absl::Seconds(30);
}

// The devices this process can see, so the daemon places only there (and
// refuses by name a placement naming another); a caller's own view is kept.
void AddCallersView(v1::PlacementRequest* placement) {
  if (!placement->visible_devices().empty()) return;
  for (const std::string& uuid : CudaDeviceContext::VisibleUuids()) {
    placement->add_visible_devices(uuid);
  }
}

}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  // Frees waiting for device work go first: they still talk to the daemon.
  if (impl_->owner_pid == getpid()) impl_->deferred.Flush();
  {
    absl::MutexLock lock(&impl_->restart_mu);
    impl_->stopping = true;
  }
  if (impl_->watcher.joinable()) {
    if (impl_->owner_pid == getpid()) {
      uint64_t one = 1;
      (void)!write(impl_->wake_fd, &one, sizeof(one));
      impl_->watcher.join();
    } else {
      impl_->watcher.detach();  // a fork() child: the thread is the parent's
    }
  }
  if (impl_->wake_fd >= 0) close(impl_->wake_fd);
  {
    absl::MutexLock lock(&impl_->mu);
    // Closes every opened slab; the daemon learns it with the connection's
    // end (a holder until the process's session ends), as before.
    for (const auto& [slab_id, mapped] : impl_->slabs) {
      ProcessOpenSlabs::Dropping(impl_->socket_path, slab_id);
    }
    impl_->slabs.clear();
    impl_->retired.clear();
  }
  absl::MutexLock lock(&impl_->link_mu);
  impl_->link.reset();
}

const std::string& Client::socket_path() const { return impl_->socket_path; }

void Client::SetHandleKind(v1::HandleKind kind) {
  absl::MutexLock lock(&impl_->mu);
  impl_->handle_kind = kind;
}

void Client::OnReclaimRequest(
    std::function<void(const v1::ReclaimRequest&)> on_reclaim) {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->on_reclaim = on_reclaim;
  }
  impl_->Link()->stream()->StartPushReader(
      [on_reclaim = std::move(on_reclaim)](const v1::StreamReply& push) {
        if (push.has_reclaim()) on_reclaim(push.reclaim());
      });
}

absl::Status Client::ReportReclaimed(uint64_t freed_bytes) {
  return impl_->Link()->stream()->Reclaimed(freed_bytes);
}

void Client::OnRestart(std::function<void(const RestartReport&)> on_restart) {
  absl::MutexLock lock(&impl_->mu);
  impl_->on_restart = std::move(on_restart);
}

uint64_t Client::restarts() const {
  absl::MutexLock lock(&impl_->restart_mu);
  return impl_->restarts;
}

bool Client::IsLost(uint64_t allocation_id) const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->lost.contains(allocation_id);
}

void Client::SetUsageReport(const v1::UsageReport& usage) {
  absl::MutexLock lock(&impl_->mu);
  impl_->usage = usage;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(std::string socket_path) {
  if (socket_path.empty()) socket_path = DefaultSocketPath();
  auto impl = std::make_unique<Impl>();
  impl->socket_path = socket_path;
  impl->reconnect_wait = ReconnectWait();
  // A daemon that took the connection and hung up (or stayed silent)
  // before answering is one that died or is starting (a restart): tried
  // again within the reconnect wait, as calls are. Nothing listening, or an
  // answer (a refusal, a goodbye), fails at once.
  const absl::Time give_up = absl::Now() + impl->reconnect_wait;
  DaemonRetryBackoff backoff;
  absl::StatusOr<std::shared_ptr<DaemonLink>> link;
  for (;;) {
    bool rebound = false;
    bool unanswered = false;
    link = DaemonLink::Open(socket_path, /*rebind_token=*/"", &rebound, &unanswered);
    if (link.ok() || !unanswered) break;
    const absl::Duration pause = backoff.Next();
    if (absl::Now() + pause > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "gpumemd at ", socket_path, " took the connection but gave no answer within ",
          absl::FormatDuration(impl->reconnect_wait),
          " (restarting, or stuck; GPUMEM_RECONNECT_MS sets the wait): ",
          link.status().message()));
    }
    absl::SleepFor(pause);
  }
  if (!link.ok()) return link.status();
  impl->link = *std::move(link);
  impl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  impl->owner_pid = getpid();
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  Client* c = client.get();
  c->impl_->watcher = std::thread([c] { c->WatchLoop(); });
  return client;
}

namespace {

// A call that failed because the daemon went away: UNAVAILABLE, and its
// link hangs up (or was replaced) within a second. Marks the restart begun
// so that the retry waits for it.
bool DaemonWentAway(const absl::Status& s, Client::Impl& impl, const DaemonLink* link) {
  if (s.code() != absl::StatusCode::kUnavailable) return false;
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  for (;;) {
    if (impl.Link().get() != link) return true;
    if (link->HungUp()) {
      absl::MutexLock lock(&impl.restart_mu);
      if (impl.Link().get() == link) impl.restarting = true;
      return true;
    }
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

// Waits while a restart is under way; UNAVAILABLE once the wait ran out.
// While the daemon is known gone (a wait ran out, or it said goodbye) a call
// fails at once unless a daemon answers at the socket again: then it waits
// for the library to reconnect to it.
absl::Status WaitUntilServing(Client::Impl& impl) {
  auto serving = [&impl]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl.restart_mu) {
    return !impl.restarting || impl.stopping;
  };
  {
    absl::MutexLock lock(&impl.restart_mu);
    if (serving()) return absl::OkStatus();
    if (!impl.gone) {
      if (impl.restart_mu.AwaitWithTimeout(absl::Condition(&serving), impl.reconnect_wait)) {
        return absl::OkStatus();
      }
      impl.gone = true;
      impl.gone_why = absl::StrCat(
          "gpumemd at ", impl.socket_path, " went away and did not come back within ",
          absl::FormatDuration(impl.reconnect_wait),
          " (GPUMEM_RECONNECT_MS); the library keeps trying");
      return absl::UnavailableError(impl.gone_why);
    }
  }
  absl::StatusOr<int> probe = ConnectFdChannel(impl.socket_path);
  absl::MutexLock lock(&impl.restart_mu);
  if (!probe.ok()) return absl::UnavailableError(impl.gone_why);
  close(*probe);
  if (impl.restart_mu.AwaitWithTimeout(absl::Condition(&serving), impl.reconnect_wait)) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(impl.gone_why);
}

// A request_key (proto AllocateRequest): nonzero and unique per call in
// this process (the session): a counter from a random start, through
// SplitMix64's finalizer (a bijection, so distinct counts give distinct
// keys), so keys do not repeat across the process's daemons either.
uint64_t NewRequestKey() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    if (getrandom(&s, sizeof(s), 0) != static_cast<ssize_t>(sizeof(s))) {
      s = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^
          (static_cast<uint64_t>(getpid()) << 32);
    }
    return s;
  }();
  static std::atomic<uint64_t> count{0};
  uint64_t x = seed + count.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x != 0 ? x : 1;
}

}  // namespace

template <typename T, typename Fn>
absl::StatusOr<T> Client::WithRestart(Fn call) {
  for (int attempt = 0;; ++attempt) {
    if (absl::Status ready = WaitUntilServing(*impl_); !ready.ok()) return ready;
    std::shared_ptr<DaemonLink> link;
    absl::StatusOr<T> out = absl::UnknownError("not called");
    {
      absl::ReaderMutexLock calls(&impl_->calls);
      link = impl_->Link();
      out = call(*link);
    }
    if (out.ok() || attempt >= 2 || !DaemonWentAway(out.status(), *impl_, link.get())) {
      return out;
    }
  }
}

absl::StatusOr<v1::AllocateResponse> Client::AllocateRaw(
    const v1::AllocateRequest& given) {
  // One key for this call, the same on each of WithRestart's retries: a
  // daemon killed after it made the allocation but before its answer came
  // gives the retry that allocation back instead of charging a second one.
  v1::AllocateRequest request = given;
  if (request.request_key() == 0) request.set_request_key(NewRequestKey());
  return WithRestart<v1::AllocateResponse>(
      [this, &request](DaemonLink& link) -> absl::StatusOr<v1::AllocateResponse> {
        absl::StatusOr<v1::AllocateResponse> answer = absl::UnknownError("not sent");
        // A request that may wait goes unary: its call is its own (its
        // deadline and cancellation reach the daemon's waiter), and older
        // daemons refuse wait_ms on the stream.
        bool sent = false;
        if (request.wait_ms() == 0) {
          answer = link.stream()->Allocate(request);
          sent = !link.stream()->unsupported();
        }
        if (!sent) {
          grpc::ClientContext ctx;
          link.Prepare(&ctx);
          v1::AllocateResponse response;
          absl::Status s = FromGrpcStatus(link.stub()->Allocate(&ctx, request, &response));
          answer = s.ok() ? absl::StatusOr<v1::AllocateResponse>(std::move(response))
                          : absl::StatusOr<v1::AllocateResponse>(s);
        }
        if (answer.ok()) {
          // Live from now on: a restart re-presents it.
          absl::MutexLock lock(&impl_->mu);
          for (const v1::Allocation& a : answer->allocations()) impl_->live[a.id()] = a;
        }
        return answer;
      });
}

absl::Status Client::Free(uint64_t allocation_id) {
  {
    absl::MutexLock lock(&impl_->mu);
    auto lost = impl_->lost.find(allocation_id);
    if (lost != impl_->lost.end()) {
      absl::Status why = lost->second;
      impl_->lost.erase(lost);
      impl_->live.erase(allocation_id);
      return why;
    }
    impl_->freeing.insert(allocation_id);
  }
  v1::FreeRequest req;
  req.set_id(allocation_id);
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->usage.has_value()) *req.mutable_usage() = *impl_->usage;
  }
  absl::StatusOr<v1::FreeResponse> freed = WithRestart<v1::FreeResponse>(
      [this, &req](DaemonLink& link) -> absl::StatusOr<v1::FreeResponse> {
        absl::StatusOr<v1::FreeResponse> answer = link.stream()->Free(req);
        if (link.stream()->unsupported()) {
          grpc::ClientContext ctx;
          link.Prepare(&ctx);
          v1::FreeResponse resp;
          absl::Status s = FromGrpcStatus(link.stub()->Free(&ctx, req, &resp));
          answer = s.ok() ? absl::StatusOr<v1::FreeResponse>(resp)
                          : absl::StatusOr<v1::FreeResponse>(s);
        }
        if (answer.ok() || answer.status().code() == absl::StatusCode::kNotFound) {
          absl::MutexLock lock(&impl_->mu);
          impl_->live.erase(req.id());
        }
        return answer;
      });
  absl::MutexLock lock(&impl_->mu);
  impl_->freeing.erase(allocation_id);
  // Sent before a restart, carried out, its answer cut off: done.
  if (impl_->freed_meanwhile.erase(allocation_id) > 0) return absl::OkStatus();
  return freed.status();
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(bool include_slabs) {
  return WithRestart<v1::GetStatsResponse>(
      [include_slabs](DaemonLink& link) -> absl::StatusOr<v1::GetStatsResponse> {
        grpc::ClientContext ctx;
        link.Prepare(&ctx);
        v1::GetStatsRequest req;
        req.set_include_slabs(include_slabs);
        v1::GetStatsResponse resp;
        absl::Status s = FromGrpcStatus(link.stub()->GetStats(&ctx, req, &resp));
        if (!s.ok()) return s;
        return resp;
      });
}

absl::StatusOr<v1::Session> Client::GetSession() {
  absl::StatusOr<v1::Session> out = WithRestart<v1::Session>(
      [](DaemonLink& link) -> absl::StatusOr<v1::Session> {
        absl::StatusOr<v1::Session> streamed = link.stream()->GetSession();
        if (!link.stream()->unsupported()) return streamed;
        grpc::ClientContext ctx;
        link.Prepare(&ctx);
        v1::Session resp;
        absl::Status s =
            FromGrpcStatus(link.stub()->GetSession(&ctx, v1::GetSessionRequest(), &resp));
        if (!s.ok()) return s;
        return resp;
      });
  if (out.ok()) {
    absl::MutexLock lock(&impl_->mu);
    impl_->session_id = out->session_id();
  }
  return out;
}

absl::StatusOr<v1::GetUsageResponse> Client::GetUsage() {
  return WithRestart<v1::GetUsageResponse>(
      [](DaemonLink& link) -> absl::StatusOr<v1::GetUsageResponse> {
        grpc::ClientContext ctx;
        v1::GetUsageResponse resp;
        absl::Status s =
            FromGrpcStatus(link.stub()->GetUsage(&ctx, v1::GetUsageRequest(), &resp));
        if (!s.ok()) return s;
        return resp;
      });
}

absl::StatusOr<v1::GetLedgerResponse> Client::GetLedger(const v1::GetLedgerRequest& request) {
  return WithRestart<v1::GetLedgerResponse>(
      [&request](DaemonLink& link) -> absl::StatusOr<v1::GetLedgerResponse> {
        grpc::ClientContext ctx;
        v1::GetLedgerResponse resp;
        absl::Status s = FromGrpcStatus(link.stub()->GetLedger(&ctx, request, &resp));
        if (!s.ok()) return s;
        return resp;
      });
}

absl::StatusOr<v1::SetQuotaResponse> Client::SetQuota(const v1::SetQuotaRequest& request) {
  return WithRestart<v1::SetQuotaResponse>(
      [&request](DaemonLink& link) -> absl::StatusOr<v1::SetQuotaResponse> {
        grpc::ClientContext ctx;
        v1::SetQuotaResponse resp;
        absl::Status s = FromGrpcStatus(link.stub()->SetQuota(&ctx, request, &resp));
        if (!s.ok()) return s;
        return resp;
      });
}

absl::StatusOr<void*> Client::MapBlock(const v1::Allocation& a) {
  std::shared_ptr<DaemonLink> link = impl_->Link();
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->slabs.find(a.slab_id());
  if (it == impl_->slabs.end()) {
    auto m = impl_->mappers.find(a.handle_kind());
    if (m == impl_->mappers.end()) {
      absl::StatusOr<std::unique_ptr<SlabMapper>> made = NewSlabMapper(a.handle_kind());
      if (!made.ok()) return made.status();
      m = impl_->mappers.emplace(a.handle_kind(), *std::move(made)).first;
    }
    auto fetch_fd = [&link, &a]() -> absl::StatusOr<SlabFd> {
      return link->OpenSlab(a.slab_id());
    };
    // Counted before the daemon is asked (process_open_slabs.h).
    ProcessOpenSlabs::Opening(impl_->socket_path, a.slab_id());
    absl::StatusOr<std::unique_ptr<OpenedSlab>> opened = m->second->Open(a, fetch_fd);
    if (!opened.ok()) {
      ProcessOpenSlabs::Dropping(impl_->socket_path, a.slab_id());
      return opened.status();
    }
    it = impl_->slabs.emplace(a.slab_id(), MappedSlab{*std::move(opened), 0}).first;
  }
  const uint64_t size = it->second.slab->size();
  if (a.offset() > size || a.size_bytes() > size - a.offset()) {
    return absl::InternalError("block lies outside its slab");
  }
  ++it->second.refs;
  return it->second.slab->base() + a.offset();
}

absl::Status Client::FreeBlock(v1::Allocation a) {
  // Device memory waits for the work queued on it (deferred_frees.h); a block
  // lost at a restart keeps its addresses and has nothing to give back, and
  // a fork() child has no device (its calls fail as they did).
  if (!IsLost(a.id()) && impl_->owner_pid == getpid()) {
    std::shared_ptr<OpenedSlab> slab;
    {
      absl::MutexLock lock(&impl_->mu);
      auto it = impl_->slabs.find(a.slab_id());
      if (it != impl_->slabs.end() && it->second.slab->on_device()) slab = it->second.slab;
    }
    if (slab != nullptr) {
      impl_->deferred.Add(std::move(slab), [this, a = std::move(a)] {
        UnmapBlock(a, /*retire=*/IsLost(a.id()));
        Free(a.id()).IgnoreError();  // as the destructor's: the daemon reclaims at exit
      });
      return absl::OkStatus();
    }
  }
  // A block lost at a restart: its memory goes, its addresses stay taken.
  UnmapBlock(a, /*retire=*/IsLost(a.id()));
  return Free(a.id());
}

void Client::FlushFrees() { impl_->deferred.Flush(); }

void Client::UnmapBlock(const v1::Allocation& a, bool retire) {
  std::shared_ptr<DaemonLink> link = impl_->Link();
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->slabs.find(a.slab_id());
  if (it == impl_->slabs.end()) return;
  if (--it->second.refs == 0 && retire) {
    // The daemon that lent it is gone: nobody to tell; keep the addresses.
    it->second.slab->Retire();
    impl_->retired.push_back(std::move(it->second.slab));
    impl_->slabs.erase(it);
    ProcessOpenSlabs::Dropping(impl_->socket_path, a.slab_id());
    return;
  }
  if (it->second.refs == 0) {
    impl_->slabs.erase(it);  // closes the slab
    // Tell the daemon, so a released slab is not kept retained for us (a
    // daemon gone has nothing to keep), unless another Client of this
    // process still has it open (process_open_slabs.h).
    ProcessOpenSlabs::Closing(impl_->socket_path, a.slab_id(),
                              [&] { link->CloseSlab(a.slab_id()).IgnoreError(); });
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

absl::StatusOr<v1::AllocateResponse> Client::AllocateRawAfterFrees(
    const v1::AllocateRequest& request) {
  absl::StatusOr<v1::AllocateResponse> resp = AllocateRaw(request);
  // Memory this process freed may still wait for its device's work: once
  // that work has run and it is back, the daemon may have room.
  if (resp.status().code() == absl::StatusCode::kResourceExhausted &&
      impl_->deferred.pending() > 0) {
    impl_->deferred.Flush();
    resp = AllocateRaw(request);
  }
  return resp;
}

absl::StatusOr<Buffer> Client::Allocate(uint64_t size,
                                        const v1::PlacementRequest& placement,
                                        uint64_t alignment) {
  v1::AllocateRequest req;
  req.set_size_bytes(size);
  *req.mutable_placement() = placement;
  AddCallersView(req.mutable_placement());
  req.set_alignment(alignment);
  {
    absl::MutexLock lock(&impl_->mu);
    req.set_handle_kind(impl_->handle_kind);
    if (impl_->usage.has_value()) *req.mutable_usage() = *impl_->usage;
  }
  for (int attempt = 0;; ++attempt) {
    const uint64_t restarts_before = restarts();
    absl::StatusOr<v1::AllocateResponse> resp = AllocateRawAfterFrees(req);
    if (!resp.ok()) return resp.status();
    if (resp->allocations_size() != 1) {
      return absl::InternalError("daemon returned no allocation");
    }
    const v1::Allocation& a = resp->allocations(0);
    absl::StatusOr<void*> data = MapBlock(a);
    if (data.ok()) return Buffer(this, a, *data);
    Free(a.id()).IgnoreError();  // waits for a restart under way
    // The daemon restarted between the answer and the map: ask the new one.
    if (attempt > 0 || data.status().code() != absl::StatusCode::kUnavailable ||
        restarts() == restarts_before) {
      return data.status();
    }
  }
}

absl::StatusOr<std::vector<Buffer>> Client::AllocateSharded(
    uint64_t total_size, uint32_t shards, const v1::PlacementRequest& placement) {
  v1::AllocateRequest req;
  req.set_size_bytes(total_size);
  req.set_shard_count(shards);
  *req.mutable_placement() = placement;
  AddCallersView(req.mutable_placement());
  {
    absl::MutexLock lock(&impl_->mu);
    req.set_handle_kind(impl_->handle_kind);
    if (impl_->usage.has_value()) *req.mutable_usage() = *impl_->usage;
  }
  for (int attempt = 0;; ++attempt) {
    const uint64_t restarts_before = restarts();
    absl::StatusOr<v1::AllocateResponse> resp = AllocateRawAfterFrees(req);
    if (!resp.ok()) return resp.status();
    std::vector<Buffer> out;
    absl::Status mapped;
    for (const v1::Allocation& a : resp->allocations()) {
      absl::StatusOr<void*> data = MapBlock(a);
      if (!data.ok()) {
        mapped = data.status();
        break;
      }
      out.push_back(Buffer(this, a, *data));
    }
    if (mapped.ok()) return out;
    // Free what was not mapped (waits for a restart under way); `out` frees
    // the mapped ones.
    for (int i = static_cast<int>(out.size()); i < resp->allocations_size(); ++i) {
      Free(resp->allocations(i).id()).IgnoreError();
    }
    out.clear();
    // The daemon restarted between the answer and the map: ask the new one.
    if (attempt > 0 || mapped.code() != absl::StatusCode::kUnavailable ||
        restarts() == restarts_before) {
      return mapped;
    }
  }
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
  data_ = nullptr;
  return c->FreeBlock(std::move(info_));
}

absl::Status Buffer::FreeNow() {
  if (client_ == nullptr) return absl::FailedPreconditionError("empty Buffer");
  Client* c = client_;
  client_ = nullptr;
  data_ = nullptr;
  // A block lost at a restart: its memory goes, its addresses stay taken.
  c->UnmapBlock(info_, /*retire=*/c->IsLost(info_.id()));
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
