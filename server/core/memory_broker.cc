// An Allocate: check the request (no state read), attach the caller's
// session, fix its tenant, then place it with a PoolCarver (under the quota
// adaptor) over the device pools; each pool locks itself, and placement
// re-checks what a snapshot promised by carving, so the snapshot may be
// slightly stale without double-promising anything. Carved blocks stay
// pending in the carver until the allocation table commits them for the
// session; if the session ended meanwhile the commit fails and the blocks
// go back. A request that may wait and finds no room (or that is held while
// other sessions give back idle leases) becomes a RequestWaiter in
// admission. Requests behind a reserving waiter carve through the
// ReservingCarver (fair waiting).
#include "server/core/memory_broker.h"

#include <unistd.h>

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/byte_size.h"
#include "server/pool/reserving_carver.h"
#include "server/quota/quota_carver.h"
#include "server/session/free_permission.h"

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

std::string KindList(const std::vector<HandleKind>& kinds) {
  std::string out;
  for (HandleKind k : kinds) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", v1::HandleKind_Name(ToWire(k)));
  }
  return out;
}

// What Free answers for an id the table does not have
// (AllocationTable::Take's words), and so for another's allocation to a
// non-admin: the two must not be told apart.
absl::Status NoLiveAllocation(uint64_t id) {
  return absl::NotFoundError(absl::StrCat(
      "no live allocation ", id, " (never allocated, already freed, or its process exited)"));
}

// What the slab channel answers for a slab id the caller may not have,
// whether no slab has it or another tenant's does (non-admins).
absl::Status NoSlab(uint64_t slab_id) {
  return absl::NotFoundError(absl::StrCat("no slab ", slab_id));
}

bool IsRefusal(const absl::StatusOr<v1::AllocateResponse>& answer) {
  return !answer.ok() && answer.status().code() == absl::StatusCode::kResourceExhausted;
}

// A client's caching-pool usage report, checked before the request is
// served.
absl::Status CheckUsage(const v1::UsageReport& usage) {
  if (usage.in_use_bytes() > usage.leased_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "usage.in_use_bytes ", usage.in_use_bytes(), " exceeds usage.leased_bytes ",
        usage.leased_bytes(), " (in-use bytes are part of the leased bytes)"));
  }
  return absl::OkStatus();
}

UsageFigures FiguresOf(const v1::UsageReport& usage) {
  return UsageFigures{usage.leased_bytes(), usage.in_use_bytes()};
}

}  // namespace

// An Allocate that waits in admission. Runs on admission's thread only.
class MemoryBroker::RequestWaiter final : public admission::Waiter {
 public:
  RequestWaiter(MemoryBroker* broker, const PeerCred& caller,
                std::shared_ptr<Session> session, const tenants::TenantRef& tenant,
                Prepared prepared, absl::Time deadline, AllocateCallback done)
      : admission::Waiter(session->id(), tenant.id, tenant.name, tenant.priority,
                          tenant.max_waiting_requests, deadline),
        broker_(broker),
        caller_(caller),
        session_(std::move(session)),
        tenant_ref_(tenant),
        prepared_(std::move(prepared)),
        done_(std::move(done)) {}

  std::optional<admission::Answer> TryServe(const admission::Reservation* ahead) override {
    AllocateAnswer answer = Attempt(ahead);
    if (IsRefusal(answer)) return std::nullopt;  // still no room: keeps waiting
    return answer;
  }
  admission::Answer Expire(const admission::Reservation* ahead) override {
    return Attempt(ahead);
  }
  void Done(admission::Answer answer) override {
    done_(broker_->Finish(std::move(answer), *session_, prepared_));
  }
  bool WantsRoom() const override { return wants_room_; }
  // The refusal it was queued after.
  void set_wants_room(bool wants) { wants_room_ = wants; }
  // Reads only the pools (each locks itself) and the claim, fixed before
  // Enqueue: safe from any thread.
  std::vector<uint32_t> FittingDevices() const override {
    return DevicesThatCouldHold(broker_->pools_, claim().tenant, claim().devices,
                                claim().bytes);
  }
  // What the daemon keeps for it while it waits: this object with its
  // prepared form (device indices and sizes; none of the request's
  // strings), its claim, and `request` as its transport keeps it until it
  // is answered. Call once the claim and any reclaim hold are set.
  uint64_t HeldBytes(const v1::AllocateRequest& request) const {
    const placement::PreparedRequest& p = prepared_.placement;
    uint64_t n = sizeof(*this) + request.SpaceUsedLong();
    for (const std::vector<uint32_t>& stage : p.placement.stages) {
      n += sizeof(stage) + stage.capacity() * sizeof(uint32_t);
    }
    n += p.placement.excluded.capacity() * sizeof(uint32_t);
    n += p.plan.sizes.capacity() * sizeof(uint64_t);
    n += claim().devices.capacity() * sizeof(uint32_t) + claim().what.capacity();
    n += tenant_name().capacity() + tenant_ref_.name.capacity();
    n += reclaim_from().capacity() * sizeof(uint64_t);
    return n;
  }

 private:
  AllocateAnswer Attempt(const admission::Reservation* ahead) {
    absl::ReaderMutexLock gate(&broker_->gate_);
    if (broker_->shut_down_) return broker_->ShuttingDown();
    // Its session ended (EndTenant marks them ended behind the gate): not
    // even a carve that would be given back, which could leave a slab for
    // a tenant that is gone.
    if (session_->ended()) {
      return CallerExitedError();
    }
    AllocateAnswer answer = broker_
        ->Place(caller_, *session_, tenant_ref_, prepared_, PoolCarver::Mode::kMayCallBackend,
                ahead)
        .answer;
    wants_room_ = IsRefusal(answer) && admission::RefusedForRoom(answer.status());
    return answer;
  }

  MemoryBroker* const broker_;
  const PeerCred caller_;
  const std::shared_ptr<Session> session_;
  const tenants::TenantRef tenant_ref_;
  const Prepared prepared_;
  const AllocateCallback done_;
  bool wants_room_ = true;
};

absl::Status MemoryBroker::StoppingError() {
  return absl::UnavailableError(
      "gpumemd is stopping: it takes no new allocations; retry once it is back");
}

absl::Status MemoryBroker::ShuttingDown() const {
  if (restarting_.load()) {
    return absl::UnavailableError(
        "gpumemd is restarting: send the request again once it is back");
  }
  return absl::FailedPreconditionError("gpumemd is shutting down");
}

MemoryBroker::MemoryBroker(Backend* backend, BrokerOptions options)
    : backend_(backend),
      options_(std::move(options)),
      own_tenants_(options_.tenants == nullptr
                       ? std::make_unique<tenants::TenantDirectoryHolder>(tenants::TenantDirectory())
                       : nullptr),
      tenants_(options_.tenants != nullptr ? options_.tenants : own_tenants_.get()),
      pools_(backend, options_.pool),
      table_(options_.ledger, [this](uint32_t tenant) { return TenantName(tenant); },
             options_.state),
      admission_(options_.admission),
      session_tenants_(tenants_),
      reclaim_wait_ms_(absl::ToInt64Milliseconds(options_.reclaim_wait)) {
  if (options_.slab_keeper != nullptr) {
    for (uint32_t d = 0; d < pools_.size(); ++d) pools_.pool(d).SetKeeper(options_.slab_keeper);
  }
  placer_options_.default_alignment = options_.default_alignment;
  for (const DeviceInfo& d : backend_->devices()) {
    std::vector<PeerLink>& row = peer_rows_.emplace_back();
    for (const DeviceInfo& peer : backend_->devices()) {
      row.push_back(backend_->Peer(d.index, peer.index));
    }
  }
  sessions_ = std::make_unique<SessionRegistry>(
      [this](const std::shared_ptr<Session>& session, std::vector<uint64_t> ids) {
        OnSessionEnd(session, std::move(ids));
      },
      options_.state);
  Restorer::Rooms rooms;
  rooms.backend = backend_;
  rooms.pools = &pools_;
  rooms.sessions = sessions_.get();
  rooms.session_tenants = &session_tenants_;
  rooms.admins = &admins_;
  rooms.table = &table_;
  rooms.directory = tenants_;
  rooms.quotas = options_.quotas;
  rooms.state = options_.state;
  rooms.give_back = [this](const std::vector<AllocationRecord>& records) { Return(records); };
  restorer_ = std::make_unique<Restorer>(std::move(rooms), options_.restore_grace);
  if (options_.quotas != nullptr) {  // quotas count retained bytes, and bound slabs
    pools_.SetBudget(&options_.quotas->footprint());
    options_.quotas->SetRetainedSource([this](uint32_t tenant, uint32_t device) {
      return pools_.pool(device).TenantRetained(tenant);
    });
  }
}

MemoryBroker::~MemoryBroker() {
  Shutdown();
  if (options_.quotas != nullptr) options_.quotas->SetRetainedSource(nullptr);
  sessions_.reset();  // joins the watcher before the table and pools go
  pools_.SetBudget(nullptr);  // every slab went back in Shutdown; none is made now
}

absl::Status MemoryBroker::SetAdminGroup(const std::string& group) {
  return admins_.Set(group);
}

void MemoryBroker::BeginDrain() { draining_.store(true); }

void MemoryBroker::StopWaiting() { admission_.Stop(ShuttingDown()); }

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

size_t MemoryBroker::live_allocations() const { return table_.size(); }

void MemoryBroker::SetEmptySlabRelease(absl::Duration after) {
  pools_.SetEmptyReleaseAfter(after);
}

void MemoryBroker::SetReclaimWait(absl::Duration wait) {
  reclaim_wait_ms_.store(std::max<int64_t>(0, absl::ToInt64Milliseconds(wait)));
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
  if (absl::Status reserved = pools_.Reserve(); !reserved.ok()) return reserved;
  maintenance_ = std::thread([this] { Maintain(); });
  return absl::OkStatus();
}

void MemoryBroker::Maintain() {
  absl::MutexLock stop(&stop_mu_);
  while (!stopping_) {
    stop_mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.maintenance_interval);
    if (stopping_) break;
    const absl::Time now = absl::Now();
    pools_.ReleaseIdleSlabs(now);
    if (restorer_->GraceOver(now)) {
      stop_mu_.Unlock();  // FinishRestore takes the gate, as every call does
      FinishRestore();
      stop_mu_.Lock();
    }
  }
}

void MemoryBroker::Shutdown() {
  {
    absl::MutexLock stop(&stop_mu_);
    stopping_ = true;
  }
  if (maintenance_.joinable()) maintenance_.join();
  admission_.Stop(ShuttingDown());  // waiters' attempts hold the gate shared
  absl::WriterMutexLock gate(&gate_);
  if (shut_down_) return;
  shut_down_ = true;
  counters_.Returned(table_.Clear(ledger::EventKind::kDaemonStop).size());
  pools_.ReleaseAll();  // retained slabs too
  if (options_.state != nullptr) options_.state->Clear();  // nothing left to carry over
}

void MemoryBroker::ShutdownForRestart() {
  {
    absl::MutexLock stop(&stop_mu_);
    stopping_ = true;
  }
  if (maintenance_.joinable()) maintenance_.join();
  restarting_.store(true);
  admission_.Stop(ShuttingDown());  // restarting_ is set: "gpumemd is restarting"
  // Once no call is in flight (every answer given was recorded), what is
  // kept stays as it is now, for the next daemon: no event, no release.
  absl::WriterMutexLock gate(&gate_);
  if (shut_down_) return;
  if (options_.state != nullptr) options_.state->Freeze();
  if (options_.slab_keeper != nullptr) options_.slab_keeper->Freeze();
  shut_down_ = true;
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

MemoryBroker::AllocateAnswer MemoryBroker::Finish(AllocateAnswer answer, Session& session,
                                                  const Prepared& prepared) {
  if (answer.ok()) {
    // The client's usage report counts this request as done: kept only
    // when it is.
    if (prepared.usage.has_value()) session.RecordUsage(*prepared.usage);
    counters_.Allocated(answer->allocations_size());
  } else {
    counters_.Refused(answer.status());
  }
  return answer;
}

MemoryBroker::AllocateOutcome MemoryBroker::TryAllocate(const PeerCred& caller,
                                                        const v1::AllocateRequest& request,
                                                        AllocateCallback on_waited) {
  return Serve(caller, request, std::move(on_waited), PoolCarver::Mode::kExistingSlabsOnly);
}

MemoryBroker::AllocateOutcome MemoryBroker::Allocate(const PeerCred& caller,
                                                     const v1::AllocateRequest& request,
                                                     AllocateCallback on_waited) {
  return Serve(caller, request, std::move(on_waited), PoolCarver::Mode::kMayCallBackend);
}

MemoryBroker::AllocateAnswer MemoryBroker::AllocateAndWait(const PeerCred& caller,
                                                           const v1::AllocateRequest& request) {
  // A mutex and Await rather than absl::Notification: Notification waits
  // inside Debian's uninstrumented Abseil, where TSan builds cannot see it
  // synchronize (common/tsan_support.cc makes Lock and Await visible).
  struct Waited {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    AllocateAnswer answer ABSL_GUARDED_BY(mu);
  };
  auto waited = std::make_shared<Waited>();
  AllocateOutcome outcome = Allocate(caller, request, [waited](AllocateAnswer answer) {
    absl::MutexLock lock(&waited->mu);
    waited->answer = std::move(answer);
    waited->done = true;
  });
  if (outcome.kind != AllocateOutcome::Kind::kWaiting) return std::move(outcome.answer);
  absl::MutexLock lock(&waited->mu);
  waited->mu.Await(absl::Condition(&waited->done));
  return std::move(waited->answer);
}

void MemoryBroker::CancelWait(uint64_t ticket) { admission_.Cancel(ticket); }

MemoryBroker::AllocateOutcome MemoryBroker::Serve(const PeerCred& caller,
                                                  const v1::AllocateRequest& request,
                                                  AllocateCallback on_waited,
                                                  PoolCarver::Mode mode) {
  AllocateOutcome out;
  auto answered = [&out](AllocateAnswer a) {
    out.kind = AllocateOutcome::Kind::kAnswered;
    out.answer = std::move(a);
    return std::move(out);
  };
  // Every refused request is counted once, with its final answer.
  auto refused = [&](absl::Status status) {
    counters_.Refused(status);
    return answered(std::move(status));
  };
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return refused(ShuttingDown());
  if (draining_.load()) {
    return refused(StoppingError());
  }
  if (request.shard_count() == 0 && request.shard_sizes_size() == 0 &&
      request.size_bytes() > pools_.largest_device_bytes()) {
    return refused(absl::InvalidArgumentError(absl::StrCat(
        "size_bytes ", request.size_bytes(), " (", FormatBytes(request.size_bytes()),
        ") is larger than any device (largest: ", FormatBytes(pools_.largest_device_bytes()),
        ")")));
  }
  if (request.alignment() > options_.max_alignment) {
    return refused(absl::InvalidArgumentError(absl::StrCat(
        "alignment ", request.alignment(), " exceeds the daemon's maximum, ",
        options_.max_alignment, " (--max_alignment, DaemonConfig.pool.max_alignment)")));
  }
  Prepared prepared;
  absl::StatusOr<std::shared_ptr<Session>> session;
  absl::StatusOr<tenants::TenantRef> tenant;
  {
    absl::Status checked;
    absl::StatusOr<HandleKind> kind = RequestedKind(request);
    if (!kind.ok()) checked = kind.status();
    if (checked.ok() && request.has_usage()) checked = CheckUsage(request.usage());
    if (checked.ok()) checked = admission_.CheckWait(request.wait_ms());
    if (checked.ok()) {
      session = sessions_->Attach(caller);
      if (!session.ok()) checked = session.status();
    }
    if (checked.ok()) {
      absl::StatusOr<placement::PreparedRequest> placement =
          placement::PrepareRequest(request, pools_.views(), placer_options_);
      if (!placement.ok()) checked = placement.status();
      if (checked.ok()) {
        prepared.placement = *std::move(placement);
        prepared.kind = *kind;
        prepared.size_bytes = request.size_bytes();
        prepared.request_key = request.request_key();
        if (request.has_usage()) prepared.usage = FiguresOf(request.usage());
        tenant = session_tenants_.Charge(**session, caller);
        if (!tenant.ok()) checked = tenant.status();
      }
    }
    if (!checked.ok()) return refused(checked);
  }
  // A retry whose first attempt a previous daemon carried out: its
  // allocations, not new ones (which the tenant's quota, still charged for
  // them, may refuse).
  if (prepared.request_key != 0) {
    if (std::optional<v1::AllocateResponse> again = RetakeByKey(**session, prepared)) {
      return answered(Finish(*std::move(again), **session, prepared));
    }
  }

  const uint64_t seen = admission_.kicks();
  // A fresh request comes after every waiter of its priority and below.
  const std::optional<admission::Reservation> ahead = admission_.ReservationAhead(tenant->priority);
  Placed placed = Place(caller, **session, *tenant, prepared, mode,
                        ahead.has_value() ? &*ahead : nullptr);
  if (placed.needs_backend_work) {
    out.kind = AllocateOutcome::Kind::kNeedsBackendWork;
    return out;
  }
  if (placed.answer.ok()) admission_.NoteServed(tenant->priority);
  const bool was_refused = IsRefusal(placed.answer);
  admission::ReclaimAsked asked;
  if (was_refused) {
    asked = admission::AskForReclaims(reclaim_sender_, *sessions_, (*session)->id(),
                                      request.size_bytes(), placed.answer.status());
  }
  const absl::Duration reclaim_wait = absl::Milliseconds(reclaim_wait_ms_.load());
  // Held while the sessions asked give back what could serve it.
  const bool hold = asked.could_cover && reclaim_wait > absl::ZeroDuration();
  if (!was_refused || !on_waited || (request.wait_ms() == 0 && !hold)) {
    return answered(Finish(std::move(placed.answer), **session, prepared));
  }
  // Nothing can serve it now: it waits in admission, holding no thread.
  const absl::Time now = absl::Now();
  const absl::Time own_deadline = now + absl::Milliseconds(request.wait_ms());
  auto waiter = std::make_unique<RequestWaiter>(
      this, caller, *session, *tenant, prepared,
      hold ? std::max(own_deadline, now + reclaim_wait) : own_deadline, std::move(on_waited));
  waiter->set_wants_room(admission::RefusedForRoom(placed.answer.status()));
  waiter->set_claim(ClaimOf(prepared, *tenant));
  if (hold) waiter->HoldForReclaim(std::move(asked.sessions), own_deadline);
  waiter->set_held_bytes(waiter->HeldBytes(request));
  std::unique_ptr<admission::Waiter> queued = std::move(waiter);
  absl::StatusOr<uint64_t> ticket = admission_.Enqueue(queued, seen);
  if (!ticket.ok()) {
    // Too many of its tenant's requests wait already: refused by name (a
    // request that did not ask to wait gets its refusal). Admission stopped
    // (shutting down): the usual refusal.
    AllocateAnswer a = ticket.status().code() == absl::StatusCode::kResourceExhausted &&
                               request.wait_ms() != 0
                           ? AllocateAnswer(ticket.status())
                           : std::move(placed.answer);
    return answered(Finish(std::move(a), **session, prepared));
  }
  out.kind = AllocateOutcome::Kind::kWaiting;
  out.wait_ticket = *ticket;
  return out;
}

absl::StatusOr<tenants::TenantRef> MemoryBroker::TenantOf(const PeerCred& caller) const {
  return tenants_->Get()->ResolveCaller(caller.uid, caller.gid, caller.socket_tenant);
}

admission::Claim MemoryBroker::ClaimOf(const Prepared& prepared,
                                       const tenants::TenantRef& tenant) const {
  admission::Claim claim;
  claim.tenant = tenant.id;
  claim.kind = prepared.kind;
  for (const std::vector<uint32_t>& stage : prepared.placement.placement.stages) {
    claim.devices.insert(claim.devices.end(), stage.begin(), stage.end());
  }
  for (uint64_t size : prepared.placement.plan.sizes) claim.bytes = std::max(claim.bytes, size);
  claim.what = absl::StrCat("an earlier waiting request of tenant \"", tenant.name, "\" (",
                            FormatBytes(prepared.placement.plan.total_bytes), ")");
  return claim;
}

MemoryBroker::Placed MemoryBroker::Place(const PeerCred& caller, Session& session,
                                         const tenants::TenantRef& tenant,
                                         const Prepared& prepared, PoolCarver::Mode mode,
                                         const admission::Reservation* ahead) {
  // The pool carves from this tenant's slabs; the quota adaptor charges the
  // tenant before the pool carves; behind a reserving waiter, the reserving
  // adaptor keeps its room (it undoes a carve before quota is credited).
  PoolCarver pool_carver(&pools_, tenant.id, prepared.kind, mode);
  placement::DeviceCarver* carver = &pool_carver;
  std::optional<ReservingCarver> reserving_carver;
  if (ahead != nullptr) {
    ReservedRoom room;
    room.tenant = ahead->claim.tenant;
    room.kind = ahead->claim.kind;
    room.devices = ahead->claim.devices;
    room.bytes = ahead->claim.bytes;
    room.what = ahead->claim.what;
    carver = &reserving_carver.emplace(carver, &pools_, std::move(room));
  }
  std::optional<quota::QuotaCarver> quota_carver;
  if (options_.quotas != nullptr) {
    carver = &quota_carver.emplace(carver, options_.quotas, tenant.id, tenant.name);
  }
  placement::Placer placer(carver, placer_options_);
  placement::PlacementResult result = placer.Place(prepared.placement, pools_.Snapshot());
  Placed placed;
  if (!result.ok()) {
    placed.needs_backend_work = pool_carver.needed_backend_work();
    placed.answer = result.status;
    return placed;
  }
  // Blocks were carved through every adaptor; from here on they are given
  // back through the outermost one.
  auto give_back = [&] {
    for (const placement::CarvedBlock& b : result.blocks) carver->Release(b);
  };

  // Legacy IPC slabs: their handle bytes go in the reply, and the session is
  // recorded as holding the slab (it may keep the handle open for its life).
  std::vector<std::string> ipc_handles(result.blocks.size());
  for (size_t i = 0; i < result.blocks.size() && prepared.kind == HandleKind::kCudaIpc; ++i) {
    const placement::CarvedBlock& b = result.blocks[i];
    absl::StatusOr<std::string> handle =
        pools_.pool(b.device).IpcHandle(b.slab_id, tenant.id, session.id());
    if (!handle.ok()) {
      give_back();
      placed.answer = handle.status();
      return placed;
    }
    ipc_handles[i] = *std::move(handle);
  }

  std::vector<AllocationRecord> records;
  records.reserve(result.blocks.size());
  for (const placement::CarvedBlock& b : result.blocks) {
    AllocationRecord& r = records.emplace_back();
    r.uid = caller.uid;
    r.pid = caller.pid;
    r.tenant = tenant.id;
    r.device = b.device;
    r.charged = b.size_bytes;
    r.block = pool_carver.block(b);
    r.request_key = prepared.request_key;
  }
  absl::StatusOr<std::vector<uint64_t>> ids = table_.Commit(session, records);
  if (!ids.ok()) {
    give_back();
    // The caller died while we placed: nobody would ever free these, and
    // nobody holds a handle it may just have been recorded as given. (The
    // other refusal, a state file with no room for the records, leaves a
    // live session with what it holds.)
    if (absl::IsFailedPrecondition(ids.status())) pools_.ForgetSession(session.id());
    placed.answer = ids.status();
    return placed;
  }
  pool_carver.Take();
  // The tenant's peak counts committed allocations only (quota_book.h).
  if (quota_carver.has_value()) quota_carver->Commit();

  v1::AllocateResponse response;
  for (size_t i = 0; i < records.size(); ++i) {
    const AllocationRecord& r = records[i];
    v1::Allocation* a = response.add_allocations();
    Describe((*ids)[i], r, a);
    if (r.block.kind == HandleKind::kCudaIpc) a->set_ipc_handle(ipc_handles[i]);
  }
  placed.answer = std::move(response);
  return placed;
}

void MemoryBroker::Describe(uint64_t id, const AllocationRecord& r, v1::Allocation* a) const {
  const DeviceInfo& d = backend_->devices()[r.device];
  a->set_id(id);
  a->set_device_index(r.device);
  a->set_device_uuid(d.uuid);
  a->set_slab_id(r.block.slab_id);
  a->set_slab_size_bytes(r.block.slab_size);
  a->set_offset(r.block.offset);
  a->set_size_bytes(r.block.size);
  a->set_handle_kind(ToWire(r.block.kind));
}

std::string MemoryBroker::TenantName(uint32_t id) const {
  if (std::optional<std::string> restored = restorer_->RestoredTenantName(id)) {
    return *std::move(restored);
  }
  return tenants_->Get()->NameOf(id);
}

void MemoryBroker::Return(const std::vector<AllocationRecord>& records) {
  if (records.empty()) return;
  for (const AllocationRecord& r : records) {
    pools_.pool(r.device).Release(r.block);
    if (options_.quotas != nullptr) options_.quotas->Credit(r.tenant, r.device, r.charged);
  }
  counters_.Returned(records.size());
  admission_.Kick();
}

std::optional<absl::StatusOr<v1::FreeResponse>> MemoryBroker::TryFree(
    const PeerCred& caller, const v1::FreeRequest& request) {
  bool needs_backend_work = false;
  absl::StatusOr<v1::FreeResponse> r = FreeIn(caller, request, &needs_backend_work);
  if (needs_backend_work) return std::nullopt;
  return r;
}

absl::StatusOr<v1::FreeResponse> MemoryBroker::Free(const PeerCred& caller,
                                                    const v1::FreeRequest& request) {
  return FreeIn(caller, request, nullptr);
}

absl::StatusOr<v1::FreeResponse> MemoryBroker::FreeIn(const PeerCred& caller,
                                                      const v1::FreeRequest& request,
                                                      bool* needs_backend_work) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  if (request.id() == 0) {
    return absl::InvalidArgumentError("id must be set (allocation ids start at 1)");
  }
  if (request.has_usage()) {
    if (absl::Status usage_ok = CheckUsage(request.usage()); !usage_ok.ok()) return usage_ok;
  }
  // Another's allocation: for a non-admin, answered exactly as an id that
  // does not exist (no oracle of live ids or owners); admins, decided
  // outside the table's lock (the group lookup may read files), get the
  // precise refusal.
  std::optional<absl::Status> not_callers;
  absl::StatusOr<AllocationRecord> taken = table_.Take(
      request.id(),
      [&](const AllocationRecord& r) -> absl::Status {
        if (absl::Status may = MayFree(caller, request.id(), r.uid, r.tenant, r.session->cred());
            !may.ok()) {
          not_callers = may;
          return may;
        }
        // A dedicated slab goes back to the backend with its block.
        if (needs_backend_work != nullptr && r.block.dedicated) {
          *needs_backend_work = true;
          return absl::AbortedError("kept: releasing it needs backend work");
        }
        return absl::OkStatus();
      },
      ledger::EventKind::kFree);
  if (not_callers.has_value()) {
    return IsAdmin(caller) ? *not_callers : NoLiveAllocation(request.id());
  }
  if (needs_backend_work != nullptr && *needs_backend_work) return taken.status();
  if (!taken.ok()) return taken.status();
  Return({*taken});
  if (request.has_usage()) {
    absl::StatusOr<std::shared_ptr<Session>> session = sessions_->Attach(caller);
    if (session.ok()) (*session)->RecordUsage(FiguresOf(request.usage()));
  }
  v1::FreeResponse response;
  response.set_freed_bytes(taken->block.size);
  return response;
}

void MemoryBroker::ReclaimAnswered(const PeerCred& caller) {
  std::shared_ptr<Session> session = sessions_->Find(caller);
  if (session != nullptr) admission_.ReclaimAnswered(session->id());
}

void MemoryBroker::OnSessionEnd(const std::shared_ptr<Session>& session,
                                std::vector<uint64_t> ids) {
  {
    absl::ReaderMutexLock gate(&gate_);
    if (shut_down_) return;
    Return(table_.TakeAll(ids, ledger::EventKind::kSessionEnd));
    // The process is gone, and with it every handle it held.
    pools_.ForgetSession(session->id());
  }
  admission_.SessionEnded(session->id());  // its waiters are answered now
  session_tenants_.Ended(session->id());
  absl::ReaderMutexLock listening(&session_end_mu_);
  if (session_end_listener_ != nullptr) session_end_listener_(session->id());
}

void MemoryBroker::SetSessionEndListener(SessionEndListener listener) {
  absl::MutexLock l(&session_end_mu_);
  session_end_listener_ = std::move(listener);
}

absl::StatusOr<std::shared_ptr<Session>> MemoryBroker::SessionOf(const PeerCred& caller) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  return sessions_->Attach(caller);
}

absl::StatusOr<v1::Session> MemoryBroker::GetSession(const PeerCred& caller) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  absl::StatusOr<std::shared_ptr<Session>> s = sessions_->Attach(caller);
  if (!s.ok()) return s.status();
  v1::Session out;
  out.set_session_id((*s)->id());
  out.set_pid((*s)->cred().pid);
  out.set_uid((*s)->cred().uid);
  out.set_gid((*s)->cred().gid);
  // The tenant it is charged to (fixed at its first allocation), or the one
  // a first allocation now would be charged to; named as GetStats names it.
  std::optional<tenants::TenantRef> tenant = (*s)->tenant();
  if (!tenant.has_value()) {
    absl::StatusOr<tenants::TenantRef> now = TenantOf(caller);
    if (now.ok()) tenant = *std::move(now);
  }
  if (tenant.has_value()) {
    out.set_tenant(tenant->id);
    out.set_tenant_name(TenantName(tenant->id));
  }
  return out;
}

absl::StatusOr<SlabFd> MemoryBroker::ExportSlab(const PeerCred& caller, uint64_t slab_id) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  absl::StatusOr<std::shared_ptr<Session>> session = sessions_->Attach(caller);
  if (!session.ok()) return session.status();
  absl::StatusOr<tenants::TenantRef> tenant = session_tenants_.Charge(**session, caller);
  if (!tenant.ok()) return tenant.status();
  for (uint32_t d = 0; d < pools_.size(); ++d) {
    SlabPool& pool = pools_.pool(d);
    absl::StatusOr<SlabPool::Export> e = pool.ExportSlab(slab_id, tenant->id, (*session)->id());
    if (e.status().code() == absl::StatusCode::kNotFound) continue;
    // Another tenant's slab: to a non-admin, as if there were none.
    if (e.status().code() == absl::StatusCode::kPermissionDenied && !IsAdmin(caller)) {
      return NoSlab(slab_id);
    }
    if (!e.ok()) return e.status();
    // The holder is recorded. If the session ended before that, its end may
    // already have forgotten it: forget it here instead, or the slab would
    // stay retained for a session that no longer exists.
    if ((*session)->ended()) {
      close(e->fd);
      pool.ForgetSession((*session)->id());
      return CallerExitedError();
    }
    return SlabFd{e->fd, e->size};
  }
  return NoSlab(slab_id);
}

absl::Status MemoryBroker::CloseSlab(const PeerCred& caller, uint64_t slab_id) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  if (caller.pid <= 0 && caller.bound_session == 0) {
    return sessions_->Attach(caller).status();  // PERMISSION_DENIED, saying why
  }
  // A slab not given to this process, whether it exists or not (another
  // tenant's, say), is one answer to a non-admin; admins get the reason.
  auto not_given = [&](absl::Status precise) {
    return IsAdmin(caller) ? precise : NoSlab(slab_id);
  };
  std::shared_ptr<Session> session = sessions_->Find(caller);
  if (session == nullptr) {
    return not_given(absl::NotFoundError(absl::StrCat(
        "slab ", slab_id, " was not given to this process (it has no session)")));
  }
  SlabPool* pool = pools_.PoolOfSlab(slab_id);
  if (pool == nullptr) return NoSlab(slab_id);
  absl::Status closed = pool->CloseExport(slab_id, session->id());
  if (closed.ok()) admission_.Kick();  // a retained slab may have gone back
  if (closed.code() == absl::StatusCode::kNotFound) return not_given(closed);
  return closed;
}

absl::StatusOr<std::shared_ptr<Session>> MemoryBroker::BindConnection(const PeerCred& caller) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  return sessions_->BindConnection(caller);
}

void MemoryBroker::EndConnection(uint64_t session_id) {
  sessions_->EndConnection(session_id);  // calls OnSessionEnd
}

absl::StatusOr<uint64_t> MemoryBroker::ResolveSessionToken(absl::string_view token,
                                                           const PeerCred& caller) const {
  return sessions_->ResolveToken(token, caller);
}

// ---- A restart: the Restorer answers, inside the call gate ----

MemoryBroker::RestoreOutcome MemoryBroker::Restore(const state::Snapshot& previous,
                                                   std::map<uint64_t, int> slab_fds) {
  absl::ReaderMutexLock gate(&gate_);
  return restorer_->Restore(previous, std::move(slab_fds));
}

absl::StatusOr<v1::ResumeResponse> MemoryBroker::Resume(const PeerCred& caller,
                                                        const v1::ResumeRequest& request) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  return restorer_->Resume(caller, request);
}

absl::Status MemoryBroker::AcceptSlabHandle(const PeerCred& caller, uint64_t slab_id, int fd) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) {
    close(fd);
    return ShuttingDown();
  }
  return restorer_->AcceptSlabHandle(caller, slab_id, fd);
}

absl::StatusOr<std::shared_ptr<Session>> MemoryBroker::RebindConnection(
    const PeerCred& caller, absl::string_view token) {
  absl::ReaderMutexLock gate(&gate_);
  if (shut_down_) return ShuttingDown();
  return restorer_->RebindConnection(caller, token);
}

std::optional<v1::AllocateResponse> MemoryBroker::RetakeByKey(const Session& session,
                                                             const Prepared& prepared) {
  std::optional<std::vector<std::pair<uint64_t, AllocationRecord>>> taken =
      restorer_->RetakeByKey(session, prepared.request_key, prepared.placement.plan.sizes,
                             prepared.kind, prepared.placement.plan.alignment);
  if (!taken.has_value()) return std::nullopt;
  v1::AllocateResponse response;
  for (const auto& [id, r] : *taken) Describe(id, r, response.add_allocations());
  return response;
}

void MemoryBroker::FinishRestore() {
  {
    absl::ReaderMutexLock gate(&gate_);
    if (shut_down_) return;
    restorer_->CloseSlabsWithoutHandle();
  }
  // Without the gate: each session's end takes it (OnSessionEnd); taken
  // again by a thread that holds it shared, it deadlocks once a writer
  // (Shutdown) waits between the two.
  restorer_->EndUnboundSessions();
  absl::ReaderMutexLock gate(&gate_);
  if (!shut_down_) restorer_->FreeUnclaimed();
}

absl::StatusOr<MemoryBroker::TenantEnded> MemoryBroker::EndTenant(
    uint32_t tenant, absl::string_view name, bool end_sessions,
    const std::function<void()>& unlist) {
  auto belongs = [tenant](const Session& s) {
    if (s.cred().socket_tenant == tenant) return true;
    const std::optional<tenants::TenantRef> t = s.tenant();
    return t.has_value() && t->id == tenant;
  };
  std::vector<SessionRegistry::Taken> taken;
  {
    // The barrier: no call is in flight while the tenant is counted and
    // unlisted, and every call after it reads the new directory.
    absl::WriterMutexLock barrier(&gate_);
    if (shut_down_) return ShuttingDown();
    uint32_t sessions = 0;
    uint64_t allocations = 0, bytes = 0;
    for (const std::shared_ptr<Session>& s : sessions_->List()) {
      if (!belongs(*s)) continue;
      const Session::Figures f = s->figures();
      ++sessions;
      allocations += f.allocations;
      bytes += f.used_bytes;
    }
    if (allocations > 0 && !end_sessions) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenant \"", name, "\" holds ", allocations, " allocation(s), ", FormatBytes(bytes),
          ", in ", sessions, " session(s); free them first, or pass end_sessions to end its "
          "sessions and free their memory"));
    }
    unlist();
    // Its sessions are marked ended and forgotten inside the barrier too: a
    // session fixed to the tenant can take nothing more after it (a commit
    // for an ended session fails, a waiter of one is answered with that)
    // and a call after it gets a new session, which the directory refuses.
    taken = sessions_->TakeSessions(belongs);
  }
  TenantEnded ended;
  for (const SessionRegistry::Taken& t : taken) {
    ++ended.sessions;
    ended.allocations += t.allocation_ids.size();
  }
  // As their processes' exits would (OnSessionEnd, on this thread): the
  // memory returns, the waiters are answered.
  sessions_->FinishSessions(std::move(taken));
  absl::ReaderMutexLock gate(&gate_);
  if (!shut_down_) pools_.ReleaseTenantSlabs(tenant);
  return ended;
}

}  // namespace gpumem
