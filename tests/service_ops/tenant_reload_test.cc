// A reload of the tenant section through ApplyReloadableConfig, with a real
// MemoryBroker (SimBackend), quota book and (file-less) ledger: what SIGHUP
// does in the daemon, minus the signal.
//  - A uid moved to another tenant: its live session stays charged to the
//    tenant it was fixed to (new allocations, slab exports, the quota too);
//    a new session of the same uid is charged to the new tenant.
//  - Ids: kept by name, a new tenant gets one never used.
//  - A removed tenant's allocations stay charged and visible (GetStats,
//    quota book) under its name until freed; its quota stays enforced.
//  - A bad file changes nothing (all or nothing), and names its line.
//  - Switching between no tenants and tenants waits for a restart.
//  - Socket tenants: a config tenant's socket and a tenant made at run time
//    (PutTenant) outlive reloads with their ids; the runtime one gets its
//    own quota back (not the config's), its callers stay charged to it, and
//    a config that takes its name is refused, changing nothing.
//  - Reloads racing allocations and frees of moving uids (run under TSan).
// Callers are sleeping children forked before the broker's threads start
// (identity is taken as given: uids are forged).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/config/daemon_config.h"
#include "server/config/reloadable.h"
#include "server/ledger/tenant_ledger.h"
#include "server/quota/quota_book.h"
#include "server/core/memory_broker.h"
#include "tests/common/poll_until.h"
#include "tests/core/stats_of.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kUidX = 4242;
constexpr uid_t kUidY = 4243;
constexpr int kChildren = 6;

pid_t SleepingChild() {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) pause();
  }
  return pid;
}

const v1::TenantStats* Row(const v1::GetStatsResponse& s, uint32_t id) {
  for (const v1::TenantStats& t : s.tenants()) {
    if (t.tenant() == id) return &t;
  }
  return nullptr;
}

class TenantReloadTest : public ::testing::Test {
 protected:
  TenantReloadTest() {
    // Children first: the broker's threads do not exist yet.
    for (int i = 0; i < kChildren; ++i) children_.push_back(SleepingChild());
  }

  // Starts the daemon's parts with `text` as the config in force.
  void Start(const std::string& text) {
    google::protobuf::TextFormat::ParseInfoTree where;
    absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig("start.textproto", text, &where);
    ASSERT_TRUE(config.ok()) << config.status();
    for (uint32_t i = 0; i < 2; ++i) {
      placement::DeviceView v;
      v.index = i;
      v.uuid = backend_.devices()[i].uuid;
      v.total_bytes = backend_.devices()[i].total_bytes;
      devices_.push_back(v);
    }
    absl::StatusOr<tenants::TenantDirectory> dir =
        tenants::TenantDirectory::Build(*config, &where, "start.textproto", devices_);
    ASSERT_TRUE(dir.ok()) << dir.status();
    for (const tenants::Tenant& t : dir->tenants()) quotas_.SetQuota(t.id, t.quota);
    holder_ = std::make_unique<tenants::TenantDirectoryHolder>(*std::move(dir));
    absl::StatusOr<std::unique_ptr<ledger::TenantLedger>> ledger =
        ledger::TenantLedger::Open(ledger::LedgerOptions{});
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ledger_ = *std::move(ledger);
    BrokerOptions options;
    options.pool.slab_size = 16 * kMiB;
    options.pool.granularity = 4096;
    options.tenants = holder_.get();
    options.quotas = &quotas_;
    options.ledger = ledger_.get();
    broker_ = std::make_unique<MemoryBroker>(&backend_, options);
    ASSERT_TRUE(broker_->Start().ok());
  }

  ~TenantReloadTest() override {
    if (broker_ != nullptr) broker_->Shutdown();
    broker_.reset();
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  absl::StatusOr<ReloadOutcome> Reload(const std::string& text) {
    google::protobuf::TextFormat::ParseInfoTree where;
    absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig("cfg.textproto", text, &where);
    if (!config.ok()) return config.status();
    absl::StatusOr<Settings> settings = ResolveSettings(CommandLine{}, "cfg.textproto", *config);
    if (!settings.ok()) return settings.status();
    ReloadTargets targets{broker_.get(), &devices_, holder_.get(), &quotas_, ledger_.get()};
    return ApplyReloadableConfig(*settings, &where, targets, /*at_start=*/false);
  }

  PeerCred Cred(int child, uid_t uid) const { return PeerCred{children_[child], uid, uid}; }

  absl::StatusOr<v1::AllocateResponse> Alloc(const PeerCred& who, uint64_t bytes) {
    v1::AllocateRequest r;
    r.set_size_bytes(bytes);
    r.mutable_placement()->add_devices("0");
    return broker_->AllocateAndWait(who, r);
  }

  absl::Status Free(const PeerCred& who, uint64_t id) {
    v1::FreeRequest r;
    r.set_id(id);
    return broker_->Free(who, r).status();
  }

  v1::GetStatsResponse RootStats() const { return StatsOf(*broker_, PeerCred{getpid(), 0, 0}); }

  SimBackend backend_{{256 * kMiB, 256 * kMiB}, {}};
  std::vector<placement::DeviceView> devices_;
  quota::QuotaBook quotas_{2};
  std::unique_ptr<tenants::TenantDirectoryHolder> holder_;
  std::unique_ptr<ledger::TenantLedger> ledger_;
  std::unique_ptr<MemoryBroker> broker_;
  std::vector<pid_t> children_;
};

constexpr char kOne[] = R"(
tenant { name: "t1" uids: 4242 quota { total_bytes: "8MiB" } }
)";
// uid 4242 moves to t2 (new, priority 3), t3 is added, t1 stays (no uids).
constexpr char kMoved[] = R"(
tenant { name: "t2" uids: 4242 priority: 3 quota { total_bytes: "32MiB" } }
tenant { name: "t1" gids: 77 quota { total_bytes: "8MiB" } }
tenant { name: "t3" uids: 4243 }
)";

TEST_F(TenantReloadTest, MovedUidKeepsTheLiveSessionsTenantNewSessionsTakeTheNewOne) {
  Start(kOne);
  const PeerCred old_session = Cred(0, kUidX);
  absl::StatusOr<v1::AllocateResponse> a = Alloc(old_session, kMiB);
  ASSERT_TRUE(a.ok()) << a.status();

  absl::StatusOr<ReloadOutcome> r = Reload(kMoved);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->restart_only.empty());
  std::string lines;
  for (const std::string& l : r->applied) lines += l + "\n";
  EXPECT_TRUE(absl::StrContains(lines, "added \"t2\" (id 2), \"t3\" (id 3)")) << lines;
  EXPECT_TRUE(absl::StrContains(lines, "quotas of 3 tenant(s) from the config")) << lines;

  // Ids: t1 kept 1; t2 and t3 new.
  std::shared_ptr<const tenants::TenantDirectory> dir = holder_->Get();
  EXPECT_EQ(dir->Find("t1")->id, 1u);
  EXPECT_EQ(dir->Find("t2")->id, 2u);
  EXPECT_EQ(dir->Find("t3")->id, 3u);

  // The old session: still t1, for new allocations too, under t1's quota.
  absl::StatusOr<v1::AllocateResponse> b = Alloc(old_session, kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<v1::AllocateResponse> over = Alloc(old_session, 7 * kMiB);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.status().message(), "\"t1\"")) << over.status();
  // Its slab (t1's) is still given to it.
  absl::StatusOr<SlabFd> fd =
      broker_->ExportSlab(old_session, b->allocations(0).slab_id());
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(fd->fd);

  // A new process of the same uid: t2, 32 MiB allowed.
  const PeerCred new_session = Cred(1, kUidX);
  absl::StatusOr<v1::AllocateResponse> c = Alloc(new_session, 9 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->allocations(0).slab_id(), b->allocations(0).slab_id());
  // ... which may not map t1's slab (to it, a slab that does not exist).
  EXPECT_EQ(broker_->ExportSlab(new_session, b->allocations(0).slab_id()).status().code(),
            absl::StatusCode::kNotFound);

  v1::GetStatsResponse s = RootStats();
  ASSERT_NE(Row(s, 1), nullptr);
  EXPECT_EQ(Row(s, 1)->name(), "t1");
  EXPECT_EQ(Row(s, 1)->used_bytes(), 2 * kMiB);
  EXPECT_EQ(Row(s, 1)->quota().total_bytes(), 8 * kMiB);
  ASSERT_NE(Row(s, 2), nullptr);
  EXPECT_EQ(Row(s, 2)->name(), "t2");
  EXPECT_EQ(Row(s, 2)->used_bytes(), 9 * kMiB);
  EXPECT_EQ(Row(s, 2)->quota().total_bytes(), 32 * kMiB);
  EXPECT_EQ(quotas_.Holdings(1).total_bytes, 2 * kMiB);
  EXPECT_EQ(quotas_.Holdings(2).total_bytes, 9 * kMiB);

  // The uid itself (not an admin) sees both of its tenants' rows.
  v1::GetStatsResponse mine = StatsOf(*broker_, new_session);
  EXPECT_NE(Row(mine, 1), nullptr);
  EXPECT_NE(Row(mine, 2), nullptr);
  EXPECT_EQ(Row(mine, 3), nullptr);
}

TEST_F(TenantReloadTest, RemovedTenantStaysChargedAndVisibleUntilFreed) {
  Start(kOne);
  const PeerCred old_session = Cred(0, kUidX);
  absl::StatusOr<v1::AllocateResponse> a = Alloc(old_session, 3 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();

  // t1 gone; uid 4242 now t2.
  absl::StatusOr<ReloadOutcome> r = Reload(R"(tenant { name: "t2" uids: 4242 })");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::StrContains(r->applied[2], "removed \"t1\" (id 1)")) << r->applied[2];
  std::shared_ptr<const tenants::TenantDirectory> dir = holder_->Get();
  EXPECT_EQ(dir->Find("t1"), nullptr);
  EXPECT_EQ(dir->Find("t2")->id, 2u);

  v1::GetStatsResponse s = RootStats();
  ASSERT_NE(Row(s, 1), nullptr);
  EXPECT_EQ(Row(s, 1)->name(), "t1");
  EXPECT_EQ(Row(s, 1)->used_bytes(), 3 * kMiB);
  EXPECT_EQ(Row(s, 1)->quota().total_bytes(), 8 * kMiB);  // still enforced:
  absl::StatusOr<v1::AllocateResponse> over = Alloc(old_session, 6 * kMiB);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  absl::StatusOr<v1::AllocateResponse> fits = Alloc(old_session, 5 * kMiB);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(quotas_.Holdings(1).total_bytes, 8 * kMiB);

  ASSERT_TRUE(Free(old_session, a->allocations(0).id()).ok());
  ASSERT_TRUE(Free(old_session, fits->allocations(0).id()).ok());
  EXPECT_EQ(quotas_.Holdings(1).total_bytes, 0u);
  s = RootStats();
  if (const v1::TenantStats* row = Row(s, 1)) {  // only its empty slab is left
    EXPECT_EQ(row->used_bytes(), 0u);
    EXPECT_EQ(row->allocation_count(), 0u);
  }
  // The ledger folded both under the name "t1".
  bool seen = false;
  for (const auto& [key, row] : ledger_->Usage()) {
    if (key.first == "t1") seen = true;
  }
  // (Folded by the writer: at most one cycle behind.)
  for (int i = 0; i < 100 && !seen; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    for (const auto& [key, row] : ledger_->Usage()) {
      if (key.first == "t1") seen = true;
    }
  }
  EXPECT_TRUE(seen);
}

TEST_F(TenantReloadTest, BadFileChangesNothingAndNamesItsLine) {
  Start(kOne);
  std::shared_ptr<const tenants::TenantDirectory> before = holder_->Get();
  absl::StatusOr<ReloadOutcome> r = Reload(
      "tenant { name: \"t1\" uids: 4242 quota { total_bytes: \"1MiB\" } }\n"
      "tenant {\n"
      "  name: \"t2\"\n"
      "  uids: 4242\n"
      "}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "cfg.textproto:4:")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "uid 4242")) << r.status();
  EXPECT_EQ(holder_->Get(), before);
  EXPECT_EQ(*quotas_.GetQuota(1).total_bytes, 8 * kMiB);
  absl::StatusOr<v1::AllocateResponse> a = Alloc(Cred(0, kUidX), 4 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(RootStats().tenants(0).name(), "t1");
}

TEST_F(TenantReloadTest, SwitchingTenantModeWaitsForARestart) {
  Start("");
  absl::StatusOr<ReloadOutcome> r = Reload(kOne);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->restart_only.size(), 1u);
  EXPECT_TRUE(absl::StrContains(r->restart_only[0], "tenants")) << r->restart_only[0];
  EXPECT_FALSE(holder_->Get()->configured());
  absl::StatusOr<v1::AllocateResponse> a = Alloc(Cred(0, kUidX), kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(RootStats().tenants(0).tenant(), kUidX);
  // A bad tenant section is still refused with its line.
  r = Reload("tenant {\n name: \"a\"\n quota { total_bytes: \"lots\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "cfg.textproto:3:")) << r.status();
}

// Reloads that move two uids between tenants (and drop and re-add one)
// while both allocate and free: every allocation is charged to one tenant
// and credited back to the same one; nothing is left charged at the end.
constexpr char kSocketsOne[] = R"(
tenant_socket_dir: "/run/t"
tenant { name: "t1" uids: 4242 socket: "t1.sock" quota { total_bytes: "8MiB" } }
)";

TEST_F(TenantReloadTest, SocketTenantsOutliveReloads) {
  ASSERT_NO_FATAL_FAILURE(Start(kSocketsOne));
  ASSERT_NE(holder_->Get()->Find("t1"), nullptr);
  EXPECT_EQ(holder_->Get()->Find("t1")->socket, "/run/t/t1/t1.sock");
  // A tenant made at run time, as PutTenant does (its quota in the book).
  tenants::TenantDirectory::SocketTenantSpec spec;
  spec.name = "claim-1";
  spec.socket = "/run/t/claim-1/gpumemd.sock";
  spec.quota.total_bytes = 4 * kMiB;
  absl::StatusOr<tenants::TenantDirectory> with = holder_->Get()->WithSocketTenant(spec);
  ASSERT_TRUE(with.ok()) << with.status();
  const uint32_t claim = with->Find("claim-1")->id;
  quotas_.SetQuota(claim, spec.quota);
  holder_->Replace(*std::move(with));
  PeerCred pod = Cred(0, 0);  // uid 0 through claim-1's socket
  pod.socket_tenant = claim;
  ASSERT_TRUE(Alloc(pod, 3 * kMiB).ok());
  tenants::Quota raised;
  raised.total_bytes = 64 * kMiB;
  quotas_.SetQuota(claim, raised);  // as SetQuota would, until a reload

  absl::StatusOr<ReloadOutcome> r = Reload(R"(
    tenant_socket_dir: "/run/t"
    tenant { name: "t1" uids: 4242 socket: "t1.sock" quota { total_bytes: "16MiB" } }
    tenant { name: "t2" uids: 4243 socket: "/run/t/t2/s" }
  )");
  ASSERT_TRUE(r.ok()) << r.status();
  std::shared_ptr<const tenants::TenantDirectory> dir = holder_->Get();
  ASSERT_NE(dir->Find("t1"), nullptr);
  ASSERT_NE(dir->Find("t2"), nullptr);
  EXPECT_EQ(dir->Find("t1")->id, 1u);
  EXPECT_EQ(dir->Find("t1")->socket, "/run/t/t1/t1.sock");
  EXPECT_EQ(dir->Find("t2")->socket, "/run/t/t2/s");
  ASSERT_NE(dir->Find("claim-1"), nullptr);
  EXPECT_EQ(dir->Find("claim-1")->id, claim);
  EXPECT_EQ(*quotas_.GetQuota(claim).total_bytes, 4 * kMiB) << "its PutTenant quota is back";
  EXPECT_EQ(Alloc(pod, 2 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(Alloc(pod, kMiB).ok());
  const v1::GetStatsResponse stats = RootStats();
  const v1::TenantStats* row = Row(stats, claim);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->name(), "claim-1");
  EXPECT_EQ(row->used_bytes(), 4 * kMiB);

  // A config that takes its name: refused, naming the line; nothing changes.
  absl::StatusOr<ReloadOutcome> clash = Reload(
      "tenant_socket_dir: \"/run/t\"\ntenant { name: \"t1\" uids: 4242 }\n"
      "tenant {\n name: \"claim-1\" uids: 4244 }\n");
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(clash.status().message(), "cfg.textproto:3:")) << clash.status();
  EXPECT_TRUE(absl::StrContains(clash.status().message(), "made at run time")) << clash.status();
  EXPECT_EQ(holder_->Get()->Find("t2")->socket, "/run/t/t2/s");
  EXPECT_EQ(holder_->Get()->Find("claim-1")->id, claim);
}

TEST_F(TenantReloadTest, ReloadsRaceAllocationsAndFrees) {
  const char* configs[] = {
      R"(tenant { name: "a" uids: [4242, 4243] } tenant { name: "b" })",
      R"(tenant { name: "b" uids: 4242 priority: 2 } tenant { name: "a" uids: 4243 })",
      R"(tenant { name: "c" uids: [4242, 4243] } tenant { name: "b" })",
      R"(tenant { name: "a" uids: 4242 } tenant { name: "c" uids: 4243 })",
  };
  Start(configs[0]);
  std::atomic<bool> stop{false};
  std::atomic<int> served{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      const PeerCred who = Cred(w, w % 2 == 0 ? kUidX : kUidY);
      while (!stop.load()) {
        // Every one is served, whichever tenant the reloads leave its
        // session's uid in (the session keeps the tenant it was fixed to).
        absl::StatusOr<v1::AllocateResponse> a = Alloc(who, 64 * 1024);
        if (!a.ok()) {
          ADD_FAILURE() << "worker " << w << ": " << a.status();
          stop = true;
          return;
        }
        ++served;
        EXPECT_TRUE(Free(who, a->allocations(0).id()).ok());
      }
    });
  }
  for (int i = 1; i <= 40; ++i) {
    absl::StatusOr<ReloadOutcome> r = Reload(configs[i % 4]);
    ASSERT_TRUE(r.ok()) << r.status();
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_TRUE(testing::PollUntil([&] { return served.load() >= 50 || stop.load(); }));
  stop = true;
  for (std::thread& t : workers) t.join();
  std::shared_ptr<const tenants::TenantDirectory> dir = holder_->Get();
  // Ids never reused: a, b, c got 1, 2, then c 3; "a" dropped at config 2
  // and re-added at config 3 as a new tenant each round.
  EXPECT_GE(dir->next_id(), 4u);
  for (uint32_t id = 1; id < dir->next_id(); ++id) {
    EXPECT_EQ(quotas_.Holdings(id).total_bytes, 0u) << "tenant " << id;
    EXPECT_EQ(quotas_.Holdings(id).allocations, 0u) << "tenant " << id;
  }
  EXPECT_EQ(broker_->live_allocations(), 0u);
}

}  // namespace
}  // namespace gpumem
