// Fuzzes sequences of calls against the core (MemoryBroker over the sim
// backend, with configured tenants, quotas and a SQLite ledger): Allocate
// (sizes, placements, shards, waits, usage reports), Free, SetQuota,
// session end, reclaim answers, slab open/close, and restart (the broker
// shut down and a new one started over the reopened ledger: today's
// restart, where live allocations end; with the restart issue's survival
// this op is where a surviving table would be checked instead).
//
// Sessions are connection-bound (pid 0, as for a caller in another pid
// namespace), so that ending one is a call, not a process exit. A model
// keeps what the core answered: the live blocks and who owns them. After
// every step it checks:
//  - no tenant holds more than its quota (or, when a SetQuota lowered it
//    below what was held, no more than it held then);
//  - no device holds more than its capacity, and each device's used bytes
//    are the model's live bytes there;
//  - no two live blocks overlap, and each lies inside its slab;
//  - the live table is the model's (count), and the ledger's events, read
//    back from SQLite after a flush, replay to exactly the model's live ids
//    (ALLOCATE of an id not live, each end of an id that is).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/backend/sim_backend.h"
#include "server/config/daemon_config.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/quota/quota_book.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kKiB = 1024;
constexpr uint32_t kDevices = 2;
constexpr uint64_t kDeviceBytes = 32 * kMiB;
constexpr int kSessions = 4;
// Sessions' uids and gids: two of tenant "a" (by uid), one of "b" (by uid),
// one of "c" (by gid, also the default tenant).
constexpr uid_t kUids[kSessions] = {1001, 1001, 1002, 1003};
constexpr gid_t kGid = 3000;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    fprintf(stderr, "core_sequence_fuzzer: %s\n", what.c_str());
    abort();
  }
}

// Reads the input.
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t U8() { return i_ < n_ ? d_[i_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

struct Block {
  uint64_t id = 0;
  int session = 0;
  uint32_t tenant = 0;
  uint32_t device = 0;
  uint64_t slab = 0;
  uint64_t slab_size = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct World {
  std::string dir;
  SimBackend backend{std::vector<uint64_t>(kDevices, kDeviceBytes)};
  std::unique_ptr<tenants::TenantDirectoryHolder> directory;
  std::unique_ptr<ledger::TenantLedger> ledger;
  int inputs_on_this_ledger = 0;
};

World* world = nullptr;

std::string LedgerPath() { return world->dir + "/ledger.db"; }

void OpenLedger(bool fresh) {
  world->ledger.reset();
  if (fresh) {
    for (const char* suffix : {"", "-wal", "-shm", "-lock"}) {
      std::filesystem::remove(LedgerPath() + suffix);
    }
  }
  ledger::LedgerOptions o;
  o.path = LedgerPath();
  o.max_delay = absl::Milliseconds(1);
  absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> l = ledger::TenantLedger::Open(o);
  Check(l.ok(), "ledger open: " + l.status().ToString());
  world->ledger = *std::move(l);
}

// One input's run: a broker, its sessions and the model.
class Run {
 public:
  Run() { StartBroker(); }
  ~Run() {
    broker_->SetReclaimSender(nullptr);
    broker_.reset();  // DAEMON_STOP for what is live; before its quota book
  }

  void Step(Bytes& in) {
    const uint8_t op = in.U8() % 9;
    switch (op) {
      case 0:
      case 1:
      case 2: Allocate(in); break;
      case 3: Free(in); break;
      case 4: SetQuota(in); break;
      case 5: EndSession(in.U8() % kSessions); break;
      case 6: broker_->ReclaimAnswered(Cred(in.U8() % kSessions)); break;
      case 7: OpenSlab(in); break;
      case 8:
        if (in.U8() % 4 == 0) Restart();
        break;
    }
    CheckInvariants();
  }

 private:
  void StartBroker() {
    // A new daemon: its own quota book, with the config's quotas.
    quotas_ = std::make_unique<quota::QuotaBook>(kDevices);
    for (const tenants::Tenant& t : world->directory->Get()->tenants()) {
      quotas_->SetQuota(t.id, t.quota);
    }
    BrokerOptions o;
    o.pool.slab_size = 2 * kMiB;
    o.pool.granularity = 4096;
    o.pool.empty_release_after = absl::ZeroDuration();
    o.reclaim_wait = absl::Milliseconds(2);
    o.admission.bypass_limit = 2;
    o.admission.reserve_for = absl::Milliseconds(5);
    o.tenants = world->directory.get();
    o.quotas = quotas_.get();
    o.ledger = world->ledger.get();
    broker_ = std::make_unique<MemoryBroker>(&world->backend, o);
    Check(broker_->Start().ok(), "broker start");
    // Every session has a stream that a reclaim reaches.
    broker_->SetReclaimSender([this](uint64_t session, const v1::ReclaimRequest&) {
      asked_.push_back(session);
      return true;
    });
    for (int s = 0; s < kSessions; ++s) bound_[s] = 0;
    Check(world->ledger->Flush().ok(), "flush");
    seen_seq_ = LastSeq();
  }

  uint64_t LastSeq() {
    ledger::EventQuery q;
    q.newest = true;
    q.limit = 1;
    absl::StatusOr<std::vector<ledger::LedgerEvent>> e = world->ledger->Query(q);
    Check(e.ok(), "query");
    return e->empty() ? 0 : e->back().seq;
  }

  PeerCred Cred(int s) {
    if (bound_[s] == 0) {
      absl::StatusOr<std::shared_ptr<Session>> b =
          broker_->BindConnection(PeerCred{0, kUids[s], kGid});
      Check(b.ok(), "bind: " + b.status().ToString());
      bound_[s] = (*b)->id();
    }
    PeerCred c{0, kUids[s], kGid};
    c.bound_session = bound_[s];
    return c;
  }

  void Allocate(Bytes& in) {
    const int s = in.U8() % kSessions;
    const uint8_t shape = in.U8();
    v1::AllocateRequest r;
    // Sizes from 1 byte to 8 MiB, most of them small; now and then larger
    // than a slab (a dedicated slab) or than a device.
    const uint16_t raw = in.U16();
    uint64_t size = (shape & 0x80) ? uint64_t{raw} * 4 * kKiB : uint64_t{raw} * 16 + 1;
    if ((shape & 0xc0) == 0xc0) size = uint64_t{raw} * kMiB;
    r.set_size_bytes(size);
    if (shape & 0x01) r.mutable_placement()->add_devices(std::to_string(in.U8() % 3));
    if (shape & 0x02) r.mutable_placement()->add_exclude(std::to_string(in.U8() % 2));
    if (shape & 0x04) r.mutable_placement()->add_fallback()->add_devices("all");
    if (shape & 0x08) {
      r.set_shard_count(2);
      r.set_size_bytes(size * 2);
    }
    if (shape & 0x10) r.set_wait_ms(in.U8() % 2);
    if (shape & 0x20) {
      r.mutable_usage()->set_leased_bytes(uint64_t{in.U8()} * kMiB / 8);
      r.mutable_usage()->set_in_use_bytes(uint64_t{in.U8()} * kMiB / 16);
    }
    if ((shape & 0x30) == 0x30) r.set_alignment(uint64_t{1} << (in.U8() % 22));
    const PeerCred c = Cred(s);
    const uint32_t tenant = TenantOf(s);
    asked_.clear();
    // (An absl::Mutex, which ThreadSanitizer sees, not Debian's
    // uninstrumented absl::Notification.)
    absl::Mutex done_mu;
    bool done = false;
    absl::StatusOr<v1::AllocateResponse> a;
    MemoryBroker::AllocateOutcome o =
        broker_->Allocate(c, r, [&](MemoryBroker::AllocateAnswer answer) {
          absl::MutexLock lock(&done_mu);
          a = std::move(answer);
          done = true;
        });
    if (o.kind == MemoryBroker::AllocateOutcome::Kind::kWaiting) {
      // Held (for reclaims, or wait_ms): the sessions asked answer now,
      // unless the input says they stay silent (then the bound passes).
      if (in.U8() % 8 != 0) {
        for (uint64_t session : asked_) {
          for (int k = 0; k < kSessions; ++k) {
            if (bound_[k] == session) broker_->ReclaimAnswered(Cred(k));
          }
        }
      }
      absl::MutexLock lock(&done_mu);
      done_mu.Await(absl::Condition(&done));
    } else {
      a = std::move(o.answer);
    }
    if (!a.ok()) return;
    uint64_t total = 0;
    for (const v1::Allocation& x : a->allocations()) {
      Block b{x.id(), s, tenant, x.device_index(), x.slab_id(), x.slab_size_bytes(), x.offset(),
              x.size_bytes()};
      Check(b.device < kDevices, "device out of range");
      Check(b.offset + b.size <= b.slab_size && b.offset + b.size >= b.offset,
            "block outside its slab");
      Check(live_.count(b.id) == 0, "an id given twice");
      // No overlap with any live block of the same slab.
      auto& slab = by_slab_[b.slab];
      auto next = slab.lower_bound(b.offset);
      if (next != slab.end()) Check(b.offset + b.size <= next->first, "blocks overlap");
      if (next != slab.begin()) {
        auto prev = std::prev(next);
        Check(prev->second <= b.offset, "blocks overlap");
      }
      slab[b.offset] = b.offset + b.size;
      live_[b.id] = b;
      total += b.size;
    }
    if (r.shard_count() > 0) Check(a->allocations_size() == 2, "shard count");
    Check(total >= r.size_bytes(), "less than asked");
  }

  void Forget(uint64_t id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    by_slab_[it->second.slab].erase(it->second.offset);
    live_.erase(it);
  }

  void Free(Bytes& in) {
    const int s = in.U8() % kSessions;
    const uint8_t pick = in.U8();
    uint64_t id = 0;
    if (!live_.empty() && pick < 224) {
      auto it = live_.begin();
      std::advance(it, pick % live_.size());
      id = it->first;
    } else {
      id = in.U16();  // anything, mostly not live
    }
    v1::FreeRequest f;
    f.set_id(id);
    absl::StatusOr<v1::FreeResponse> r = broker_->Free(Cred(s), f);
    auto it = live_.find(id);
    if (it != live_.end() && kUids[it->second.session] == kUids[s]) {
      Check(r.ok(), "free of a live block by its uid: " + r.status().ToString());
    }
    if (it == live_.end()) Check(!r.ok(), "free of an id that is not live succeeded");
    if (r.ok()) {
      Check(r->freed_bytes() == it->second.size, "freed bytes");
      Forget(id);
    }
  }

  void SetQuota(Bytes& in) {
    const uint32_t tenant = 1 + in.U8() % 3;
    const uint8_t which = in.U8();
    tenants::Quota q;
    if (which & 1) q.total_bytes = uint64_t{in.U8()} * kMiB / 4;
    if (which & 2) q.device_bytes = {uint64_t{in.U8()} * kMiB / 4};
    if (which & 4) q.max_allocations = in.U8() % 16;
    // What it holds now may exceed the new quota: that much is allowed.
    floor_[tenant] = quotas_->Holdings(tenant);
    quotas_->SetQuota(tenant, q);
    broker_->QuotasChanged();
  }

  void EndSession(int s) {
    if (bound_[s] == 0) return;
    broker_->EndConnection(bound_[s]);
    bound_[s] = 0;
    std::vector<uint64_t> gone;
    for (const auto& [id, b] : live_) {
      if (b.session == s) gone.push_back(id);
    }
    for (uint64_t id : gone) Forget(id);
  }

  void OpenSlab(Bytes& in) {
    const int s = in.U8() % kSessions;
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, in.U8() % live_.size());
    absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Cred(s), it->second.slab);
    if (TenantOf(s) == it->second.tenant) {
      Check(fd.ok() || fd.status().code() == absl::StatusCode::kResourceExhausted,
            "own tenant's slab refused: " + fd.status().ToString());
    } else {
      Check(!fd.ok(), "another tenant's slab was exported");
    }
    if (fd.ok()) {
      Check(fd->size == it->second.slab_size, "exported size");
      close(fd->fd);
      if (in.U8() & 1) broker_->CloseSlab(Cred(s), it->second.slab).IgnoreError();
    }
  }

  void Restart() {
    broker_->SetReclaimSender(nullptr);
    broker_.reset();  // DAEMON_STOP for each live allocation
    OpenLedger(/*fresh=*/false);  // recovery: nothing may be left live
    Check(world->ledger->restart_event_count() == 0, "clean stop left live allocations");
    ReplayLedger();
    Check(ledger_live_.empty(), "the stop did not end every live allocation in the ledger");
    live_.clear();
    by_slab_.clear();
    floor_.clear();
    StartBroker();
  }

  uint32_t TenantOf(int s) const {
    // "a" (id 1) lists 1001, "b" (2) lists 1002, "c" (3) is gid 3000's.
    return kUids[s] == 1001 ? 1 : kUids[s] == 1002 ? 2 : 3;
  }

  void CheckInvariants() {
    Check(broker_->live_allocations() == live_.size(),
          absl::StrCat("live table has ", broker_->live_allocations(), ", model ",
                       live_.size()));
    // Devices.
    std::vector<uint64_t> used(kDevices, 0);
    for (const auto& [id, b] : live_) used[b.device] += b.size;
    StatsView s = broker_->Stats(PeerCred{getpid(), 0, 0});
    for (const DeviceStatsView& d : s.devices) {
      const PoolStats& p = d.pool;
      Check(p.used_bytes == used[d.info.index], "device used bytes != model");
      Check(p.pooled_bytes + p.retained_bytes <= p.total_bytes, "device above capacity");
      Check(p.used_bytes <= p.pooled_bytes, "used beyond the pooled slabs");
    }
    // Quotas: held <= quota, or, after a SetQuota lowered it below what
    // was held, <= the least held since (it may only come down).
    for (uint32_t t = 1; t <= 3; ++t) {
      const tenants::Quota q = quotas_->GetQuota(t);
      const quota::TenantHoldings h = quotas_->Holdings(t);
      quota::TenantHoldings& f = floor_[t];
      if (q.total_bytes) Check(h.total_bytes <= std::max(*q.total_bytes, f.total_bytes),
                               absl::StrCat("tenant ", t, " above its total quota"));
      if (q.max_allocations) Check(h.allocations <= std::max(*q.max_allocations, f.allocations),
                                   absl::StrCat("tenant ", t, " above its allocation quota"));
      if (std::optional<uint64_t> d0 = q.device_limit(0)) {
        const uint64_t held0 = h.device_bytes.empty() ? 0 : h.device_bytes[0];
        const uint64_t floor0 = f.device_bytes.empty() ? 0 : f.device_bytes[0];
        Check(held0 <= std::max(*d0, floor0), absl::StrCat("tenant ", t, " above device 0"));
      }
      f.total_bytes = std::min(f.total_bytes, h.total_bytes);
      f.allocations = std::min(f.allocations, h.allocations);
      if (!f.device_bytes.empty() && !h.device_bytes.empty()) {
        f.device_bytes[0] = std::min(f.device_bytes[0], h.device_bytes[0]);
      }
    }
    // The ledger replays to the model.
    ReplayLedger();
    Check(ledger_live_.size() == live_.size(), "ledger replay count != live table");
    for (const auto& [id, b] : live_) Check(ledger_live_.count(id) == 1, "live id not in ledger");
  }

  // Folds the events committed since the last call into ledger_live_.
  void ReplayLedger() {
    Check(world->ledger->Flush().ok(), "flush");
    for (;;) {
      ledger::EventQuery q;
      q.after_seq = seen_seq_;
      q.limit = 1000;
      absl::StatusOr<std::vector<ledger::LedgerEvent>> events = world->ledger->Query(q);
      Check(events.ok(), "query");
      for (const ledger::LedgerEvent& e : *events) {
        seen_seq_ = e.seq;
        const int sign = ledger::UsageSign(e.kind);
        if (sign > 0) {
          Check(ledger_live_.insert(e.allocation_id).second, "ALLOCATE of a live id");
        } else if (sign < 0) {
          Check(ledger_live_.erase(e.allocation_id) == 1, "end of an id not live");
        }
      }
      if (events->size() < q.limit) break;
    }
  }

  std::unique_ptr<quota::QuotaBook> quotas_;
  std::unique_ptr<MemoryBroker> broker_;
  uint64_t bound_[kSessions] = {};
  std::map<uint64_t, Block> live_;
  std::map<uint64_t, std::map<uint64_t, uint64_t>> by_slab_;  // slab -> offset -> end
  absl::flat_hash_map<uint32_t, quota::TenantHoldings> floor_;
  std::set<uint64_t> ledger_live_;
  uint64_t seen_seq_ = 0;
  std::vector<uint64_t> asked_;  // sessions the last Allocate's reclaims reached
};

std::string Config() {
  return "tenant { name: \"a\" uids: 1001 priority: 2 quota { total_bytes: \"24MiB\" "
         "device { device: \"0\" bytes: \"16MiB\" } max_allocations: 64 } }\n"
         "tenant { name: \"b\" uids: 1002 quota { total_bytes: \"40MiB\" } }\n"
         "tenant { name: \"c\" gids: 3000 max_waiting_requests: 2 max_sessions: 3 }\n"
         "default_tenant: \"c\"\n";
}

}  // namespace
}  // namespace gpumem

using namespace gpumem;  // NOLINT: the fuzzer entry points are global

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  world = new World;
  const char* shm = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  world->dir = absl::StrCat(shm, "/gpumemd-core-fuzz-", getpid());
  std::filesystem::create_directories(world->dir);
  // Leave nothing behind (the process ends with its threads running).
  atexit([] { std::error_code e; std::filesystem::remove_all(world->dir, e); });
  google::protobuf::TextFormat::ParseInfoTree where;
  absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig("fuzz", Config(), &where);
  Check(config.ok(), "config");
  std::vector<placement::DeviceView> devices(kDevices);
  for (uint32_t i = 0; i < kDevices; ++i) {
    devices[i].index = i;
    devices[i].uuid = world->backend.devices()[i].uuid;
    devices[i].total_bytes = kDeviceBytes;
  }
  absl::StatusOr<tenants::TenantDirectory> dir =
      tenants::TenantDirectory::Build(*config, &where, "fuzz", devices);
  Check(dir.ok(), "directory");
  world->directory = std::make_unique<tenants::TenantDirectoryHolder>(*std::move(dir));
  OpenLedger(/*fresh=*/true);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 512) return 0;  // sequences of up to ~100 steps
  // A fresh ledger file now and then, so that it stays small.
  if (++world->inputs_on_this_ledger > 256) {
    OpenLedger(/*fresh=*/true);
    world->inputs_on_this_ledger = 0;
  }
  Bytes in(data, size);
  Run run;
  while (!in.empty()) run.Step(in);
  return 0;
}
