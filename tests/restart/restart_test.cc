// A restart loses nothing: 8 client processes keep writing and checking
// their blocks while gpumemd is killed (kill -9 at random instants) and
// started again by a stand-in for systemd (fake_systemd.h), 20 times; the
// same without the fd store (the clients give slab handles back), and a
// planned stop (SIGUSR2) followed by a start with the store emptied, as a
// `systemctl stop` then `start` leaves it.
//
// After every restart each client has checked every byte of every block it
// holds and carries on allocating and freeing; none may see a lost block or
// a failed free; a tenant at its quota stays exactly at it. At the end the
// blocks all clients hold are disjoint and add up to the daemon's used
// bytes, every free succeeds, the ledger closed nothing (no DAEMON_RESTART)
// and recorded each restart (DAEMON_RESUMED), and the daemon's fds and RSS
// are back to a fresh daemon's.
//
// Clients run as other uids (a tenant of their own with a quota), so this
// test needs root; it is skipped otherwise.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/common/poll_until.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/restart/fake_systemd.h"

namespace gpumem {
namespace {

using client::Client;
using testing::ChildProcess;
using testing::FakeSystemd;
using testing::FdCount;
using testing::RssKiB;

constexpr uid_t kCapped = 65531;  // tenant "capped": a 24 MiB quota
constexpr int kWorkers = 7;       // and one "fill" client of kCapped: 8
constexpr int kGraceSeconds = 5;  // --restore_grace_seconds

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
    dir_ = testing::MakeTempDir();
    socket_ = dir_ + "/gpumemd.sock";
    stop_file_ = dir_ + "/stop";
    const std::string config = dir_ + "/gpumemd.textproto";
    std::ofstream(config) << absl::StrCat(R"(
      tenant { name: "work" uids: 0 }
      tenant { name: "capped" uids: )", kCapped, R"( quota { total_bytes: "24MiB" } }
    )");
    daemon_args_ = {testing::RunfilePath("server/gpumemd"),
                    "--socket=" + socket_,
                    "--config=" + config,
                    "--ledger=" + dir_ + "/ledger.db",
                    "--state=" + dir_ + "/state",
                    "--sim_devices=2x1GiB",
                    // Whole 64 MiB slabs from the first block: FakeSystemd
                    // reads its notify socket only between steps, and a
                    // datagram socket queues ~10 unread FDSTOREs before the
                    // daemon's next slab waits on it (small, growing slabs
                    // make more of them while the clients start).
                    "--slab_size=64MiB", "--min_slab_size=64MiB",
                    "--empty_slab_release_seconds=0",
                    absl::StrCat("--restore_grace_seconds=", kGraceSeconds)};
    // Runfiles live under root's home, which other uids cannot enter.
    client_binary_ = dir_ + "/restart_client";
    std::filesystem::copy_file(testing::RunfilePath("tests/restart/restart_client"),
                               client_binary_);
    chmod(client_binary_.c_str(), 0755);
    chmod(dir_.c_str(), 0755);
  }
  void TearDown() override {
    clients_.clear();
    systemd_.reset();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  void StartSystemd(bool fd_store) {
    systemd_ = std::make_unique<FakeSystemd>(dir_, fd_store);
    ASSERT_TRUE(systemd_->Start(daemon_args_, socket_)) << systemd_->Log();
  }

  void StartClients() {
    for (int i = 0; i < kWorkers; ++i) {
      clients_.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
          client_binary_, "--socket=" + socket_, "--mode=work", "--stop_file=" + stop_file_,
          absl::StrCat("--seed=", i + 1)}));
    }
    clients_.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{client_binary_, "--socket=" + socket_, "--mode=fill",
                                 "--stop_file=" + stop_file_, "--seed=99"},
        kCapped));
    // Every client connected before the first kill: the test is about
    // sessions that live through restarts, not connects that race one.
    for (size_t i = 0; i < clients_.size(); ++i) {
      ASSERT_EQ(clients_[i]->ReadLine(20000), "CONNECTED") << "client " << i << "\n"
                                                           << systemd_->Log();
    }
    const std::string full = clients_.back()->ReadLine(20000);
    ASSERT_EQ(full, "FULL 24 25165824") << systemd_->Log();
  }

  // Waits for every client's RESUMED line for restart `n`; collects pauses.
  void ExpectAllResumed(int n) {
    for (size_t i = 0; i < clients_.size(); ++i) {
      const std::string line = clients_[i]->ReadLine(30000);
      ASSERT_TRUE(absl::StartsWith(line, absl::StrCat("RESUMED ", n, " ")))
          << "client " << i << " after restart " << n << ": \"" << line << "\"\n"
          << systemd_->Log();
      EXPECT_TRUE(absl::StrContains(line, " lost=0 ")) << line;
      const size_t at = line.find("pause_ms=");
      double ms = 0;
      ASSERT_TRUE(absl::SimpleAtod(line.substr(at + 9), &ms)) << line;
      pauses_ms_.push_back(ms);
    }
  }

  // Stops the clients: their blocks are disjoint and are what the daemon
  // counts as used; then every one is freed.
  void FinishClients() {
    std::ofstream(stop_file_) << "stop";
    std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> by_slab;
    uint64_t held = 0;
    for (size_t i = 0; i < clients_.size(); ++i) {
      std::string line = clients_[i]->ReadLine(30000);
      while (absl::StartsWith(line, "RESUMED")) line = clients_[i]->ReadLine(30000);
      ASSERT_TRUE(absl::StartsWith(line, "RANGES")) << "client " << i << ": " << line;
      for (absl::string_view r : absl::StrSplit(line.substr(7), ',', absl::SkipEmpty())) {
        std::vector<std::string> f = absl::StrSplit(r, ':');
        ASSERT_EQ(f.size(), 3u) << r;
        uint64_t slab, offset, size;
        ASSERT_TRUE(absl::SimpleAtoi(f[0], &slab) && absl::SimpleAtoi(f[1], &offset) &&
                    absl::SimpleAtoi(f[2], &size));
        by_slab[slab].emplace_back(offset, size);
        held += size;
      }
    }
    for (auto& [slab, ranges] : by_slab) {
      std::sort(ranges.begin(), ranges.end());
      for (size_t i = 1; i < ranges.size(); ++i) {
        EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first)
            << "slab " << slab << ": two live blocks overlap";
      }
    }
    // GetStats is exact: used bytes are what the clients hold, once the
    // last restart's grace time has freed the blocks whose Allocate was
    // never answered (the daemon was killed mid-answer).
    {
      auto c = Client::Connect(socket_);
      ASSERT_TRUE(c.ok()) << c.status();
      const absl::Time deadline = absl::Now() + absl::Seconds(kGraceSeconds + 20);
      uint64_t used = 0;
      while (true) {
        auto stats = (*c)->GetStats();
        ASSERT_TRUE(stats.ok()) << stats.status();
        used = 0;
        for (const auto& d : stats->devices()) used += d.used_bytes();
        if (used == held || absl::Now() > deadline) break;
        absl::SleepFor(absl::Milliseconds(100));
      }
      EXPECT_EQ(used, held) << "the daemon's used bytes against what the clients hold";
    }
    std::ofstream(stop_file_ + ".free") << "free";
    for (size_t i = 0; i < clients_.size(); ++i) {
      const std::string done = clients_[i]->ReadLine(30000);
      EXPECT_TRUE(absl::StartsWith(done, "DONE")) << "client " << i << ": " << done;
      EXPECT_EQ(clients_[i]->Wait(), 0) << "client " << i;
    }
    held_at_end_ = held;
  }

  // What a fresh daemon is, fds and RSS, once its slabs are gone.
  void ExpectBackToBaseline(int fds, int64_t rss_kib) {
    // Releasing the slabs tells the fd store of each (FDSTOREREMOVE); a
    // datagram socket queues ~10 unread ones before the daemon's next waits
    // (under the pool's lock), so the fake systemd reads meanwhile, as
    // systemd does.
    std::atomic<bool> pumping{true};
    std::thread pump([&] {
      while (pumping.load()) {
        systemd_->Pump();
        absl::SleepFor(absl::Milliseconds(2));
      }
    });
    struct Join {
      std::atomic<bool>* pumping;
      std::thread* pump;
      ~Join() {
        pumping->store(false);
        pump->join();
      }
    } join{&pumping, &pump};
    auto c = Client::Connect(socket_);
    ASSERT_TRUE(c.ok()) << c.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    uint64_t used = 1, pooled = 1;
    while (absl::Now() < deadline) {
      auto stats = (*c)->GetStats();
      ASSERT_TRUE(stats.ok()) << stats.status();
      used = pooled = 0;
      for (const auto& d : stats->devices()) {
        used += d.used_bytes();
        pooled += d.pooled_bytes();
      }
      if (used == 0 && pooled == 0) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(used, 0u);
    EXPECT_EQ(pooled, 0u) << "every slab goes back once empty (--empty_slab_release_seconds=0)";
    c->reset();
    // Our own connection closed: the daemon drops its fds as it sees that.
    EXPECT_TRUE(testing::PollUntil([&] { return FdCount(systemd_->pid()) <= fds + 2; }))
        << "fds: " << FdCount(systemd_->pid()) << ", a fresh daemon had " << fds;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    // Under a sanitizer the RSS is mostly the sanitizer's (ASan's quarantine
    // keeps up to 256 MiB of freed memory; it grew 33 MiB over 20 restarts
    // here): the plain build judges it.
    (void)rss_kib;
#else
    EXPECT_LE(RssKiB(systemd_->pid()), rss_kib + 32 * 1024)
        << "RSS: a fresh daemon had " << rss_kib << " KiB";
#endif
  }

  // The ledger: nothing closed by a restart, each restart recorded.
  void ExpectLedger(int restarts) {
    auto c = Client::Connect(socket_);
    ASSERT_TRUE(c.ok()) << c.status();
    int resumed = 0, closed = 0;
    std::string token;
    do {
      v1::GetLedgerRequest req;
      req.set_limit(10000);
      req.set_page_token(token);
      auto page = (*c)->GetLedger(req);
      ASSERT_TRUE(page.ok()) << page.status();
      for (const auto& e : page->events()) {
        resumed += e.kind() == "DAEMON_RESUMED";
        if (e.kind() == "DAEMON_RESTART") {
          ++closed;
          ADD_FAILURE() << "closed by a restart: allocation " << e.allocation_id() << ": "
                        << e.detail();
        }
      }
      token = page->next_page_token();
    } while (!token.empty());
    EXPECT_EQ(resumed, restarts);
    EXPECT_EQ(closed, 0);
  }

  void ReportPauses(const char* what) {
    std::cerr << what << ": " << pauses_ms_.size() << " client pauses: p50 "
              << Quantile(pauses_ms_, 0.5) << " ms, p99 " << Quantile(pauses_ms_, 0.99)
              << " ms, max " << Quantile(pauses_ms_, 1.0) << " ms\n";
    EXPECT_LE(Quantile(pauses_ms_, 0.99), 2000.0);
  }

  std::string dir_, socket_, stop_file_, client_binary_;
  std::vector<std::string> daemon_args_;
  std::unique_ptr<FakeSystemd> systemd_;
  std::vector<std::unique_ptr<ChildProcess>> clients_;
  std::vector<double> pauses_ms_;
  uint64_t held_at_end_ = 0;
};

// The test's main case: kill -9 at random instants, 20 times, with the fd
// store keeping slab handles and the listening socket.
TEST_F(RestartTest, KillNineTwentyTimesUnderLoadLosesNothing) {
  StartSystemd(/*fd_store=*/true);
  const int fds = FdCount(systemd_->pid());
  const int64_t rss = RssKiB(systemd_->pid());
  StartClients();
  std::mt19937 rng(static_cast<unsigned>(absl::ToUnixNanos(absl::Now())));
  for (int n = 1; n <= 20; ++n) {
    absl::SleepFor(absl::Milliseconds(20 + rng() % 400));
    systemd_->Kill(SIGKILL);
    ASSERT_EQ(systemd_->Wait(), -SIGKILL);
    EXPECT_GT(systemd_->stored_count(), 1u) << "the listening socket and slab handles";
    ASSERT_TRUE(systemd_->Start(daemon_args_, socket_)) << systemd_->Log();
    ASSERT_NO_FATAL_FAILURE(ExpectAllResumed(n));
  }
  ASSERT_NO_FATAL_FAILURE(FinishClients());
  ReportPauses("kill -9 with the fd store");
  ExpectLedger(20);
  ExpectBackToBaseline(fds, rss);
  // A slab's FDSTOREREMOVE is sent once it has left the pool, so it may
  // still be on its way when GetStats shows the pool empty.
  std::vector<std::string> kept;
  EXPECT_TRUE(testing::PollUntil([&] {
    kept = systemd_->StoredNames();
    return kept == std::vector<std::string>{"gpumemd-listen"};
  })) << "a released slab's handle leaves the store; still stored: "
      << absl::StrJoin(kept, ", ");
}

// Outside systemd (a DaemonSet, a shell): no fd store; the clients give the
// slab handles back.
TEST_F(RestartTest, WithoutTheFdStoreClientsGiveHandlesBack) {
  StartSystemd(/*fd_store=*/false);
  const int fds = FdCount(systemd_->pid());
  const int64_t rss = RssKiB(systemd_->pid());
  StartClients();
  std::mt19937 rng(7);
  for (int n = 1; n <= 5; ++n) {
    absl::SleepFor(absl::Milliseconds(50 + rng() % 300));
    systemd_->Kill(SIGKILL);
    ASSERT_EQ(systemd_->Wait(), -SIGKILL);
    ASSERT_TRUE(systemd_->Start(daemon_args_, socket_)) << systemd_->Log();
    ASSERT_NO_FATAL_FAILURE(ExpectAllResumed(n));
  }
  EXPECT_TRUE(absl::StrContains(systemd_->Log(), "wait for a client to give their handle back"))
      << systemd_->Log();
  ASSERT_NO_FATAL_FAILURE(FinishClients());
  ReportPauses("kill -9 without the fd store");
  ExpectLedger(5);
  ExpectBackToBaseline(fds, rss);
}

// A planned stop (SIGUSR2: what the unit sends for stop and restart) keeps
// everything; a restart keeps the store, a stop then start empties it.
TEST_F(RestartTest, PlannedStopThenStartKeepsEverything) {
  StartSystemd(/*fd_store=*/true);
  StartClients();
  absl::SleepFor(absl::Milliseconds(200));
  systemd_->Kill(SIGUSR2);  // systemctl restart
  ASSERT_EQ(systemd_->Wait(), 75) << systemd_->Log();
  EXPECT_TRUE(absl::StrContains(systemd_->Log(), "stopped for a restart"));
  ASSERT_TRUE(systemd_->Start(daemon_args_, socket_)) << systemd_->Log();
  ASSERT_NO_FATAL_FAILURE(ExpectAllResumed(1));
  absl::SleepFor(absl::Milliseconds(200));
  systemd_->Kill(SIGUSR2);  // systemctl stop ...
  ASSERT_EQ(systemd_->Wait(), 75);
  systemd_->DropStore();    // ... systemd 252 keeps no store over a stop
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(systemd_->Start(daemon_args_, socket_)) << systemd_->Log();  // ... start
  ASSERT_NO_FATAL_FAILURE(ExpectAllResumed(2));
  ASSERT_NO_FATAL_FAILURE(FinishClients());
  ExpectLedger(2);
  EXPECT_TRUE(absl::StrContains(systemd_->Log(), "socket kept over the restart"));
}

}  // namespace
}  // namespace gpumem
