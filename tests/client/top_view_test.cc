// TopView (client/ctl/top_view.h) and the plain refresh loop of gpumemctl top
// (client/ctl/gpumemctl_top.h) on made-up GetStats answers: sizes are kept,
// rates come from counter differences over the daemon's uptime, a restart,
// an unreachable daemon and a failing ledger are said, not shown as figures,
// sections are cut with a count, and each refresh costs exactly one GetStats.
#include "client/ctl/top_view.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/ctl/gpumemctl_top.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kGiB = uint64_t{1} << 30;

v1::GetStatsResponse Answer(int devices, double uptime, uint64_t allocations,
                            uint64_t refused_quota = 0) {
  v1::GetStatsResponse s;
  s.set_backend("sim");
  for (int i = 0; i < devices; ++i) {
    v1::DeviceStats* d = s.add_devices();
    d->set_index(i);
    d->set_total_bytes(16 * kGiB);
    d->set_pooled_bytes(4 * kGiB);
    d->set_used_bytes(kGiB * (i % 4));
    d->set_retained_bytes(i == 1 ? kGiB : 0);
    d->set_free_bytes(16 * kGiB - d->used_bytes() - d->retained_bytes());
    d->set_largest_free_block_bytes(8 * kGiB);
    d->set_allocation_count(10 * i);
  }
  v1::TenantStats* t = s.add_tenants();
  t->set_tenant(1);
  t->set_name("ml");
  t->set_used_bytes(3 * kGiB);
  t->set_peak_bytes(5 * kGiB);
  t->set_waiting_requests(2);
  t->set_allocation_count(7);
  t->mutable_quota()->set_total_bytes(6 * kGiB);
  for (int i = 0; i < 3; ++i) {
    v1::SessionStats* ss = s.add_sessions();
    ss->set_session_id(100 + i);
    ss->set_pid(4000 + i);
    ss->set_used_bytes(kGiB * (i + 1));  // the last one holds the most
  }
  v1::DaemonCounters* c = s.mutable_counters();
  c->set_uptime_seconds(uptime);
  c->set_allocations(allocations);
  c->set_frees(allocations / 2);
  c->set_refused_quota(refused_quota);
  c->set_waiting_requests(2);
  return s;
}

std::string Screen(const std::vector<std::string>& lines) { return absl::StrJoin(lines, "\n"); }

void ExpectFits(const std::vector<std::string>& lines, int w, int h) {
  EXPECT_LE(static_cast<int>(lines.size()), h);
  for (const std::string& l : lines) EXPECT_LE(static_cast<int>(l.size()), w) << l;
}

TEST(TopView, ShowsDevicesTenantsAndTheBiggestSessionFirst) {
  TopView v("/run/x.sock", absl::Seconds(1));
  v.Update(Answer(4, 10, 100), absl::Now());
  const std::vector<std::string> lines = v.Render(100, 40);
  ExpectFits(lines, 100, 40);
  const std::string s = Screen(lines);
  EXPECT_THAT(s, HasSubstr("sim daemon at /run/x.sock"));
  EXPECT_THAT(s, HasSubstr("rates from the next refresh"));
  // Device 1: 1 GiB used, 3 GiB pooled idle, 1 GiB retained of 16 GiB.
  std::string dev1;
  for (const std::string& l : lines) {
    if (absl::StartsWith(l, "  1 [")) dev1 = l;
  }
  ASSERT_FALSE(dev1.empty()) << s;
  const std::string bar = dev1.substr(5, dev1.find(']') - 5);
  EXPECT_EQ(std::count(bar.begin(), bar.end(), '#'), (bar.size() + 15) / 16) << bar;
  EXPECT_GT(std::count(bar.begin(), bar.end(), '+'), 0) << bar;
  EXPECT_GT(std::count(bar.begin(), bar.end(), 'r'), 0) << bar;
  EXPECT_THAT(dev1, HasSubstr("1.0G"));
  // The tenant against its quota, its peak and waiting requests.
  EXPECT_THAT(s, testing::ContainsRegex("ml +3.0G +0 +6.0G +50% +5.0G +2 +7"));
  // Sessions, most memory first.
  std::vector<std::string> order;
  for (const std::string& l : lines) {
    if (absl::StartsWith(l, "10") && l.size() > 3 && l[3] == ' ') order.push_back(l.substr(0, 3));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"102", "101", "100"})) << s;
}

TEST(TopView, RatesAreCounterDifferencesOverTheDaemonsUptime) {
  TopView v("s", absl::Seconds(1));
  v.Update(Answer(2, 10, 100, 1), absl::Now());
  EXPECT_FALSE(v.rates().has_value());
  v.Update(Answer(2, 12, 300, 5), absl::Now());
  ASSERT_TRUE(v.rates().has_value());
  EXPECT_DOUBLE_EQ(v.rates()->allocations, 100);
  EXPECT_DOUBLE_EQ(v.rates()->frees, 50);
  EXPECT_DOUBLE_EQ(v.rates()->quota, 2);
  EXPECT_DOUBLE_EQ(v.rates()->capacity, 0);
  const std::string s = Screen(v.Render(90, 30));
  EXPECT_THAT(s, HasSubstr("allocations/s 100   frees/s 50.0   waiting 2"));
  EXPECT_THAT(s, HasSubstr("quota 2.0"));
}

TEST(TopView, ARestartShowsNoRatesButSaysSo) {
  TopView v("s", absl::Seconds(1));
  v.Update(Answer(2, 100, 5000), absl::Now());
  v.Update(Answer(2, 1, 3), absl::Now());  // uptime and counters went back
  EXPECT_FALSE(v.rates().has_value());
  const std::string s = Screen(v.Render(90, 30));
  EXPECT_THAT(s, HasSubstr("daemon restarted"));
  EXPECT_THAT(s, Not(HasSubstr("-4")));
  v.Update(Answer(2, 2, 13), absl::Now());
  ASSERT_TRUE(v.rates().has_value());
  EXPECT_DOUBLE_EQ(v.rates()->allocations, 10);
}

TEST(TopView, UnreachableKeepsTheLastFiguresMarkedStale) {
  TopView v("s", absl::Seconds(1));
  const absl::Time t0 = absl::Now();
  v.Unreachable(absl::UnavailableError("no socket at s (is gpumemd running?)"), t0);
  std::string s = Screen(v.Render(120, 20));
  EXPECT_THAT(s, HasSubstr("DAEMON UNREACHABLE"));
  EXPECT_THAT(s, HasSubstr("is gpumemd running?"));
  v.Update(Answer(2, 10, 100), t0 + absl::Seconds(1));
  v.Unreachable(absl::UnavailableError("connection refused"), t0 + absl::Seconds(2));
  v.Unreachable(absl::UnavailableError("connection refused"), t0 + absl::Seconds(5));
  s = Screen(v.Render(160, 30));
  EXPECT_THAT(s, HasSubstr("DAEMON UNREACHABLE for 3s (figures below are from "));
  EXPECT_THAT(s, HasSubstr("retrying every 1s: UNAVAILABLE: connection refused"));
  EXPECT_THAT(s, HasSubstr("  1 ["));  // the last answer is still shown
  EXPECT_FALSE(v.rates().has_value());
}

TEST(TopView, AFailingLedgerIsSaidOnTheNoticeLineUntilItWritesAgain) {
  TopView v("s", absl::Seconds(1));
  v1::GetStatsResponse a = Answer(2, 10, 100);
  a.mutable_ledger()->set_enabled(true);
  a.mutable_ledger()->set_path("/var/lib/gpumemd/ledger.db");
  a.mutable_ledger()->set_committed_events(100);
  v.Update(a, absl::Now());
  EXPECT_THAT(Screen(v.Render(120, 30)), Not(HasSubstr("LEDGER")));
  a.mutable_counters()->set_uptime_seconds(11);
  v1::LedgerStatus* l = a.mutable_ledger();
  l->set_failing(true);
  l->set_held_events(523);
  l->set_dropped_events(7);
  l->set_last_error("ledger /var/lib/gpumemd/ledger.db: writing events: database or disk is full");
  v.Update(a, absl::Now());
  std::vector<std::string> lines = v.Render(200, 30);
  ExpectFits(lines, 200, 30);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[3],
            "LEDGER FAILING: 523 events held in memory, 7 dropped; allocations are served: "
            "ledger /var/lib/gpumemd/ledger.db: writing events: database or disk is full");
  // A narrow screen cuts the error, not the counts; the sections stay.
  lines = v.Render(76, 12);
  ExpectFits(lines, 76, 12);
  EXPECT_THAT(lines[3], HasSubstr("523 events held in memory, 7 dropped"));
  EXPECT_THAT(Screen(lines), HasSubstr("SESSION"));
  // Unreachable wins: the ledger's state is not known then.
  v.Unreachable(absl::UnavailableError("connection refused"), absl::Now());
  EXPECT_THAT(Screen(v.Render(200, 30)), Not(HasSubstr("LEDGER FAILING")));
  l->set_failing(false);
  l->set_held_events(0);
  l->clear_last_error();
  a.mutable_counters()->set_uptime_seconds(12);
  v.Update(a, absl::Now());
  EXPECT_THAT(Screen(v.Render(200, 30)), Not(HasSubstr("LEDGER")));
}

TEST(TopView, ATooSmallTerminalGetsAMessageThatFits) {
  TopView v("s", absl::Seconds(1));
  v.Update(Answer(4, 10, 100), absl::Now());
  for (auto [w, h] : std::vector<std::pair<int, int>>{{40, 8}, {75, 30}, {100, 11}, {10, 2},
                                                      {0, 0}, {3, 1}}) {
    const std::vector<std::string> lines = v.Render(w, h);
    ExpectFits(lines, std::max(w, 0), std::max(h, 0));
    if (w >= 40 && h >= 3) {
      EXPECT_THAT(Screen(lines), HasSubstr(absl::StrCat("this terminal is ", w, "x", h)));
      EXPECT_THAT(Screen(lines), HasSubstr("at least 76x12"));
    }
  }
  // At the minimum size it is the real view.
  const std::vector<std::string> lines = v.Render(TopView::kMinWidth, TopView::kMinHeight);
  ExpectFits(lines, TopView::kMinWidth, TopView::kMinHeight);
  EXPECT_THAT(Screen(lines), HasSubstr("DEV ["));
}

TEST(TopView, SixtyFourDevicesAreCutToTheScreenWithACount) {
  TopView v("s", absl::Seconds(1));
  v.Update(Answer(64, 10, 100), absl::Now());
  const std::vector<std::string> lines = v.Render(120, 40);
  ExpectFits(lines, 120, 40);
  const std::string s = Screen(lines);
  EXPECT_THAT(s, testing::ContainsRegex("\\.\\.\\. [0-9]+ more devices"));
  // Tenants and sessions keep their rows.
  EXPECT_THAT(s, HasSubstr("ml "));
  EXPECT_THAT(s, HasSubstr("102 "));
  // Without a height limit (the plain mode) every device is listed.
  const std::vector<std::string> every = v.RenderAll(120);
  for (const std::string& l : every) EXPECT_LE(l.size(), 120u);
  const std::string all = Screen(every);
  EXPECT_THAT(all, HasSubstr(" 63 ["));
  EXPECT_THAT(all, Not(HasSubstr("more devices")));
}

TEST(PlainTop, EachRefreshIsOneGetStatsAndFailuresAreShown) {
  int calls = 0;
  StatsSource source = [&calls]() -> absl::StatusOr<v1::GetStatsResponse> {
    ++calls;
    if (calls == 2) return absl::UnavailableError("daemon went away");
    return Answer(2, calls, 10 * calls);
  };
  TopOptions o;
  o.socket_path = "s";
  o.interval = absl::Milliseconds(100);
  o.iterations = 4;
  std::ostringstream out;
  EXPECT_EQ(RunPlainTop(o, source, out, [] { return false; }), 0);
  EXPECT_EQ(calls, 4);
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("DAEMON UNREACHABLE"));
  EXPECT_THAT(text, HasSubstr("daemon went away"));
  // Back: two answers after the failure give rates again (10/s).
  EXPECT_THAT(text, HasSubstr("allocations/s 10.0"));
  EXPECT_THAT(text, Not(HasSubstr("q quits")));
  // A stop request ends the loop before the next call.
  calls = 0;
  o.iterations = 0;
  EXPECT_EQ(RunPlainTop(o, source, out, [&calls] { return calls >= 1; }), 0);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace client
}  // namespace gpumem
