// Allocate runs placement under the broker's lock with a carver that carves
// from the pools directly, so the placement decision and the carving see
// the same state. Blocks carved for a request stay "pending" inside the
// carver until placement returns; only then do they become allocations.
#include "server/service/memory_broker.h"

#include <unistd.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace gpumem {

class MemoryBroker::PoolCarver : public placement::DeviceCarver {
 public:
  PoolCarver(MemoryBroker* broker, uint32_t tenant) : broker_(broker), tenant_(tenant) {}

  absl::StatusOr<placement::CarvedBlock> TryCarve(
      uint32_t device, uint64_t size, uint64_t alignment,
      placement::CarveRefusal* refusal) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(broker_->mu_) {
    SlabPool& pool = *broker_->pools_[device];
    absl::StatusOr<PoolBlock> b = pool.Carve(size, alignment, tenant_);
    if (!b.ok()) {
      if (b.status().code() == absl::StatusCode::kResourceExhausted) {
        refusal->free_bytes = pool.free_bytes();
        refusal->largest_free_bytes = pool.largest_carvable();
        refusal->reason = refusal->free_bytes < size
                              ? placement::CarveRefusal::Reason::kCapacity
                              : placement::CarveRefusal::Reason::kFragmentation;
      }
      return b.status();
    }
    placement::CarvedBlock c;
    c.device = device;
    c.size_bytes = size;
    c.id = broker_->next_id_++;
    c.slab_id = b->slab_id;
    c.offset = b->offset;
    pending_[c.id] = *b;
    return c;
  }

  void Release(const placement::CarvedBlock& block) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(broker_->mu_) {
    auto it = pending_.find(block.id);
    if (it == pending_.end()) return;
    broker_->pools_[block.device]->Uncarve(it->second);
    pending_.erase(it);
  }

  const PoolBlock& pool_block(uint64_t id) const { return pending_.at(id); }

 private:
  MemoryBroker* broker_;
  uint32_t tenant_;
  absl::flat_hash_map<uint64_t, PoolBlock> pending_;
};

absl::Status MemoryBroker::ShuttingDown() {
  return absl::FailedPreconditionError("gpumemd is shutting down");
}

bool MemoryBroker::IsShutDown() const { return shut_down_.load(); }

namespace {

absl::Status Stopping() {
  return absl::UnavailableError(
      "gpumemd is stopping: it takes no new allocations; retry once it is back");
}

}  // namespace

void MemoryBroker::BeginDrain() { draining_.store(true); }

bool MemoryBroker::WaitUntilNoAllocations(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return allocations_.empty();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

size_t MemoryBroker::live_allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_.size();
}

void MemoryBroker::SetEmptySlabRelease(absl::Duration after) {
  absl::MutexLock lock(&mu_);
  options_.pool.empty_release_after = after;
  for (auto& pool : pools_) pool->set_empty_release_after(after);
}

MemoryBroker::MemoryBroker(Backend* backend, BrokerOptions options)
    : backend_(backend), options_(options) {
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
}

MemoryBroker::~MemoryBroker() {
  Shutdown();
  sessions_.reset();  // joins the watcher before the maps go
}

absl::Status MemoryBroker::Start() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& pool : pools_) {
      absl::Status s = pool->Reserve();
      if (!s.ok()) return s;
    }
  }
  maintenance_ = std::thread([this] { Maintain(); });
  return absl::OkStatus();
}

void MemoryBroker::Maintain() {
  absl::MutexLock stop(&stop_mu_);
  while (!stopping_) {
    stop_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                              options_.maintenance_interval);
    if (stopping_) break;
    absl::MutexLock lock(&mu_);
    for (auto& pool : pools_) pool->ReleaseIdleSlabs(absl::Now());
  }
}

void MemoryBroker::Shutdown() {
  {
    absl::MutexLock stop(&stop_mu_);
    stopping_ = true;
  }
  if (maintenance_.joinable()) maintenance_.join();
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : allocations_) ids.push_back(id);
  for (uint64_t id : ids) ReleaseLocked(id);
  pools_.clear();  // every slab goes back to the backend
}

placement::DeviceSnapshot MemoryBroker::SnapshotLocked() const {
  placement::DeviceSnapshot snap;
  snap.devices = device_views_;
  for (placement::DeviceView& v : snap.devices) {
    const SlabPool& pool = *pools_[v.index];
    v.used_bytes = pool.used_bytes();
    v.free_bytes = v.total_bytes - v.used_bytes;
    v.largest_free_bytes = pool.largest_carvable();
  }
  const Backend* backend = backend_;
  snap.peer = [backend](uint32_t a, uint32_t b) {
    return static_cast<placement::PeerDistance>(backend->Peer(a, b));
  };
  return snap;
}

absl::StatusOr<v1::AllocateResponse> MemoryBroker::Allocate(
    const PeerCred& caller, const v1::AllocateRequest& request) {
  if (IsShutDown()) return ShuttingDown();
  if (draining_.load()) return Stopping();
  if (request.shard_count() == 0 && request.shard_sizes_size() == 0 &&
      request.size_bytes() > largest_device_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size_bytes ", request.size_bytes(), " (", FormatBytes(request.size_bytes()),
        ") is larger than any device (largest: ", FormatBytes(largest_device_bytes_), ")"));
  }
  absl::StatusOr<SessionInfo> session = sessions_->Attach(caller);
  if (!session.ok()) return session.status();
  // Argument checks need no pool state: done before taking the lock.
  absl::StatusOr<placement::PreparedRequest> prepared =
      placement::PrepareRequest(request, device_views_, placer_options_);
  if (!prepared.ok()) return prepared.status();

  absl::MutexLock lock(&mu_);
  if (shut_down_) return ShuttingDown();
  if (draining_.load()) return Stopping();
  // Until tenants are configured (the ledger's issue), each uid is its own
  // tenant: its blocks never share a slab with another uid's, and a slab is
  // scrubbed before it passes from one uid to another.
  PoolCarver carver(this, /*tenant=*/caller.uid);
  placement::Placer placer(&carver, placer_options_);
  placement::PlacementResult result = placer.Place(*prepared, SnapshotLocked());
  if (!result.ok()) return result.status;
  if (!sessions_->IsLive(session->id)) {
    // The caller died while we placed: nobody would ever free these.
    for (const placement::CarvedBlock& b : result.blocks) carver.Release(b);
    return absl::FailedPreconditionError("the calling process has exited");
  }
  v1::AllocateResponse response;
  for (const placement::CarvedBlock& b : result.blocks) {
    Record r;
    r.session = session->id;
    r.uid = caller.uid;
    r.device = b.device;
    r.block = carver.pool_block(b.id);
    allocations_[b.id] = r;
    by_session_[session->id].insert(b.id);
    ++slab_users_[r.block.slab_id][caller.uid];
    slab_device_[r.block.slab_id] = b.device;

    const DeviceInfo& d = backend_->devices()[b.device];
    v1::Allocation* a = response.add_allocations();
    a->set_id(b.id);
    a->set_device_index(b.device);
    a->set_device_uuid(d.uuid);
    a->set_slab_id(r.block.slab_id);
    a->set_slab_size_bytes(r.block.slab_size);
    a->set_offset(r.block.offset);
    a->set_size_bytes(r.block.size);
    a->set_handle_kind(v1::HANDLE_KIND_POSIX_FD);
  }
  return response;
}

void MemoryBroker::ReleaseLocked(uint64_t id) {
  auto it = allocations_.find(id);
  if (it == allocations_.end()) return;
  const Record& r = it->second;
  if (!shut_down_ || !pools_.empty()) pools_[r.device]->Release(r.block);
  auto users = slab_users_.find(r.block.slab_id);
  if (users != slab_users_.end()) {
    auto u = users->second.find(r.uid);
    if (u != users->second.end() && --u->second == 0) users->second.erase(u);
    if (users->second.empty()) {
      slab_users_.erase(users);
      slab_device_.erase(r.block.slab_id);
    }
  }
  auto s = by_session_.find(r.session);
  if (s != by_session_.end()) {
    s->second.erase(id);
    if (s->second.empty()) by_session_.erase(s);
  }
  allocations_.erase(it);
}

absl::StatusOr<v1::FreeResponse> MemoryBroker::Free(const PeerCred& caller,
                                                    const v1::FreeRequest& request) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return ShuttingDown();
  if (request.id() == 0) {
    return absl::InvalidArgumentError("id must be set (allocation ids start at 1)");
  }
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
  v1::FreeResponse response;
  response.set_freed_bytes(it->second.block.size);
  ReleaseLocked(request.id());
  return response;
}

void MemoryBroker::OnSessionEnd(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto s = by_session_.find(session_id);
  if (s == by_session_.end()) return;
  std::vector<uint64_t> ids(s->second.begin(), s->second.end());
  for (uint64_t id : ids) ReleaseLocked(id);
}

absl::StatusOr<v1::Session> MemoryBroker::GetSession(const PeerCred& caller) {
  if (IsShutDown()) return ShuttingDown();
  absl::StatusOr<SessionInfo> s = sessions_->Attach(caller);
  if (!s.ok()) return s.status();
  v1::Session out;
  out.set_session_id(s->id);
  out.set_pid(s->cred.pid);
  out.set_uid(s->cred.uid);
  out.set_gid(s->cred.gid);
  return out;
}

absl::StatusOr<SlabFd> MemoryBroker::ExportSlab(const PeerCred& caller,
                                                uint64_t slab_id) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return ShuttingDown();
  auto users = slab_users_.find(slab_id);
  if (users == slab_users_.end()) {
    return absl::NotFoundError(absl::StrCat("no slab ", slab_id, " with live blocks"));
  }
  if (!users->second.contains(caller.uid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "slab ", slab_id, " holds no block of uid ", caller.uid));
  }
  const SlabPool& pool = *pools_[slab_device_.at(slab_id)];
  absl::StatusOr<uint64_t> size = pool.SlabSize(slab_id);
  if (!size.ok()) return size.status();
  absl::StatusOr<int> fd = pool.ExportSlabFd(slab_id);
  if (!fd.ok()) return fd.status();
  return SlabFd{*fd, *size};
}

v1::GetStatsResponse MemoryBroker::Stats(bool include_slabs) const {
  // Pool figures are copied under the lock; the response is built after.
  struct DeviceLoad {
    PoolStats stats;
    uint64_t largest = 0;
    std::vector<SlabStats> slabs;
  };
  const std::vector<DeviceInfo>& devices = backend_->devices();
  std::vector<DeviceLoad> loads(devices.size());
  v1::GetStatsResponse out;
  out.set_backend(backend_->name());
  {
    absl::MutexLock lock(&mu_);
    for (const DeviceInfo& d : devices) {
      DeviceLoad& load = loads[d.index];
      load.largest = d.total_bytes;  // after Shutdown: no pools, all free
      if (pools_.empty()) continue;
      load.stats = pools_[d.index]->Stats();
      load.largest = pools_[d.index]->largest_carvable();
      if (include_slabs) load.slabs = pools_[d.index]->Slabs();
    }
    AddSessionStatsLocked(&out);
  }
  for (const DeviceInfo& d : devices) {
    const DeviceLoad& load = loads[d.index];
    v1::DeviceStats* ds = out.add_devices();
    ds->set_index(d.index);
    ds->set_uuid(d.uuid);
    ds->set_name(d.name);
    ds->set_pci_bus_id(d.pci_bus_id);
    ds->set_numa_node(d.numa_node);
    ds->set_total_bytes(d.total_bytes);
    ds->set_pooled_bytes(load.stats.pooled_bytes);
    ds->set_used_bytes(load.stats.used_bytes);
    ds->set_free_bytes(d.total_bytes - load.stats.used_bytes);
    ds->set_largest_free_block_bytes(load.largest);
    ds->set_fragmentation(load.stats.fragmentation);
    ds->set_slab_count(load.stats.slab_count);
    ds->set_allocation_count(load.stats.live_blocks);
    for (v1::PeerLink link : peer_rows_[d.index]) ds->add_peers(link);
    for (const SlabStats& slab : load.slabs) {
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
      out_slab->set_tenant(slab.tenant);
    }
  }
  return out;
}

void MemoryBroker::AddSessionStatsLocked(v1::GetStatsResponse* out) const {
  for (const SessionInfo& info : sessions_->List()) {
    v1::SessionStats* ss = out->add_sessions();
    ss->set_session_id(info.id);
    ss->set_pid(info.cred.pid);
    ss->set_uid(info.cred.uid);
    ss->set_gid(info.cred.gid);
    uint64_t count = 0, bytes = 0;
    auto s = by_session_.find(info.id);
    if (s != by_session_.end()) {
      count = s->second.size();
      for (uint64_t id : s->second) bytes += allocations_.at(id).block.size;
    }
    ss->set_allocation_count(count);
    ss->set_used_bytes(bytes);
  }
}

}  // namespace gpumem
