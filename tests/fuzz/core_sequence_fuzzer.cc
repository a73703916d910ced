// Fuzzes sequences of calls against the core (MemoryBroker over the sim
// backend, with configured tenants, quotas, a SQLite ledger and the durable
// state a restart needs): Allocate (sizes, placements, shards, waits, usage
// reports), Free, SetQuota, session end, reclaim answers, slab open/close
// (a session keeps the slab's fd while it holds it open, as a client keeps
// its mapping), and a restart that loses nothing.
//
// Sessions are connection-bound (pid 0, as for a caller in another pid
// namespace), so that ending one is a call, not a process exit. A model
// keeps what the core answered: the live blocks, who owns them, and which
// session holds which slab's fd. After every step it checks:
//  - no tenant holds more than its quota (or, when a SetQuota lowered it
//    below what was held, no more than it held then);
//  - no device holds more than its capacity, and each device's used bytes
//    are the model's live bytes there;
//  - no two live blocks overlap, and each lies inside its slab;
//  - the live table is the model's (count), and the ledger's events, read
//    back from SQLite after a flush, replay to exactly the model's live ids
//    (ALLOCATE of an id not live, each end of an id that is).
//
// The restart op is the daemon's surviving restart, in-process and in the
// daemon's order (server/daemon/daemon.cc, RestoreFromPrevious): the broker
// stops for a restart (ShutdownForRestart: nothing released, nothing
// recorded) and goes, with its quota book, state file (server/state/) and
// slab keeper, as a killed daemon's would; the ledger and the state file
// are reopened as the next daemon opens them, a new broker Restores what the
// file kept (no fd store: every slab waits for a holder to give its fd
// back), the ledger is reconciled (TenantLedger::Resume), then the input
// decides for each session whether its client comes back (RebindConnection
// with its token, Resume with its live blocks, some claims left out), and
// whether it gives back the fds it holds (AcceptSlabHandle). The model
// predicts each block's fate exactly: its slab's fd came back from no one:
// DAEMON_RESTART; its session did not come back: SESSION_END; not
// re-presented: FREE; else it survives. Checked: Restore kept everything
// (connection-bound sessions always come back to a restore), each Resume's
// kept, lost, unclaimed and needs_handle; after the grace time each block
// ended with the predicted event or survived with its id, place and bytes
// (a tag written through a holder's fd before the stop, read back through a
// fd the new broker exports), and all the invariants above.
//
// One difference from the daemon, for determinism: the new broker is
// Restored (and its clients come back) before Start, with a grace time of
// zero, so the grace runs out at its maintenance thread's first tick after
// Start and never before a client the input brings back has come. A
// sentinel session that never comes back tells when the grace's end has
// been handled (its token stops resolving), then the table is awaited to
// reach the model.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "absl/time/clock.h"
#include "server/backend/sim_backend.h"
#include "server/config/daemon_config.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/quota/quota_book.h"
#include "server/restart/durable_slab_keeper.h"
#include "server/state/durable_state.h"
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
// The sentinel session's uid (tenant "c" by gid): bound, never used, never
// brought back after a restart.
constexpr uid_t kSentinelUid = 1004;

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
  bool tagged = false;  // carries its tag (written before a restart)
};

struct World {
  std::string dir;
  SimBackend backend{std::vector<uint64_t>(kDevices, kDeviceBytes)};
  std::unique_ptr<tenants::TenantDirectoryHolder> directory;
  std::unique_ptr<ledger::TenantLedger> ledger;
  // What a restart needs, kept as it happens (cleared by each clean stop).
  std::unique_ptr<state::DurableState> state;
  int inputs_on_this_ledger = 0;
};

World* world = nullptr;

std::string LedgerPath() { return world->dir + "/ledger.db"; }
std::string StatePath() { return world->dir + "/state"; }

// Opens the state file as a (re)starting daemon does; what an earlier
// broker left in it goes to `previous`.
void OpenState(state::Snapshot* previous) {
  world->state.reset();  // its flock goes with it, as with a dead daemon's
  std::string note;
  absl::StatusOr<std::unique_ptr<state::DurableState>> s =
      state::DurableState::Open(StatePath(), previous, &note);
  Check(s.ok(), "state open: " + s.status().ToString());
  world->state = *std::move(s);
}

void OpenLedger(bool fresh, bool defer_recovery = false) {
  world->ledger.reset();
  if (fresh) {
    for (const char* suffix : {"", "-wal", "-shm", "-lock"}) {
      std::filesystem::remove(LedgerPath() + suffix);
    }
  }
  ledger::LedgerOptions o;
  o.path = LedgerPath();
  o.max_delay = absl::Milliseconds(1);
  o.defer_recovery = defer_recovery;
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
    // Shut down while broker_ still points at it: the keeper names tenants
    // through broker_ (MakeBroker), and the maintenance thread and the
    // release of every slab call the keeper; reset() nulls broker_ before
    // the destructor runs.
    broker_->Shutdown();  // DAEMON_STOP for what is live; before its quota book
    broker_.reset();
    keeper_.reset();
    for (const auto& [held, fd] : fds_) close(fd);
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
        if (in.U8() % 4 == 0) Restart(in);
        break;
    }
    CheckInvariants();
  }

 private:
  // A new daemon's broker: its own quota book, with the config's quotas, its
  // slab keeper (no fd store), over the state file and ledger in `world`.
  void MakeBroker(bool restarted) {
    quotas_ = std::make_unique<quota::QuotaBook>(kDevices);
    for (const tenants::Tenant& t : world->directory->Get()->tenants()) {
      quotas_->SetQuota(t.id, t.quota);
    }
    keeper_ = std::make_unique<DurableSlabKeeper>(
        world->state.get(), nullptr, [this](uint32_t tenant) { return broker_->TenantName(tenant); });
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
    o.state = world->state.get();
    o.slab_keeper = keeper_.get();
    if (restarted) {
      // See the file comment: restored before Start, the grace ends at the
      // first maintenance tick after Start.
      o.restore_grace = absl::ZeroDuration();
      o.maintenance_interval = absl::Milliseconds(1);
    }
    broker_ = std::make_unique<MemoryBroker>(&world->backend, o);
    // Every session has a stream that a reclaim reaches.
    broker_->SetReclaimSender([this](uint64_t session, const v1::ReclaimRequest&) {
      asked_.push_back(session);
      return true;
    });
  }

  void StartBroker() {
    MakeBroker(/*restarted=*/false);
    Check(broker_->Start().ok(), "broker start");
    for (int s = 0; s < kSessions; ++s) bound_[s] = 0;
    BindSentinel();
    Check(world->ledger->Flush().ok(), "flush");
    seen_seq_ = LastSeq();
  }

  void BindSentinel() {
    absl::StatusOr<std::shared_ptr<Session>> b =
        broker_->BindConnection(PeerCred{0, kSentinelUid, kGid});
    Check(b.ok(), "bind the sentinel: " + b.status().ToString());
    sentinel_token_ = (*b)->token();
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
      tokens_[s] = (*b)->token();
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
    // Its connection is gone, and with it the fds its client held.
    for (auto it = fds_.begin(); it != fds_.end();) {
      if (it->first.first == s) {
        close(it->second);
        it = fds_.erase(it);
      } else {
        ++it;
      }
    }
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
      const uint64_t slab = it->second.slab;
      if (in.U8() & 1) {
        close(fd->fd);
        broker_->CloseSlab(Cred(s), slab).IgnoreError();
        auto held = fds_.find({s, slab});
        if (held != fds_.end()) {
          close(held->second);
          fds_.erase(held);
        }
      } else {
        Hold(s, slab, fd->fd);
      }
    }
  }

  // Session `s` keeps `fd` of `slab` (one per slab: a second is closed).
  void Hold(int s, uint64_t slab, int fd) {
    auto [it, fresh] = fds_.try_emplace({s, slab}, fd);
    if (!fresh) close(fd);
  }

  // Any fd of `slab` a session holds, or -1.
  int AnyFdOf(uint64_t slab) const {
    for (const auto& [held, fd] : fds_) {
      if (held.second == slab) return fd;
    }
    return -1;
  }

  // The 16-byte tag of block `id` (as much of it as the block holds).
  static std::string Tag(uint64_t id, uint64_t size) {
    std::string t(16, '\0');
    const uint64_t words[2] = {id, ~id * 0x9E3779B97F4A7C15ull};
    memcpy(&t[0], words, 16);
    t.resize(std::min<uint64_t>(16, size));
    return t;
  }

  // A restart that loses nothing (see the file comment).
  void Restart(Bytes& in) {
    // What each session's client does once the daemon is back: bit 0..1
    // not 0: it comes back; bit 2 clear: it gives back the fds it holds;
    // bit 7: it leaves out every other claim (blocks it let go of, or an
    // answer it never got).
    uint8_t mode[kSessions];
    for (int s = 0; s < kSessions; ++s) mode[s] = in.U8();
    auto back = [&](int s) { return bound_[s] != 0 && (mode[s] & 3) != 0; };
    // Tags, written through a holder's fd, to be read back after.
    for (auto& [id, b] : live_) {
      const int fd = AnyFdOf(b.slab);
      if (fd < 0) continue;
      const std::string tag = Tag(id, b.size);
      Check(pwrite(fd, tag.data(), tag.size(), static_cast<off_t>(b.offset)) ==
                static_cast<ssize_t>(tag.size()),
            "tag write");
      b.tagged = true;
    }
    // The fate of each block.
    std::set<uint64_t> given;  // slabs whose fd a client gives back
    for (const auto& [held, fd] : fds_) {
      if (back(held.first) && (mode[held.first] & 4) == 0) given.insert(held.second);
    }
    std::map<int, std::vector<uint64_t>> claims;  // session -> ids it re-presents
    std::map<int, uint32_t> unclaimed;
    expected_end_.clear();
    for (const auto& [id, b] : live_) {
      if (!back(b.session)) {
        if (given.count(b.slab) == 0) expected_end_[id] = ledger::EventKind::kDaemonRestart;
        else expected_end_[id] = ledger::EventKind::kSessionEnd;
        continue;
      }
      const bool left_out = (mode[b.session] & 0x80) != 0 && (id & 1) == 0;
      if (left_out) {
        ++unclaimed[b.session];
      } else {
        claims[b.session].push_back(id);
      }
      if (given.count(b.slab) == 0) {
        expected_end_[id] = ledger::EventKind::kDaemonRestart;
      } else if (left_out) {
        expected_end_[id] = ledger::EventKind::kFree;
      }
    }

    // The daemon stops as a killed one would leave things: nothing
    // released, nothing recorded.
    broker_->SetReclaimSender(nullptr);
    broker_->ShutdownForRestart();
    broker_.reset();
    keeper_.reset();
    quotas_.reset();
    // The next daemon: the ledger and the state file reopened.
    OpenLedger(/*fresh=*/false, /*defer_recovery=*/true);
    Check(world->ledger->deferred_live().size() == live_.size(),
          absl::StrCat("the reopened ledger has ", world->ledger->deferred_live().size(),
                       " live, the model ", live_.size()));
    state::Snapshot previous;
    OpenState(&previous);
    Check(previous.allocations.size() == live_.size(),
          absl::StrCat("the state file kept ", previous.allocations.size(),
                       " allocations, the model has ", live_.size()));
    MakeBroker(/*restarted=*/true);
    MemoryBroker::RestoreOutcome out = broker_->Restore(previous, {});
    Check(out.allocations == live_.size() && out.closed.empty() && out.sessions_gone == 0 &&
              out.slabs_dropped == 0,
          "restore: " + out.Summary());
    Check(out.slabs_awaiting_handle == out.slabs, "a slab came back without its fd");
    // As RestoreFromPrevious: the keeper takes over the records, the ledger
    // is reconciled.
    for (const state::SlabRecord& r : previous.slabs) keeper_->AdoptSlabRecord(r, false);
    std::set<std::pair<uint64_t, uint64_t>> dropped(out.dropped_holders.begin(),
                                                    out.dropped_holders.end());
    for (const state::HolderRecord& r : previous.holders) {
      if (dropped.count({r.slab_id, r.session}) != 0) {
        world->state->RemoveHolder(r.slot);
      } else {
        keeper_->AdoptHolderRecord(r);
      }
    }
    const size_t closures = world->ledger->Resume(
        out.survivors, out.closed, out.Summary(),
        previous.adopted ? std::max<int64_t>(previous.last_change_ns, 1) : 0);
    Check(closures == 0, "the ledger closed a survivor");

    // The clients come back: rebind, re-present, give fds back.
    std::set<uint64_t> restored_slabs;
    for (const state::SlabRecord& r : previous.slabs) restored_slabs.insert(r.slab_id);
    for (int s = 0; s < kSessions; ++s) {
      if (bound_[s] == 0) continue;
      if (!back(s)) {
        bound_[s] = 0;
        continue;
      }
      PeerCred c{0, kUids[s], kGid};
      absl::StatusOr<std::shared_ptr<Session>> b = broker_->RebindConnection(c, tokens_[s]);
      Check(b.ok() && (*b)->id() == bound_[s], "rebind: " + b.status().ToString());
      c.bound_session = bound_[s];
      v1::ResumeRequest r;
      r.set_session_id(bound_[s]);
      std::set<uint64_t> claimed_slabs;
      for (uint64_t id : claims[s]) {
        const Block& k = live_.at(id);
        v1::Allocation* a = r.add_allocations();
        a->set_id(id);
        a->set_slab_id(k.slab);
        a->set_offset(k.offset);
        a->set_size_bytes(k.size);
        a->set_device_index(k.device);
        claimed_slabs.insert(k.slab);
      }
      absl::StatusOr<v1::ResumeResponse> answer = broker_->Resume(c, r);
      Check(answer.ok(), "resume: " + answer.status().ToString());
      Check(answer->session_id() == bound_[s], "resume: another session");
      Check(answer->lost_size() == 0,
            absl::StrCat("resume lost ", answer->lost_size(), ": ",
                         answer->lost_size() > 0 ? answer->lost(0).status().message() : ""));
      std::set<uint64_t> kept(answer->kept().begin(), answer->kept().end());
      Check(kept == std::set<uint64_t>(claims[s].begin(), claims[s].end()), "resume: kept");
      Check(answer->unclaimed() == unclaimed[s],
            absl::StrCat("resume: unclaimed ", answer->unclaimed(), ", model ", unclaimed[s]));
      std::set<uint64_t> needs(answer->needs_handle().begin(), answer->needs_handle().end());
      for (uint64_t slab : claimed_slabs) Check(needs.count(slab) == 1, "resume: needs_handle");
      for (uint64_t slab : needs) {
        bool held = claimed_slabs.count(slab) != 0 || fds_.count({s, slab}) != 0;
        Check(held && restored_slabs.count(slab) == 1, "resume: a handle it never held");
      }
    }
    for (auto it = fds_.begin(); it != fds_.end();) {
      const int s = it->first.first;
      if (bound_[s] == 0) {  // its client did not come back
        close(it->second);
        it = fds_.erase(it);
        continue;
      }
      if ((mode[s] & 4) == 0) {
        const uint64_t slab = it->first.second;
        bool has_blocks = false;
        for (const auto& [id, b] : live_) has_blocks = has_blocks || b.slab == slab;
        PeerCred c{0, kUids[s], kGid};
        c.bound_session = bound_[s];
        const int dup = fcntl(it->second, F_DUPFD_CLOEXEC, 0);
        Check(dup >= 0, "dup");
        absl::Status g = broker_->AcceptSlabHandle(c, slab, dup);
        // A slab with live blocks is taken back from its holder; others
        // (an empty one, one released while held) may be gone already.
        if (has_blocks) Check(g.ok(), "give back a held slab's fd: " + g.ToString());
      }
      ++it;
    }

    // The grace time ends at the first maintenance tick after Start.
    Check(broker_->Start().ok(), "restarted broker start");
    for (const auto& [id, kind] : expected_end_) Forget(id);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (broker_->ResolveSessionToken(sentinel_token_, PeerCred{0, kSentinelUid, kGid}).ok() ||
           broker_->live_allocations() != live_.size()) {
      Check(absl::Now() < deadline,
            absl::StrCat("after the grace time the table has ", broker_->live_allocations(),
                         " live, the model ", live_.size()));
      absl::SleepFor(absl::Microseconds(200));
    }
    BindSentinel();
    // Survivors: the same id in the same place with the same bytes, read
    // through a fd the new broker gives.
    for (auto& [id, b] : live_) {
      Check(b.tagged, "a block survived whose slab no one held");
      absl::StatusOr<SlabFd> fd = broker_->ExportSlab(Cred(b.session), b.slab);
      Check(fd.ok(), "export a survivor's slab: " + fd.status().ToString());
      Check(fd->size == b.slab_size, "a survivor's slab size");
      const std::string want = Tag(id, b.size);
      std::string got(want.size(), '\0');
      Check(pread(fd->fd, &got[0], got.size(), static_cast<off_t>(b.offset)) ==
                    static_cast<ssize_t>(got.size()) &&
                got == want,
            absl::StrCat("block ", id, "'s bytes changed over the restart"));
      Hold(b.session, b.slab, fd->fd);
    }
    // What each tenant holds may be above the config's quotas now (a
    // SetQuota had raised them): it may only come down.
    floor_.clear();
    for (uint32_t t = 1; t <= 3; ++t) floor_[t] = quotas_->Holdings(t);
    ReplayLedger();
    Check(expected_end_.empty(), absl::StrCat(expected_end_.size(),
                                              " block(s) did not end as predicted"));
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
          auto want = expected_end_.find(e.allocation_id);
          if (want != expected_end_.end()) {
            Check(e.kind == want->second,
                  absl::StrCat("block ", e.allocation_id, " ended with ",
                               ledger::KindName(e.kind), ", not ",
                               ledger::KindName(want->second), ": ", e.detail));
            expected_end_.erase(want);
          }
        }
      }
      if (events->size() < q.limit) break;
    }
  }

  std::unique_ptr<quota::QuotaBook> quotas_;
  std::unique_ptr<DurableSlabKeeper> keeper_;
  std::unique_ptr<MemoryBroker> broker_;
  uint64_t bound_[kSessions] = {};
  std::string tokens_[kSessions];
  std::string sentinel_token_;
  std::map<std::pair<int, uint64_t>, int> fds_;  // (session, slab) -> the fd it holds
  // After a restart, until the ledger shows them: how blocks must end.
  std::map<uint64_t, ledger::EventKind> expected_end_;
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
  state::Snapshot none;
  OpenState(&none);
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
