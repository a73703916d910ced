// Allocate runs placement with a carver that carves from the pools directly;
// each pool locks itself, and placement re-checks what a snapshot promised by
// carving, so the snapshot may be slightly stale without double-promising
// anything. Blocks carved for a request stay "pending" inside the carver
// until placement returns; only then do they become allocations, under the
// table lock, and only if the caller's session is still alive.
#include "server/service/memory_broker.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/refusal_payload.h"
#include "server/quota/quota_carver.h"
#include "server/service/quota_proto.h"

namespace gpumem {

namespace {

v1::HandleKind ToWire(HandleKind kind) {
  switch (kind) {
    case HandleKind::kMemfd: return v1::HANDLE_KIND_MEMFD;
    case HandleKind::kCudaVmmFd: return v1::HANDLE_KIND_CUDA_VMM_FD;
    case HandleKind::kCudaIpc: return v1::HANDLE_KIND_CUDA_IPC;
  }
  return v1::HANDLE_KIND_UNSPECIFIED;
}

// The payload that marks MemoryBroker::NeedsBackendWork statuses.
constexpr absl::string_view kNeedsBackendWorkUrl = "gpumemd/needs-backend-work";

absl::Status NeedsBackendWorkError(uint32_t device) {
  absl::Status s = absl::UnavailableError(absl::StrCat(
      "device ", device, ": serving this request needs backend work (a new slab or "
      "releasing empty ones), not done on this thread"));
  s.SetPayload(kNeedsBackendWorkUrl, absl::Cord("1"));
  return s;
}

std::string KindList(const std::vector<HandleKind>& kinds) {
  std::string out;
  for (HandleKind k : kinds) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", v1::HandleKind_Name(ToWire(k)));
  }
  return out;
}

}  // namespace

class MemoryBroker::PoolCarver : public placement::DeviceCarver {
 public:
  PoolCarver(MemoryBroker* broker, uint32_t tenant, HandleKind kind, bool backend_work)
      : broker_(broker), tenant_(tenant), kind_(kind), backend_work_(backend_work) {}

  absl::StatusOr<placement::CarvedBlock> TryCarve(
      uint32_t device, uint64_t size, uint64_t alignment,
      placement::CarveRefusal* refusal) override {
    CarveResult r =
        broker_->pools_[device]->Carve(size, alignment, tenant_, kind_, backend_work_);
    switch (r.kind) {
      case CarveResult::Kind::kError:
        return r.error;
      case CarveResult::Kind::kNeedsBackend:
        // Not a refusal: the placer undoes what it carved and stops.
        return NeedsBackendWorkError(device);
      case CarveResult::Kind::kRefused:
        refusal->refused = true;
        refusal->free_bytes = r.refusal.free_bytes;
        refusal->largest_free_bytes = r.refusal.largest_free_bytes;
        refusal->reason = r.refusal.reason == PoolRefusal::Reason::kCapacity
                              ? placement::CarveRefusal::Reason::kCapacity
                              : placement::CarveRefusal::Reason::kFragmentation;
        return absl::ResourceExhaustedError(r.refusal.message);
      case CarveResult::Kind::kBlock:
        break;
    }
    placement::CarvedBlock c;
    c.device = device;
    c.size_bytes = size;
    c.id = broker_->next_id_.fetch_add(1);
    c.slab_id = r.block.slab_id;
    c.offset = r.block.offset;
    pending_[c.id] = r.block;
    return c;
  }

  void Release(const placement::CarvedBlock& block) override {
    auto it = pending_.find(block.id);
    if (it == pending_.end()) return;
    broker_->pools_[block.device]->Uncarve(it->second);
    pending_.erase(it);
  }

  const PoolBlock& pool_block(uint64_t id) const { return pending_.at(id); }

 private:
  MemoryBroker* broker_;
  uint32_t tenant_;
  HandleKind kind_;
  bool backend_work_;
  absl::flat_hash_map<uint64_t, PoolBlock> pending_;
};

absl::Status MemoryBroker::ShuttingDown() {
  return absl::FailedPreconditionError("gpumemd is shutting down");
}

MemoryBroker::MemoryBroker(Backend* backend, BrokerOptions options)
    : backend_(backend), options_(std::move(options)) {
  for (const DeviceInfo& d : backend_->devices()) {
    pools_.push_back(std::make_unique<SlabPool>(backend_, d.index, options_.pool));
    largest_device_bytes_ = std::max(largest_device_bytes_, d.total_bytes);
    placement::DeviceView v;
    v.index = d.index;
    v.uuid = d.uuid;
    v.total_bytes = d.total_bytes;
    device_views_.push_back(std::move(v));
  }
  placer_options_.default_alignment = options_.default_alignment;
  if (options_.ledger != nullptr) next_id_ = options_.ledger->first_allocation_id();
  for (const DeviceInfo& d : backend_->devices()) {
    std::vector<v1::PeerLink>& row = peer_rows_.emplace_back();
    for (const DeviceInfo& peer : backend_->devices()) {
      switch (backend_->Peer(d.index, peer.index)) {
        case PeerLink::kSelf: row.push_back(v1::PEER_LINK_SELF); break;
        case PeerLink::kNvLink: row.push_back(v1::PEER_LINK_NVLINK); break;
        case PeerLink::kHost: row.push_back(v1::PEER_LINK_HOST); break;
      }
    }
  }
  sessions_ = std::make_unique<SessionRegistry>(
      [this](uint64_t id) { OnSessionEnd(id); });
  if (options_.quotas != nullptr) {  // quotas count retained bytes
    options_.quotas->SetRetainedSource([this](uint32_t tenant, uint32_t device) {
      const auto stats = pools_[device]->TenantStats();
      auto it = stats.find(tenant);
      return it == stats.end() ? uint64_t{0} : it->second.retained_bytes;
    });
  }
}

MemoryBroker::~MemoryBroker() {
  Shutdown();
  if (options_.quotas != nullptr) options_.quotas->SetRetainedSource(nullptr);
  sessions_.reset();  // joins the watcher before the maps go
}

absl::Status MemoryBroker::SetAdminGroup(const std::string& group) {
  if (group.empty()) {
    admin_gid_.store(-1);
    return absl::OkStatus();
  }
  struct group grp;
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  getgrnam_r(group.c_str(), &grp, buf.data(), buf.size(), &found);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admin group \"", group, "\" does not exist on this machine"));
  }
  admin_gid_.store(found->gr_gid);
  return absl::OkStatus();
}

void MemoryBroker::BeginDrain() { draining_.store(true); }

bool MemoryBroker::WaitUntilNoAllocations(absl::Duration timeout) {
  // Polled: a drain waits seconds, so 10 ms steps cost nothing, and no
  // condition runs inside the lock's slow path (where TSan builds cannot
  // see Debian's Abseil synchronize).
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (live_allocations() == 0) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(left, absl::Milliseconds(10)));
  }
}

size_t MemoryBroker::live_allocations() const {
  absl::MutexLock lock(&table_mu_);
  return allocations_.size();
}

void MemoryBroker::SetEmptySlabRelease(absl::Duration after) {
  for (auto& pool : pools_) pool->SetEmptyReleaseAfter(after);
}

absl::Status MemoryBroker::Start() {
  const std::vector<HandleKind>& can = backend_->handle_kinds();
  if (options_.handle_kinds.empty()) options_.handle_kinds = can;
  for (HandleKind k : options_.handle_kinds) {
    if (std::find(can.begin(), can.end(), k) == can.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "handle kind ", HandleKindName(k), " is not one the ", backend_->name(),
          " backend makes (it makes: ", KindList(can), ")"));
    }
  }
  absl::Status admin = SetAdminGroup(options_.admin_group);
  if (!admin.ok()) return admin;
  for (auto& pool : pools_) {
    absl::Status s = pool->Reserve();
    if (!s.ok()) return s;
  }
  maintenance_ = std::thread([this] { Maintain(); });
  return absl::OkStatus();
}

bool MemoryBroker::IsAdmin(const PeerCred& caller) const {
  if (caller.uid == 0) return true;
  const int64_t admin_gid = admin_gid_.load();
  if (admin_gid < 0) return false;
  if (caller.gid == static_cast<gid_t>(admin_gid)) return true;
  // Supplementary groups, as the system's group database says for the uid.
  struct passwd pw;
  struct passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(caller.uid, &pw, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return false;
  }
  int n = 64;
  std::vector<gid_t> groups(n);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(n);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) return false;
  }
  groups.resize(n);
  return std::find(groups.begin(), groups.end(), static_cast<gid_t>(admin_gid)) !=
         groups.end();
}

void MemoryBroker::Maintain() {
  absl::MutexLock stop(&stop_mu_);
  while (!stopping_) {
    stop_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                              options_.maintenance_interval);
    if (stopping_) break;
    const absl::Time now = absl::Now();
    for (auto& pool : pools_) pool->ReleaseIdleSlabs(now);
  }
}

void MemoryBroker::Shutdown() {
  {
    absl::MutexLock stop(&stop_mu_);
    stopping_ = true;
  }
  if (maintenance_.joinable()) maintenance_.join();
  StopWaiting();  // waiters hold the gate shared
  absl::WriterMutexLock gate(&gate_);
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&table_mu_);
    for (const auto& [id, r] : allocations_) AppendEvent(ledger::EventKind::kDaemonStop, id, r);
    allocations_.clear();
    by_session_.clear();
    usage_reports_.clear();
  }
  for (auto& pool : pools_) pool->ReleaseAll();  // retained slabs too
}

placement::DeviceSnapshot MemoryBroker::Snapshot() const {
  placement::DeviceSnapshot snap;
  snap.devices = device_views_;
  for (placement::DeviceView& v : snap.devices) {
    const PoolStats s = pools_[v.index]->Stats();
    v.used_bytes = s.used_bytes;
    // Retained bytes are held by some process: not free, not offered.
    const uint64_t held = s.used_bytes + s.retained_bytes;
    v.free_bytes = held >= v.total_bytes ? 0 : v.total_bytes - held;
    v.largest_free_bytes = s.largest_carvable;
  }
  const Backend* backend = backend_;
  snap.peer = [backend](uint32_t a, uint32_t b) {
    return static_cast<placement::PeerDistance>(backend->Peer(a, b));
  };
  return snap;
}

absl::StatusOr<HandleKind> MemoryBroker::RequestedKind(
    const v1::AllocateRequest& request) const {
  const std::vector<HandleKind>& offered = options_.handle_kinds;
  if (request.handle_kind() == v1::HANDLE_KIND_UNSPECIFIED) return offered.front();
  for (HandleKind k : offered) {
    if (ToWire(k) == request.handle_kind()) return k;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "handle_kind ", v1::HandleKind_Name(request.handle_kind()),
      " is not offered by this daemon (", backend_->name(),
      " backend); it offers: ", KindList(offered)));
}

bool MemoryBroker::NeedsBackendWork(const absl::Status& status) {
  return status.GetPayload(kNeedsBackendWorkUrl).has_value();
}

// issue 25: every refused request counted once (not one sent back to be run
// again on a backend thread: that run counts).
absl::StatusOr<v1::AllocateResponse> MemoryBroker::Allocate(
    const PeerCred& caller, const v1::AllocateRequest& request, BackendWork work) {
  absl::StatusOr<v1::AllocateResponse> r = AllocateUncounted(caller, request, work);
  if (!r.ok() && !NeedsBackendWork(r.status())) counters_.RecordRefusal(r.status());
  return r;
}

absl::StatusOr<v1::AllocateResponse> MemoryBroker::AllocateUncounted(
    const PeerCred& caller, const v1::AllocateRequest& request, BackendWork work) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  if (draining_.load()) {
    return absl::UnavailableError(
        "gpumemd is stopping: it takes no new allocations; retry once it is back");
  }
  if (request.shard_count() == 0 && request.shard_sizes_size() == 0 &&
      request.size_bytes() > largest_device_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size_bytes ", request.size_bytes(), " (", FormatBytes(request.size_bytes()),
        ") is larger than any device (largest: ", FormatBytes(largest_device_bytes_), ")"));
  }
  absl::StatusOr<HandleKind> kind = RequestedKind(request);
  if (!kind.ok()) return kind.status();
  if (request.has_usage()) {
    absl::Status usage_ok = CheckUsage(request.usage());
    if (!usage_ok.ok()) return usage_ok;
  }
  absl::StatusOr<SessionInfo> session = sessions_->Attach(caller);
  if (!session.ok()) return session.status();
  // The client's usage report counts this request as done: keep it only
  // when it is.
  auto reported = [&](absl::StatusOr<v1::AllocateResponse> result) {
    if (result.ok() && request.has_usage()) RecordUsage(session->id, request.usage());
    return result;
  };
  absl::StatusOr<placement::PreparedRequest> prepared =
      placement::PrepareRequest(request, device_views_, placer_options_);
  if (!prepared.ok()) return prepared.status();

  absl::StatusOr<tenants::TenantRef> tenant = TenantOfSession(session->id, caller);
  if (!tenant.ok()) return tenant.status();

  bool asked_reclaim = false;
  for (;;) {
    const uint64_t releases = releases_.load();
    absl::StatusOr<v1::AllocateResponse> placed =
        Place(caller, *tenant, session->id, *prepared, *kind, work);
    if (!placed.ok() && NeedsBackendWork(placed.status())) return placed;
    if (!placed.ok() && placed.status().code() == absl::StatusCode::kResourceExhausted &&
        !asked_reclaim) {
      asked_reclaim = true;
      RequestReclaim(session->id, request.size_bytes(), placed.status());
    }
    if (placed.ok() || request.wait_ms() == 0 ||
        placed.status().code() != absl::StatusCode::kResourceExhausted) {
      return reported(std::move(placed));
    }
    // Nothing can serve it now: wait until a release serves it
    // (ServeWaiters, on the releasing thread) or the time is up.
    {
      absl::MutexLock lock(&wait_mu_);
      if (stop_waiting_) return reported(std::move(placed));
      ++waiting_;
      if (releases_.load() != releases) {  // room may have come back meanwhile
        --waiting_;
        continue;
      }
      Waiter w;
      w.caller = caller;
      w.tenant = *tenant;
      w.session = session->id;
      w.prepared = &*prepared;
      w.kind = *kind;
      const auto ticket = waiters_.Add(tenant->priority, &w);
      counters_.RecordWaitStart(tenant->id);  // issue 25
      wait_mu_.AwaitWithDeadline(absl::Condition(&w.done),
                                 absl::Now() + absl::Milliseconds(request.wait_ms()));
      counters_.RecordWaitEnd(tenant->id);  // issue 25
      if (!w.done) waiters_.Remove(ticket);
      --waiting_;
      if (w.done) return reported(std::move(w.result));
    }
    // Time is up: the usual answer, as things stand now.
    return reported(Place(caller, *tenant, session->id, *prepared, *kind));
  }
}

absl::StatusOr<tenants::TenantRef> MemoryBroker::TenantOf(const PeerCred& caller) const {
  if (options_.tenants != nullptr) return options_.tenants->Get()->Resolve(caller.uid, caller.gid);
  return tenants::TenantRef{caller.uid, absl::StrCat("uid-", caller.uid), 0};
}

absl::StatusOr<tenants::TenantRef> MemoryBroker::TenantOfSession(uint64_t session,
                                                                 const PeerCred& caller) {
  if (options_.tenants == nullptr) return TenantOf(caller);  // by uid: never changes
  const std::shared_ptr<const tenants::TenantDirectory> dir = options_.tenants->Get();
  // Its priority now, if the directory in force still has the tenant.
  auto current = [&dir](tenants::TenantRef t) {
    if (const tenants::Tenant* c = dir->FindId(t.id)) t.priority = c->priority;
    return t;
  };
  {
    absl::MutexLock lock(&tenant_mu_);
    auto it = session_tenants_.find(session);
    if (it != session_tenants_.end()) return current(it->second.tenant);
  }
  // A refusal is not kept: a later reload may give the uid a tenant.
  absl::StatusOr<tenants::TenantRef> resolved = dir->Resolve(caller.uid, caller.gid);
  if (!resolved.ok()) return resolved;
  tenants::TenantRef fixed;
  {
    absl::MutexLock lock(&tenant_mu_);
    // Threads of one process may race here; the first to fix it wins.
    auto [it, fresh] = session_tenants_.try_emplace(session, SessionTenant{caller.uid, *resolved});
    fixed = it->second.tenant;
  }
  // A session that ended meanwhile may have been cleaned up before the entry
  // was made (OnSessionEnd runs once IsLive is false): drop it here then.
  if (!sessions_->IsLive(session)) {
    absl::MutexLock lock(&tenant_mu_);
    session_tenants_.erase(session);
  }
  return current(fixed);
}

absl::StatusOr<v1::AllocateResponse> MemoryBroker::Place(
    const PeerCred& caller, const tenants::TenantRef& tenant, uint64_t session,
    const placement::PreparedRequest& prepared, HandleKind kind, BackendWork work) {
  // The pool carves from this tenant's slabs; the quota adaptor charges the
  // tenant before the pool carves.
  PoolCarver pool_carver(this, tenant.id, kind, work == BackendWork::kAllowed);
  std::optional<quota::QuotaCarver> quota_carver;
  placement::DeviceCarver* carver = &pool_carver;
  if (options_.quotas != nullptr) {
    carver = &quota_carver.emplace(&pool_carver, options_.quotas, tenant.id, tenant.name);
  }
  placement::Placer placer(carver, placer_options_);
  placement::PlacementResult result = placer.Place(prepared, Snapshot());
  if (!result.ok()) return result.status;

  // Legacy IPC slabs: their handle bytes go in the reply, and the session is
  // recorded as holding the slab (it may keep the handle open for its life).
  std::vector<std::string> ipc_handles(result.blocks.size());
  for (size_t i = 0; i < result.blocks.size() && kind == HandleKind::kCudaIpc; ++i) {
    const placement::CarvedBlock& b = result.blocks[i];
    absl::StatusOr<std::string> handle = pools_[b.device]->IpcHandle(
        pool_carver.pool_block(b.id).slab_id, tenant.id, session);
    if (!handle.ok()) {
      for (const placement::CarvedBlock& c : result.blocks) carver->Release(c);
      return handle.status();
    }
    ipc_handles[i] = *std::move(handle);
  }

  v1::AllocateResponse response;
  {
    absl::MutexLock lock(&table_mu_);
    // Checked under the table lock: a session that ends after this point
    // finds these records in OnSessionEnd (see session_registry.h).
    if (sessions_->IsLive(session)) {
      SessionUse& use = by_session_[session];
      for (size_t i = 0; i < result.blocks.size(); ++i) {
        const placement::CarvedBlock& b = result.blocks[i];
        Record r;
        r.session = session;
        r.uid = caller.uid;
        r.pid = caller.pid;
        r.tenant = tenant.id;
        r.device = b.device;
        r.charged = b.size_bytes;
        r.block = pool_carver.pool_block(b.id);
        AppendEvent(ledger::EventKind::kAllocate, b.id, r);
        use.ids.insert(b.id);
        use.bytes += r.block.size;

        const DeviceInfo& d = backend_->devices()[b.device];
        v1::Allocation* a = response.add_allocations();
        a->set_id(b.id);
        a->set_device_index(b.device);
        a->set_device_uuid(d.uuid);
        a->set_slab_id(r.block.slab_id);
        a->set_slab_size_bytes(r.block.slab_size);
        a->set_offset(r.block.offset);
        a->set_size_bytes(r.block.size);
        a->set_handle_kind(ToWire(r.block.kind));
        if (r.block.kind == HandleKind::kCudaIpc) a->set_ipc_handle(ipc_handles[i]);
        allocations_[b.id] = std::move(r);
      }
      counters_.RecordAllocations(result.blocks.size());  // issue 25
      if (options_.quotas != nullptr) {  // issue 25: the tenant's peak counts from here
        uint64_t charged = 0;
        for (const placement::CarvedBlock& b : result.blocks) charged += b.size_bytes;
        options_.quotas->Commit(tenant.id, charged);
      }
      return response;
    }
  }
  // The caller died while we placed: nobody would ever free these.
  for (const placement::CarvedBlock& b : result.blocks) carver->Release(b);
  return absl::FailedPreconditionError("the calling process has exited");
}

std::string MemoryBroker::TenantName(uint32_t id) const {
  if (options_.tenants == nullptr) return absl::StrCat("uid-", id);
  return options_.tenants->Get()->NameOf(id);
}

void MemoryBroker::AppendEvent(ledger::EventKind kind, uint64_t id, const Record& r) {
  if (options_.ledger == nullptr) return;
  ledger::LedgerEvent e;
  e.kind = kind;
  e.tenant = TenantName(r.tenant);
  e.uid = r.uid;
  e.pid = r.pid;
  e.session = r.session;
  e.device = static_cast<int32_t>(r.device);
  e.bytes = r.charged;
  e.allocation_id = id;
  options_.ledger->Append(std::move(e));
}

void MemoryBroker::Return(const std::vector<Record>& records) {
  counters_.RecordFrees(records.size());  // issue 25
  for (const Record& r : records) {
    pools_[r.device]->Release(r.block);
    if (options_.quotas != nullptr) options_.quotas->Credit(r.tenant, r.device, r.charged);
  }
}

void MemoryBroker::ServeWaiters() {
  ++releases_;
  if (waiting_.load() == 0) return;
  absl::MutexLock lock(&wait_mu_);
  for (const auto& [ticket, w] : waiters_.InOrder()) {
    if (!sessions_->IsLive(w->session)) {  // its process exited: dropped
      w->result = absl::FailedPreconditionError("the waiting process has exited");
    } else {
      absl::StatusOr<v1::AllocateResponse> r =
          Place(w->caller, w->tenant, w->session, *w->prepared, w->kind);
      // Still no room: it keeps waiting. Served, or another error: done.
      if (!r.ok() && r.status().code() == absl::StatusCode::kResourceExhausted) continue;
      w->result = std::move(r);
    }
    w->done = true;
    waiters_.Remove(ticket);
  }
}

void MemoryBroker::StopWaiting() {
  absl::MutexLock lock(&wait_mu_);
  stop_waiting_ = true;
  for (const auto& [ticket, w] : waiters_.InOrder()) {
    w->result = ShuttingDown();
    w->done = true;
    waiters_.Remove(ticket);
  }
}

MemoryBroker::Record MemoryBroker::TakeRecordLocked(
    absl::flat_hash_map<uint64_t, Record>::iterator it, ledger::EventKind why) {
  Record r = it->second;
  AppendEvent(why, it->first, r);
  auto s = by_session_.find(r.session);
  if (s != by_session_.end()) {
    s->second.ids.erase(it->first);
    s->second.bytes -= r.block.size;
    if (s->second.ids.empty()) by_session_.erase(s);
  }
  allocations_.erase(it);
  return r;
}

absl::StatusOr<v1::FreeResponse> MemoryBroker::Free(const PeerCred& caller,
                                                    const v1::FreeRequest& request,
                                                    BackendWork work) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  if (request.id() == 0) {
    return absl::InvalidArgumentError("id must be set (allocation ids start at 1)");
  }
  if (request.has_usage()) {
    absl::Status usage_ok = CheckUsage(request.usage());
    if (!usage_ok.ok()) return usage_ok;
  }
  Record r;
  {
    absl::MutexLock lock(&table_mu_);
    auto it = allocations_.find(request.id());
    if (it == allocations_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no live allocation ", request.id(),
          " (never allocated, already freed, or its process exited)"));
    }
    if (caller.uid != 0 && caller.uid != it->second.uid) {
      return absl::PermissionDeniedError(absl::StrCat(
          "allocation ", request.id(), " belongs to uid ", it->second.uid,
          "; uid ", caller.uid, " may not free it"));
    }
    // A dedicated slab goes back to the backend with its block, and waiters
    // are placed (maybe in new slabs) on the releasing thread.
    if (work == BackendWork::kNotHere &&
        (it->second.block.slab_size > options_.pool.slab_size || waiting_.load() > 0)) {
      return NeedsBackendWorkError(it->second.device);
    }
    r = TakeRecordLocked(it, ledger::EventKind::kFree);
  }
  Return({r});
  ServeWaiters();
  if (request.has_usage()) {
    absl::StatusOr<SessionInfo> session = sessions_->Attach(caller);
    if (session.ok()) RecordUsage(session->id, request.usage());
  }
  v1::FreeResponse response;
  response.set_freed_bytes(r.block.size);
  return response;
}

void MemoryBroker::RequestReclaim(uint64_t requester_session, uint64_t bytes_wanted,
                                  const absl::Status& refusal) {
  if (!reclaim_sender_) return;
  std::optional<v1::PlacementRefusal> why = RefusalFromStatus(refusal);
  if (!why.has_value()) return;
  v1::ReclaimRequest reclaim;
  reclaim.set_bytes_wanted(why->size_bytes() != 0 ? why->size_bytes() : bytes_wanted);
  absl::flat_hash_set<uint32_t> refused;
  for (const v1::DeviceRefusal& d : why->devices()) {
    // Only room can be given back: a device refused for quota (or excluded)
    // gains nothing from another session's leases.
    if (d.reason() == v1::DeviceRefusal::REASON_CAPACITY ||
        d.reason() == v1::DeviceRefusal::REASON_FRAGMENTATION) {
      refused.insert(d.device_index());
      reclaim.add_devices(d.device_index());
    }
  }
  if (refused.empty()) return;
  std::vector<uint64_t> targets;
  {
    absl::MutexLock lock(&table_mu_);
    for (const auto& [session, usage] : usage_reports_) {
      if (session == requester_session || usage.leased_bytes() <= usage.in_use_bytes()) {
        continue;
      }
      auto use = by_session_.find(session);
      if (use == by_session_.end()) continue;
      for (uint64_t id : use->second.ids) {
        auto r = allocations_.find(id);
        if (r != allocations_.end() && refused.contains(r->second.device)) {
          targets.push_back(session);
          break;
        }
      }
    }
  }
  for (uint64_t session : targets) reclaim_sender_(session, reclaim);
}

absl::Status MemoryBroker::CheckUsage(const v1::UsageReport& usage) {
  if (usage.in_use_bytes() > usage.leased_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "usage.in_use_bytes ", usage.in_use_bytes(), " exceeds usage.leased_bytes ",
        usage.leased_bytes(), " (in-use bytes are part of the leased bytes)"));
  }
  return absl::OkStatus();
}

void MemoryBroker::RecordUsage(uint64_t session_id, const v1::UsageReport& usage) {
  if (!sessions_->IsLive(session_id)) return;  // ended meanwhile: nothing to show
  absl::MutexLock lock(&table_mu_);
  usage_reports_[session_id] = usage;
}

void MemoryBroker::OnSessionEnd(uint64_t session_id) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return;
  std::vector<Record> records;
  {
    absl::MutexLock lock(&table_mu_);
    auto s = by_session_.find(session_id);
    if (s != by_session_.end()) {
      const std::vector<uint64_t> ids(s->second.ids.begin(), s->second.ids.end());
      for (uint64_t id : ids) {
        records.push_back(
            TakeRecordLocked(allocations_.find(id), ledger::EventKind::kSessionEnd));
      }
    }
  }
  {
    absl::MutexLock lock(&table_mu_);
    usage_reports_.erase(session_id);
  }
  {
    absl::MutexLock lock(&tenant_mu_);
    session_tenants_.erase(session_id);
  }
  Return(records);
  // The process is gone, and with it every handle it held.
  for (auto& pool : pools_) pool->ForgetSession(session_id);
  ServeWaiters();  // also drops this process's own waiters
}

absl::StatusOr<v1::Session> MemoryBroker::GetSession(const PeerCred& caller) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  absl::StatusOr<SessionInfo> s = sessions_->Attach(caller);
  if (!s.ok()) return s.status();
  v1::Session out;
  out.set_session_id(s->id);
  out.set_pid(s->cred.pid);
  out.set_uid(s->cred.uid);
  out.set_gid(s->cred.gid);
  // issue 25: the tenant it is charged to (or would be, if it allocated now).
  if (absl::StatusOr<tenants::TenantRef> t = SessionTenantOf(s->id, caller); t.ok()) {
    out.set_tenant(t->id);
    out.set_tenant_name(t->name);
  }
  return out;
}

// issue 25
absl::StatusOr<tenants::TenantRef> MemoryBroker::SessionTenantOf(
    uint64_t session, const PeerCred& caller) const {
  {
    absl::MutexLock lock(&tenant_mu_);
    auto it = session_tenants_.find(session);
    if (it != session_tenants_.end()) return it->second.tenant;
  }
  return TenantOf(caller);
}

absl::StatusOr<SlabFd> MemoryBroker::ExportSlab(const PeerCred& caller,
                                                uint64_t slab_id) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  absl::StatusOr<SessionInfo> session = sessions_->Attach(caller);
  if (!session.ok()) return session.status();
  absl::StatusOr<tenants::TenantRef> tenant = TenantOfSession(session->id, caller);
  if (!tenant.ok()) return tenant.status();
  for (auto& pool : pools_) {
    absl::StatusOr<SlabPool::Export> e =
        pool->ExportSlab(slab_id, tenant->id, session->id);
    if (e.status().code() == absl::StatusCode::kNotFound) continue;
    if (!e.ok()) return e.status();
    // The holder is recorded. If the session ended before that, its
    // OnSessionEnd may already have forgotten it: forget it here instead,
    // or the slab would stay retained for a session that no longer exists.
    if (!sessions_->IsLive(session->id)) {
      close(e->fd);
      pool->ForgetSession(session->id);
      return absl::FailedPreconditionError("the calling process has exited");
    }
    return SlabFd{e->fd, e->size};
  }
  return absl::NotFoundError(absl::StrCat("no slab ", slab_id));
}

absl::Status MemoryBroker::CloseSlab(const PeerCred& caller, uint64_t slab_id) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  if (caller.pid <= 0 && caller.bound_session == 0) {
    return sessions_->Attach(caller).status();  // PERMISSION_DENIED, saying why
  }
  std::optional<SessionInfo> session = sessions_->Find(caller);
  if (!session.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "slab ", slab_id, " was not given to this process (it has no session)"));
  }
  for (auto& pool : pools_) {
    if (!pool->HasSlab(slab_id)) continue;
    return pool->CloseExport(slab_id, session->id);
  }
  return absl::NotFoundError(absl::StrCat("no slab ", slab_id));
}

absl::StatusOr<SessionInfo> MemoryBroker::BindConnection(const PeerCred& caller) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  return sessions_->BindConnection(caller);
}

void MemoryBroker::EndConnection(uint64_t session_id) {
  sessions_->EndConnection(session_id);  // calls OnSessionEnd
}

absl::StatusOr<uint64_t> MemoryBroker::ResolveSessionToken(absl::string_view token,
                                                           const PeerCred& caller) const {
  return sessions_->ResolveToken(token, caller.uid);
}

v1::GetStatsResponse MemoryBroker::Stats(const PeerCred& caller,
                                         bool include_slabs) const {
  const std::vector<DeviceInfo>& devices = backend_->devices();
  const bool admin = IsAdmin(caller);
  // One snapshot of the directory for the whole answer (names, own tenant).
  const std::shared_ptr<const tenants::TenantDirectory> dir =
      options_.tenants != nullptr ? options_.tenants->Get() : nullptr;
  // The caller's own tenants: the one the directory in force gives it, and
  // those its uid's live sessions are charged to (they may differ after a
  // reload). A caller the config gives no tenant, and no session, sees no
  // tenant's figures.
  absl::flat_hash_set<uint32_t> own_tenants;
  if (!admin) {
    absl::StatusOr<tenants::TenantRef> caller_tenant =
        dir != nullptr ? dir->Resolve(caller.uid, caller.gid) : TenantOf(caller);
    if (caller_tenant.ok()) own_tenants.insert(caller_tenant->id);
    absl::MutexLock lock(&tenant_mu_);
    for (const auto& [session, st] : session_tenants_) {
      if (st.uid == caller.uid) own_tenants.insert(st.tenant.id);
    }
  }
  v1::GetStatsResponse out;
  out.set_backend(backend_->name());
  counters_.Fill(out.mutable_counters());  // issue 25
  absl::ReaderMutexLock gate(&gate_);
  // tenant -> device -> figures; session -> retained bytes.
  absl::flat_hash_map<uint32_t, std::vector<TenantPoolStats>> tenants;
  absl::flat_hash_map<uint64_t, uint64_t> session_retained;
  for (const DeviceInfo& d : devices) {
    PoolStats stats;
    stats.total_bytes = d.total_bytes;
    stats.largest_carvable = d.total_bytes;  // after Shutdown: all free
    std::vector<SlabStats> slabs;
    if (!shut_down_) {
      const SlabPool& pool = *pools_[d.index];
      stats = pool.Stats();
      if (include_slabs) slabs = pool.Slabs();
      for (const auto& [tenant, t] : pool.TenantStats()) {
        if (!admin && !own_tenants.contains(tenant)) continue;
        auto& row = tenants[tenant];
        row.resize(devices.size());
        row[d.index] = t;
      }
      for (const auto& [session, bytes] : pool.SessionRetained()) {
        session_retained[session] += bytes;
      }
    }
    v1::DeviceStats* ds = out.add_devices();
    ds->set_index(d.index);
    ds->set_uuid(d.uuid);
    ds->set_name(d.name);
    ds->set_pci_bus_id(d.pci_bus_id);
    ds->set_numa_node(d.numa_node);
    ds->set_total_bytes(d.total_bytes);
    ds->set_pooled_bytes(stats.pooled_bytes);
    ds->set_used_bytes(stats.used_bytes);
    ds->set_retained_bytes(stats.retained_bytes);
    const uint64_t held = stats.used_bytes + stats.retained_bytes;
    ds->set_free_bytes(held >= d.total_bytes ? 0 : d.total_bytes - held);
    ds->set_largest_free_block_bytes(stats.largest_carvable);
    ds->set_fragmentation(stats.fragmentation);
    ds->set_slab_count(stats.slab_count);
    ds->set_allocation_count(stats.live_blocks);
    ds->set_granularity_bytes(backend_->Granularity(d.index));
    // The driver's own view (no pool lock is held here).
    absl::StatusOr<DriverMemInfo> driver = backend_->DriverMemory(d.index);
    if (driver.ok()) {
      ds->set_driver_free_bytes(driver->free_bytes);
      ds->set_driver_total_bytes(driver->total_bytes);
    }
    for (v1::PeerLink link : peer_rows_[d.index]) ds->add_peers(link);
    for (const SlabStats& slab : slabs) {
      // Slab figures are device figures, but whose slab it is is not.
      v1::SlabStats* out_slab = ds->add_slabs();
      out_slab->set_slab_id(slab.slab_id);
      out_slab->set_size_bytes(slab.size);
      out_slab->set_used_bytes(slab.used_bytes);
      out_slab->set_free_bytes(slab.free_bytes);
      out_slab->set_largest_free_bytes(slab.largest_free);
      out_slab->set_fragmentation(slab.fragmentation);
      out_slab->set_live_blocks(slab.live_blocks);
      out_slab->set_dedicated(slab.dedicated);
      out_slab->set_reserved(slab.reserved);
      out_slab->set_retained(slab.retained);
      if (admin || own_tenants.contains(slab.tenant)) {
        out_slab->set_tenant(slab.tenant);
        out_slab->set_holders(slab.holders);
      }
    }
  }
  for (uint32_t t : counters_.WaitingTenants()) {  // issue 25: waiting tenants have a row
    if (admin || own_tenants.contains(t)) tenants[t].resize(devices.size());
  }
  for (const auto& [tenant, rows] : tenants) {
    v1::TenantStats* ts = out.add_tenants();
    ts->set_tenant(tenant);
    ts->set_name(dir != nullptr ? dir->NameOf(tenant) : absl::StrCat("uid-", tenant));
    if (options_.quotas != nullptr) {  // absent: no quota
      const tenants::Quota quota = options_.quotas->GetQuota(tenant);
      if (!quota.unlimited()) QuotaToProto(quota, ts->mutable_quota());
    }
    uint64_t used = 0, retained = 0, blocks = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const TenantPoolStats& t = rows[i];
      if (t.used_bytes == 0 && t.retained_bytes == 0 && t.slab_count == 0) continue;
      v1::TenantDeviceStats* td = ts->add_devices();
      td->set_device_index(static_cast<uint32_t>(i));
      td->set_used_bytes(t.used_bytes);
      td->set_retained_bytes(t.retained_bytes);
      td->set_slab_count(t.slab_count);
      used += t.used_bytes;
      retained += t.retained_bytes;
      blocks += t.live_blocks;
    }
    ts->set_used_bytes(used);
    ts->set_retained_bytes(retained);
    ts->set_allocation_count(blocks);
    // issue 25: peak (the quota book counts every tenant's charges) and waiting.
    if (options_.quotas != nullptr) {
      ts->set_peak_bytes(options_.quotas->Holdings(tenant).peak_total_bytes);
    }
    ts->set_waiting_requests(counters_.WaitingOf(tenant));
  }
  std::sort(out.mutable_tenants()->begin(), out.mutable_tenants()->end(),
            [](const v1::TenantStats& a, const v1::TenantStats& b) {
              return a.tenant() < b.tenant();
            });
  if (shut_down_) return out;
  absl::MutexLock lock(&table_mu_);
  for (const SessionInfo& info : sessions_->List()) {
    if (!admin && info.cred.uid != caller.uid) continue;
    v1::SessionStats* ss = out.add_sessions();
    ss->set_session_id(info.id);
    ss->set_pid(info.cred.pid);
    ss->set_uid(info.cred.uid);
    ss->set_gid(info.cred.gid);
    auto s = by_session_.find(info.id);
    ss->set_allocation_count(s == by_session_.end() ? 0 : s->second.ids.size());
    const uint64_t used = s == by_session_.end() ? 0 : s->second.bytes;
    ss->set_used_bytes(used);
    // A report is the client's word: never show more leased than it holds.
    auto u = usage_reports_.find(info.id);
    const uint64_t leased =
        u == usage_reports_.end() ? 0 : std::min(u->second.leased_bytes(), used);
    ss->set_leased_bytes(leased);
    ss->set_in_use_bytes(u == usage_reports_.end()
                             ? 0
                             : std::min(u->second.in_use_bytes(), leased));
    auto r = session_retained.find(info.id);
    ss->set_retained_bytes(r == session_retained.end() ? 0 : r->second);
  }
  return out;
}

}  // namespace gpumem
