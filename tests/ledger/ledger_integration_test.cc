// Tenants, quotas, waiting admission and the ledger against real daemons and
// real client processes (quota_client): the quota holds against 8 racing
// processes, a kill -9 of the daemon loses nothing committed and closes what
// was live, waiting requests are served in time and in priority order, and
// GetStats says when the ledger cannot write.
#include <signal.h>
#include <sys/stat.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
using client::Client;
using client::PlacementRefusalOf;
namespace {

using testing::ChildProcess;
using testing::DaemonProcess;
using testing::MakeTempDir;
using testing::PollUntil;
using testing::RunfilePath;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kNobody = 65534;
constexpr uid_t kOther = 65533;

using Rows = std::vector<std::vector<std::string>>;

// Runs `sql` on the ledger file (read-only); every column as text.
Rows Sql(const std::string& path, const std::string& sql) {
  Rows rows;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << "cannot open " << path;
    return rows;
  }
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
  } else {
    while (sqlite3_step(s) == SQLITE_ROW) {
      std::vector<std::string>& row = rows.emplace_back();
      for (int i = 0; i < sqlite3_column_count(s); ++i) {
        const unsigned char* t = sqlite3_column_text(s, i);
        row.push_back(t ? reinterpret_cast<const char*>(t) : "NULL");
      }
    }
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return rows;
}

uint64_t U(const std::string& s) {
  uint64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(s, &v)) << s;
  return v;
}

class LedgerIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string WriteConfig(const std::string& text) {
    const std::string path = dir_ + "/tenants.textproto";
    std::ofstream(path) << text;
    return path;
  }

  std::unique_ptr<DaemonProcess> StartDaemon(std::vector<std::string> args) {
    auto d = std::make_unique<DaemonProcess>(std::move(args));
    EXPECT_TRUE(d->Start()) << d->Log();
    return d;
  }

  std::unique_ptr<ChildProcess> StartClient(const DaemonProcess& d,
                                            std::vector<std::string> args, uid_t uid = 0) {
    std::string binary = RunfilePath("tests/ledger/quota_client");
    if (uid != 0) {
      // Runfiles live under root's home, which other uids cannot enter.
      const std::string copy = dir_ + "/quota_client";
      if (!std::filesystem::exists(copy)) {
        std::filesystem::copy_file(binary, copy);
        chmod(copy.c_str(), 0755);
      }
      binary = copy;
    }
    std::vector<std::string> argv = {binary, "--socket=" + d.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(argv, uid);
  }

  // Waiting requests the daemon counts now.
  static uint64_t Waiting(Client& c) {
    auto stats = c.GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->counters().waiting_requests() : ~uint64_t{0};
  }

  // Waits until the daemon has a session for `pid` (it has called Allocate).
  static bool WaitForSession(Client& c, pid_t pid) {
    for (int i = 0; i < 200; ++i) {
      auto stats = c.GetStats();
      if (stats.ok()) {
        for (const auto& s : stats->sessions()) {
          if (s.pid() == pid) return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }

  std::string dir_;
};

TEST_F(LedgerIntegrationTest, EightProcessesRacingOneTenantNeverPassItsQuota) {
  const std::string ledger = dir_ + "/ledger.db";
  const uint64_t kQuota = 40 * kMiB;
  auto daemon = StartDaemon({"--sim_devices=2x1GiB", "--slab_size=64MiB", "--ledger=" + ledger,
                             "--config=" + WriteConfig(R"(
      tenant { name: "race" uids: 0 quota { total_bytes: "40MiB" } })")});
  std::vector<std::unique_ptr<ChildProcess>> racers;
  for (int i = 0; i < 8; ++i) {
    racers.push_back(StartClient(*daemon, {"--race", "--size=" + std::to_string(16 * kMiB),
                                           "--iterations=150"}));
  }
  uint64_t granted = 0, refused = 0;
  for (auto& r : racers) {
    std::vector<std::string> words = absl::StrSplit(r->ReadLine(60000), ' ');
    ASSERT_EQ(words.size(), 3u) << absl::StrJoin(words, " ");
    ASSERT_EQ(words[0], "done");
    granted += U(words[1]);
    refused += U(words[2]);
  }
  EXPECT_GT(granted, 0u);
  EXPECT_GT(refused, 0u) << "the racers never contended; the test proves nothing";

  auto client = Client::Connect(daemon->socket());
  ASSERT_TRUE(client.ok());
  auto usage = (*client)->GetUsage();
  ASSERT_TRUE(usage.ok()) << usage.status();
  ASSERT_EQ(usage->tenants_size(), 1);
  EXPECT_EQ(usage->tenants(0).current_bytes(), 0u);
  EXPECT_LE(usage->tenants(0).peak_bytes(), kQuota);
  client->reset();
  ASSERT_EQ(daemon->Stop(), 0) << daemon->Log();

  // The ledger's own peak, and a replay of its events in commit order.
  Rows peak = Sql(ledger, "SELECT peak_bytes, current_bytes FROM usage "
                          "WHERE tenant = 'race' AND device = -1");
  ASSERT_EQ(peak.size(), 1u);
  EXPECT_LE(U(peak[0][0]), kQuota);
  EXPECT_GE(U(peak[0][0]), 16 * kMiB);
  EXPECT_EQ(peak[0][1], "0");
  uint64_t held = 0, most = 0, allocs = 0;
  for (const auto& row : Sql(ledger, "SELECT kind, bytes FROM events ORDER BY seq")) {
    if (row[0] == "ALLOCATE") {
      held += U(row[1]);
      ++allocs;
    } else if (row[0] == "FREE") {
      held -= U(row[1]);
    }
    most = std::max(most, held);
  }
  EXPECT_EQ(allocs, granted);
  EXPECT_EQ(held, 0u);
  EXPECT_EQ(most, U(peak[0][0]));
}

TEST_F(LedgerIntegrationTest, KillNineThenRestartOnTheSameLedger) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  const std::string ledger = dir_ + "/ledger.db";
  const std::vector<std::string> args = {
      "--sim_devices=2x1GiB", "--slab_size=64MiB", "--ledger=" + ledger,
      "--config=" + WriteConfig(absl::StrCat(R"(
        tenant { name: "a" uids: 0 }
        tenant { name: "b" uids: )", kNobody, " }"))};
  auto first = StartDaemon(args);
  auto holder_a = StartClient(*first, {"--size=" + std::to_string(kMiB), "--count=3"});
  auto holder_b =
      StartClient(*first, {"--size=" + std::to_string(2 * kMiB), "--count=2"}, kNobody);
  std::set<uint64_t> live;
  for (ChildProcess* c : {holder_a.get(), holder_b.get()}) {
    ASSERT_EQ(c->ReadLine(), "waiting");
    for (std::string line = c->ReadLine(); line != "ready"; line = c->ReadLine()) {
      ASSERT_EQ(line.rfind("alloc ", 0), 0u) << line;
      live.insert(U(line.substr(6)));
    }
  }
  ASSERT_EQ(live.size(), 5u);
  auto churn = StartClient(*first, {"--race", "--size=" + std::to_string(kMiB),
                                    "--iterations=20"});
  ASSERT_EQ(churn->ReadLine().rfind("done 20 0", 0), 0u);
  {
    // GetLedger answers after the writer committed what came before it.
    auto c = Client::Connect(first->socket());
    ASSERT_TRUE(c.ok());
    v1::GetLedgerRequest req;
    req.set_limit(1000);
    auto events = (*c)->GetLedger(req);
    ASSERT_TRUE(events.ok()) << events.status();
    EXPECT_EQ(events->events_size(), 5 + 40);
  }
  ASSERT_EQ(kill(first->pid(), SIGKILL), 0);
  EXPECT_EQ(first->Stop(), -SIGKILL);
  holder_a.reset();
  holder_b.reset();

  EXPECT_EQ(Sql(ledger, "PRAGMA integrity_check"), (Rows{{"ok"}}));
  const uint64_t max_id_before =
      U(Sql(ledger, "SELECT MAX(allocation_id) FROM events")[0][0]);

  auto second = StartDaemon(args);
  EXPECT_NE(second->Log().find("5 allocation(s) live"), std::string::npos) << second->Log();
  auto c = Client::Connect(second->socket());
  ASSERT_TRUE(c.ok());
  auto usage = (*c)->GetUsage();
  ASSERT_TRUE(usage.ok());
  for (const auto& t : usage->tenants()) {
    EXPECT_EQ(t.current_bytes(), 0u) << t.name();
    EXPECT_EQ(t.peak_bytes(), t.name() == "a" ? 3 * kMiB + kMiB : 4 * kMiB) << t.name();
  }
  v1::AllocateRequest req;
  req.set_size_bytes(kMiB);
  auto fresh = (*c)->AllocateRaw(req);
  ASSERT_TRUE(fresh.ok());
  EXPECT_GT(fresh->allocations(0).id(), max_id_before);
  c->reset();
  ASSERT_EQ(second->Stop(), 0) << second->Log();

  EXPECT_EQ(Sql(ledger, "PRAGMA integrity_check"), (Rows{{"ok"}}));
  std::set<uint64_t> restarted;
  for (const auto& row : Sql(ledger, "SELECT allocation_id FROM events "
                                     "WHERE kind = 'DAEMON_RESTART'")) {
    restarted.insert(U(row[0]));
  }
  EXPECT_EQ(restarted, live);
  // Per tenant, the bytes the events added equal the bytes they took away,
  // and the usage table agrees that nothing is held.
  for (const auto& row : Sql(ledger, R"(
        SELECT tenant,
               SUM(CASE WHEN kind = 'ALLOCATE' THEN bytes ELSE 0 END),
               SUM(CASE WHEN kind IN ('FREE', 'SESSION_END', 'DAEMON_STOP',
                                      'DAEMON_RESTART') THEN bytes ELSE 0 END)
        FROM events GROUP BY tenant)")) {
    EXPECT_EQ(row[1], row[2]) << "tenant " << row[0];
  }
  EXPECT_EQ(Sql(ledger, "SELECT COUNT(*) FROM usage WHERE current_bytes != 0"),
            (Rows{{"0"}}));
  EXPECT_EQ(Sql(ledger, "SELECT COUNT(*) FROM live"), (Rows{{"0"}}));
}

// GetStats says what the ledger writer knows: ok and counting; FAILING,
// naming the file and holding the events, while the file is away (any
// caller sees it, a non-administrator too); ok again once it is back, with
// the held events committed; with --ledger=none, off.
TEST_F(LedgerIntegrationTest, GetStatsShowsTheLedgerFailingAndWritingAgain) {
  const std::string ledger = dir_ + "/ledger.db";
  const std::string aside = dir_ + "/aside.db";
  auto daemon = StartDaemon({"--sim_devices=1x1GiB", "--slab_size=64MiB", "--ledger=" + ledger});
  auto c = Client::Connect(daemon->socket());
  ASSERT_TRUE(c.ok()) << c.status();
  auto ledger_status = [&] {
    absl::StatusOr<v1::GetStatsResponse> stats = (*c)->GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->ledger() : v1::LedgerStatus();
  };
  auto churn = [&](int n) {
    v1::AllocateRequest req;
    req.set_size_bytes(kMiB);
    for (int i = 0; i < n; ++i) {
      auto a = (*c)->AllocateRaw(req);
      ASSERT_TRUE(a.ok()) << a.status();  // served whatever the ledger does
      ASSERT_TRUE((*c)->Free(a->allocations(0).id()).ok());
    }
  };

  churn(5);
  v1::LedgerStatus l;
  ASSERT_TRUE(PollUntil([&] { return (l = ledger_status()).committed_events() >= 10; }))
      << l.DebugString();
  EXPECT_TRUE(l.enabled());
  EXPECT_EQ(l.path(), ledger);
  EXPECT_FALSE(l.failing());
  EXPECT_EQ(l.last_error(), "");
  EXPECT_EQ(l.held_events(), 0u);
  EXPECT_EQ(l.failed_commits(), 0u);
  EXPECT_GT(l.commits(), 0u);
  const uint64_t committed_before = l.committed_events();

  // The file away: commits fail, the events are held, allocations go on.
  ASSERT_EQ(rename(ledger.c_str(), aside.c_str()), 0);
  churn(10);
  ASSERT_TRUE(PollUntil([&] {
    l = ledger_status();
    return l.failing() && l.held_events() >= 20;
  })) << l.DebugString();
  EXPECT_NE(l.last_error().find(ledger), std::string::npos) << l.last_error();
  EXPECT_NE(l.last_error().find("was removed while gpumemd ran"), std::string::npos)
      << l.last_error();
  EXPECT_GT(l.failed_commits(), 0u);
  EXPECT_EQ(l.dropped_events(), 0u);
  EXPECT_EQ(l.committed_events(), committed_before);
  if (geteuid() == 0) {
    // Not an administrator, not the allocations' tenant: sees it all the same.
    auto other = StartClient(*daemon, {"--ledger_status"}, kNobody);
    const std::string line = other->ReadLine();
    EXPECT_EQ(line.rfind("ledger 1 1 ", 0), 0u) << line;
    EXPECT_NE(line.find(ledger + "|ledger " + ledger + " was removed"), std::string::npos)
        << line;
    EXPECT_EQ(other->Wait(), 0);
  }

  // Back at its path: the held events and the gap are committed.
  ASSERT_EQ(rename(aside.c_str(), ledger.c_str()), 0);
  ASSERT_TRUE(PollUntil([&] {
    l = ledger_status();
    return !l.failing() && l.held_events() == 0;
  })) << l.DebugString();
  EXPECT_EQ(l.last_error(), "");
  EXPECT_GE(l.committed_events(), committed_before + 20);
  EXPECT_GT(l.failed_commits(), 0u);  // since start: the outage stays counted
  c->reset();
  ASSERT_EQ(daemon->Stop(), 0) << daemon->Log();
  EXPECT_EQ(Sql(ledger, "SELECT COUNT(*) FROM events WHERE kind = 'LEDGER_GAP'"),
            (Rows{{"1"}}));
  EXPECT_EQ(Sql(ledger, "SELECT COUNT(*) FROM events WHERE kind = 'ALLOCATE'"),
            (Rows{{"15"}}));

  auto off = StartDaemon({"--sim_devices=1x1GiB", "--ledger=none"});
  c = Client::Connect(off->socket());
  ASSERT_TRUE(c.ok()) << c.status();
  churn(2);
  l = ledger_status();
  EXPECT_TRUE(l.has_enabled());
  EXPECT_FALSE(l.enabled());
  EXPECT_EQ(l.path(), "");
  EXPECT_FALSE(l.failing());
  EXPECT_EQ(l.committed_events(), 0u);
  c->reset();
  EXPECT_EQ(off->Stop(), 0) << off->Log();
}

// The daemon's own times (its ledger events' time_unix_ns, bounded by this
// test's clock before and after each call): the waiter is queued before the
// free and granted after it, within a second of the free's event, long
// before its wait_ms (30 s), so the free served it, not its deadline. (A
// second is the margin for a sanitizer build on a loaded 2-core machine.)
TEST_F(LedgerIntegrationTest, WaiterIsServedAtTheFree) {
  auto daemon = StartDaemon(
      {"--sim_devices=1x64MiB", "--slab_size=64MiB", "--ledger=" + dir_ + "/ledger.db"});
  auto c = Client::Connect(daemon->socket());
  ASSERT_TRUE(c.ok());
  v1::AllocateRequest big;
  big.set_size_bytes(48 * kMiB);
  auto held = (*c)->AllocateRaw(big);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<v1::AllocateResponse> waited;
  std::thread waiter([&] {
    v1::AllocateRequest req;
    req.set_size_bytes(40 * kMiB);
    req.set_wait_ms(30000);
    waited = (*c)->AllocateRaw(req);
  });
  // Queued: the daemon counts it as waiting.
  ASSERT_TRUE(PollUntil([&] {
    auto stats = (*c)->GetStats();
    return stats.ok() && stats->counters().waiting_requests() == 1;
  })) << "the waiter was never queued";
  const int64_t before_free = absl::GetCurrentTimeNanos();
  ASSERT_TRUE((*c)->Free(held->allocations(0).id()).ok());
  const int64_t after_free = absl::GetCurrentTimeNanos();
  waiter.join();
  const int64_t after_grant = absl::GetCurrentTimeNanos();
  ASSERT_TRUE(waited.ok()) << waited.status();

  v1::GetLedgerRequest req;
  req.set_limit(1000);
  auto events = (*c)->GetLedger(req);
  ASSERT_TRUE(events.ok()) << events.status();
  int64_t freed_ns = 0, granted_ns = 0;
  for (const v1::LedgerEvent& e : events->events()) {
    if (e.kind() == "FREE" && e.allocation_id() == held->allocations(0).id()) {
      freed_ns = e.time_unix_ns();
    }
    if (e.kind() == "ALLOCATE" && e.allocation_id() == waited->allocations(0).id()) {
      granted_ns = e.time_unix_ns();
    }
  }
  ASSERT_NE(freed_ns, 0) << "no FREE event for the held block";
  ASSERT_NE(granted_ns, 0) << "no ALLOCATE event for the waiter";
  EXPECT_GE(freed_ns, before_free);
  EXPECT_LE(freed_ns, after_free);
  EXPECT_GE(granted_ns, freed_ns) << "the waiter was granted before the free";
  EXPECT_LE(granted_ns, after_grant);
  EXPECT_LT(granted_ns - freed_ns, int64_t{1000000000})
      << "granted " << (granted_ns - freed_ns) / 1000000 << " ms after the free";
  c->reset();
  EXPECT_EQ(daemon->Stop(), 0);
}

TEST_F(LedgerIntegrationTest, HigherPriorityWaiterGoesFirstAndDeadWaitersAreDropped) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
  auto daemon = StartDaemon({"--sim_devices=1x64MiB", "--slab_size=64MiB",
                             "--ledger=" + dir_ + "/ledger.db",
                             "--config=" + WriteConfig(absl::StrCat(R"(
      tenant { name: "holder" uids: 0 }
      tenant { name: "low" priority: 1 uids: )", kNobody, R"( }
      tenant { name: "high" priority: 9 uids: )", kOther, " }"))});
  auto c = Client::Connect(daemon->socket());
  ASSERT_TRUE(c.ok());
  v1::AllocateRequest big;
  big.set_size_bytes(48 * kMiB);
  auto held = (*c)->AllocateRaw(big);
  ASSERT_TRUE(held.ok());
  const std::vector<std::string> ask = {"--size=" + std::to_string(40 * kMiB),
                                        "--wait_ms=20000"};
  // A waiter that dies is dropped: it must not take the memory later.
  auto doomed = StartClient(*daemon, ask, kNobody);
  ASSERT_EQ(doomed->ReadLine(), "waiting");
  ASSERT_TRUE(WaitForSession(**c, doomed->pid()));
  const pid_t doomed_pid = doomed->pid();
  doomed->Kill(SIGKILL);
  doomed->Wait();
  ASSERT_TRUE(PollUntil([&] { return Waiting(**c) == 0; })) << "the dead waiter stays queued";
  // Low arrives first, high second; both wait.
  auto low = StartClient(*daemon, ask, kNobody);
  ASSERT_EQ(low->ReadLine(), "waiting");
  ASSERT_TRUE(WaitForSession(**c, low->pid()));
  auto high = StartClient(*daemon, ask, kOther);
  ASSERT_EQ(high->ReadLine(), "waiting");
  ASSERT_TRUE(WaitForSession(**c, high->pid()));
  ASSERT_TRUE(PollUntil([&] { return Waiting(**c) == 2; })) << "low and high are not both queued";

  ASSERT_TRUE((*c)->Free(held->allocations(0).id()).ok());
  EXPECT_EQ(high->ReadLine().rfind("alloc ", 0), 0u);
  EXPECT_EQ(Waiting(**c), 1u);  // low still waits: 24 MiB is left
  const pid_t high_pid = high->pid();
  high->Kill(SIGKILL);
  high->Wait();
  EXPECT_EQ(low->ReadLine().rfind("alloc ", 0), 0u);
  auto stats = (*c)->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->devices(0).used_bytes(), 40 * kMiB);
  uint64_t low_holds = 0;
  for (const auto& s : stats->sessions()) {
    if (s.pid() == low->pid()) low_holds = s.used_bytes();
  }
  EXPECT_EQ(low_holds, 40 * kMiB) << "the 40 MiB in use are not low's";
  // Who was granted, in order (the daemon's ledger): the holder, then high,
  // then low; never the dead waiter.
  v1::GetLedgerRequest req;
  req.set_limit(1000);
  auto events = (*c)->GetLedger(req);
  ASSERT_TRUE(events.ok()) << events.status();
  std::vector<pid_t> granted;
  for (const v1::LedgerEvent& e : events->events()) {
    if (e.kind() == "ALLOCATE") granted.push_back(e.pid());
  }
  EXPECT_EQ(granted, (std::vector<pid_t>{getpid(), high_pid, low->pid()}))
      << "dead waiter: " << doomed_pid;
  low.reset();
  c->reset();
  EXPECT_EQ(daemon->Stop(), 0);
}

TEST_F(LedgerIntegrationTest, TimeoutGivesTheUsualRefusalWithReasons) {
  auto daemon = StartDaemon({"--sim_devices=2x64MiB", "--slab_size=64MiB",
                             "--config=" + WriteConfig(R"(
      tenant { name: "q" uids: 0 quota { device { device: "1" bytes: "8MiB" } } })")});
  auto c = Client::Connect(daemon->socket());
  ASSERT_TRUE(c.ok());
  v1::AllocateRequest big;
  big.set_size_bytes(48 * kMiB);
  big.mutable_placement()->add_devices("0");
  ASSERT_TRUE((*c)->AllocateRaw(big).ok());
  v1::AllocateRequest req;
  req.set_size_bytes(40 * kMiB);
  req.set_wait_ms(300);
  const Clock::time_point t0 = Clock::now();
  auto r = (*c)->AllocateRaw(req);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  std::optional<v1::PlacementRefusal> refusal = PlacementRefusalOf(r.status());
  ASSERT_TRUE(refusal.has_value());
  ASSERT_EQ(refusal->devices_size(), 2);
  EXPECT_EQ(refusal->devices(0).reason(), v1::DeviceRefusal::REASON_CAPACITY);
  EXPECT_EQ(refusal->devices(1).reason(), v1::DeviceRefusal::REASON_QUOTA);
  EXPECT_NE(refusal->devices(1).detail().find("tenant \"q\" quota on device 1 8.00 MiB"),
            std::string::npos) << refusal->devices(1).detail();
  c->reset();
  EXPECT_EQ(daemon->Stop(), 0);
}

TEST_F(LedgerIntegrationTest, TenantRulesAndSetQuota) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  auto daemon = StartDaemon({"--sim_devices=1x64MiB", "--slab_size=64MiB",
                             "--config=" + WriteConfig(R"(tenant { name: "ops" uids: 0 })")});
  // An unlisted uid and no default_tenant: refused, naming the uid.
  auto stranger = StartClient(*daemon, {"--size=4096"}, kNobody);
  ASSERT_EQ(stranger->ReadLine(), "waiting");
  std::string line = stranger->ReadLine();
  EXPECT_EQ(line.rfind("error 7 ", 0), 0u) << line;
  EXPECT_NE(line.find("uid 65534"), std::string::npos) << line;
  // SetQuota: root only.
  auto setter = StartClient(*daemon, {"--set_quota=ops", "--total=1048576"}, kNobody);
  EXPECT_EQ(setter->ReadLine(), "status 7");
  auto c = Client::Connect(daemon->socket());
  ASSERT_TRUE(c.ok());
  v1::SetQuotaRequest set;
  set.set_tenant("ops");
  set.mutable_quota()->set_total_bytes(kMiB);
  ASSERT_TRUE((*c)->SetQuota(set).ok());
  v1::AllocateRequest req;
  req.set_size_bytes(2 * kMiB);
  EXPECT_EQ((*c)->AllocateRaw(req).status().code(), absl::StatusCode::kResourceExhausted);
  set.set_tenant("nobody-here");
  EXPECT_EQ((*c)->SetQuota(set).status().code(), absl::StatusCode::kNotFound);
  v1::GetLedgerRequest lq;
  lq.set_newest(true);
  lq.set_limit(1);
  auto events = (*c)->GetLedger(lq);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->events_size(), 1);
  EXPECT_EQ(events->events(0).kind(), "QUOTA_SET");
  EXPECT_EQ(events->events(0).detail(), "total_bytes 1.00 MiB");
  c->reset();
  EXPECT_EQ(daemon->Stop(), 0);
}

}  // namespace
}  // namespace gpumem
