// See top_view.h. The screen is four header lines (title, rates, refusals,
// a notice line: unreachable, else a failing ledger, else a restart) and
// three sections (devices, tenants, sessions), each a title row and at
// least one row; rows beyond the screen are cut per section, devices first
// to give way after each other section kept a few.
#include "client/ctl/top_view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace gpumem {
namespace client {
namespace {

constexpr absl::Duration kRestartNoticeFor = absl::Seconds(10);
constexpr int kHeaderLines = 4;

// "0", "512B", "64K", "1.5G", "141G": at most 5 characters below 1000 PiB.
std::string ShortBytes(uint64_t b) {
  if (b < 1024) return absl::StrCat(b, b == 0 ? "" : "B");
  static const char kUnits[] = "KMGTPE";
  double v = static_cast<double>(b) / 1024;
  int u = 0;
  while (v >= 1023.95 && u < 5) v /= 1024, ++u;
  if (v < 9.95) return absl::StrFormat("%.1f%c", v, kUnits[u]);
  return absl::StrFormat("%.0f%c", v, kUnits[u]);
}

std::string Uptime(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  if (s >= 86400) return absl::StrFormat("%dd%02dh%02dm", s / 86400, s / 3600 % 24, s / 60 % 60);
  if (s >= 3600) return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string Rate(double r) {
  if (r >= 99999.5) return absl::StrFormat("%.0fk", r / 1000);
  if (r >= 100) return absl::StrFormat("%.0f", r);
  return absl::StrFormat("%.1f", r);
}

std::string Clip(std::string s, int width) {
  if (width >= 0 && static_cast<int>(s.size()) > width) s.resize(width);
  return s;
}

// Cells of `width` for segments summing to at most `total`: each segment
// that is not empty gets at least one cell while cells are left.
std::string Bar(const std::vector<std::pair<uint64_t, char>>& segments, uint64_t total,
                int width) {
  std::string bar(width, '.');
  if (total == 0 || width <= 0) return bar;
  uint64_t cum = 0;
  int at = 0;
  for (const auto& [bytes, c] : segments) {
    if (bytes == 0) continue;
    cum += bytes;
    int end = static_cast<int>(std::ceil(static_cast<double>(std::min(cum, total)) /
                                         static_cast<double>(total) * width - 1e-9));
    end = std::clamp(std::max(end, at + 1), 0, width);
    for (; at < end; ++at) bar[at] = c;
  }
  return bar;
}

struct Section {
  std::string title;
  std::vector<std::string> rows;  // empty: `empty` is shown
  std::string empty;
  std::string noun;  // "devices", for "+N more devices"
};

}  // namespace

void TopView::Update(v1::GetStatsResponse stats, absl::Time now) {
  now_ = now;
  rates_.reset();
  if (last_.has_value()) {
    const v1::DaemonCounters& a = last_->counters();
    const v1::DaemonCounters& b = stats.counters();
    const double dt = b.uptime_seconds() - a.uptime_seconds();
    const bool went_back =
        b.uptime_seconds() < a.uptime_seconds() || b.allocations() < a.allocations() ||
        b.frees() < a.frees() || b.refused_capacity() < a.refused_capacity() ||
        b.refused_fragmentation() < a.refused_fragmentation() ||
        b.refused_quota() < a.refused_quota() || b.refused_other() < a.refused_other();
    if (went_back) {
      restarted_at_ = now;
    } else if (dt > 0) {
      Rates r;
      r.allocations = (b.allocations() - a.allocations()) / dt;
      r.frees = (b.frees() - a.frees()) / dt;
      r.capacity = (b.refused_capacity() - a.refused_capacity()) / dt;
      r.fragmentation = (b.refused_fragmentation() - a.refused_fragmentation()) / dt;
      r.quota = (b.refused_quota() - a.refused_quota()) / dt;
      r.other = (b.refused_other() - a.refused_other()) / dt;
      rates_ = r;
    }
  }
  last_ = std::move(stats);
  last_at_ = now;
  unreachable_.reset();
}

void TopView::Unreachable(const absl::Status& why, absl::Time now) {
  now_ = now;
  if (!unreachable_.has_value()) unreachable_since_ = now;
  unreachable_ = why;
  rates_.reset();
}

std::vector<std::string> TopView::TooSmall(int width, int height) const {
  std::vector<std::string> lines = {
      absl::StrFormat("gpumemctl top: this terminal is %dx%d,", width, height),
      absl::StrFormat("too small: it needs at least %dx%d.", kMinWidth, kMinHeight),
      "Enlarge it, or press q to quit.",
  };
  if (height < static_cast<int>(lines.size())) lines.resize(std::max(height, 0));
  for (std::string& l : lines) l = Clip(l, width);
  return lines;
}

std::vector<std::string> TopView::Render(int width, int height) const {
  if (width < kMinWidth || height < kMinHeight) return TooSmall(width, height);
  return Lay(width, height, false);
}

std::vector<std::string> TopView::RenderAll(int width) const {
  return Lay(std::max(width, kMinWidth), 0, true);
}

std::vector<std::string> TopView::Lay(int width, int height, bool plain) const {
  std::vector<std::string> out;
  const v1::GetStatsResponse* s = last_.has_value() ? &*last_ : nullptr;
  const double every = absl::ToDoubleSeconds(interval_);

  // Header.
  std::string title = absl::StrCat("gpumemctl top - ", s != nullptr ? s->backend() : "?",
                                   " daemon at ", source_);
  if (s != nullptr) absl::StrAppend(&title, " - up ", Uptime(s->counters().uptime_seconds()));
  absl::StrAppend(&title, absl::StrFormat(" - every %gs", every), plain ? "" : " - q quits");
  out.push_back(title);
  if (s != nullptr) {
    const v1::DaemonCounters& c = s->counters();
    const uint64_t refused = c.refused_capacity() + c.refused_fragmentation() +
                             c.refused_quota() + c.refused_other();
    if (rates_.has_value()) {
      out.push_back(absl::StrFormat(
          "allocations/s %s   frees/s %s   waiting %d   (since start: %d allocs, %d frees, "
          "%d refused)",
          Rate(rates_->allocations), Rate(rates_->frees), c.waiting_requests(),
          c.allocations(), c.frees(), refused));
      out.push_back(absl::StrFormat(
          "refused/s   capacity %s   fragmentation %s   quota %s   other %s",
          Rate(rates_->capacity), Rate(rates_->fragmentation), Rate(rates_->quota),
          Rate(rates_->other)));
    } else {
      out.push_back(absl::StrFormat(
          "allocations/s -   frees/s -   waiting %d   (since start: %d allocs, %d frees, "
          "%d refused)",
          c.waiting_requests(), c.allocations(), c.frees(), refused));
      out.push_back("refused/s   capacity -   fragmentation -   quota -   other -   "
                    "(rates from the next refresh)");
    }
  } else {
    out.push_back("allocations/s -   frees/s -");
    out.push_back("refused/s   -");
  }
  if (unreachable_.has_value()) {
    // The facts first: a narrow screen cuts the daemon's words, not them.
    std::string line = absl::StrCat(
        "DAEMON UNREACHABLE for ", Uptime(absl::ToDoubleSeconds(now_ - unreachable_since_)));
    if (s != nullptr) {
      absl::StrAppend(&line, " (figures below are from ",
                      absl::FormatTime("%H:%M:%S", last_at_, absl::LocalTimeZone()), ")");
    }
    absl::StrAppend(&line, absl::StrFormat(", retrying every %gs: ", every),
                    absl::StatusCodeToString(unreachable_->code()), ": ",
                    unreachable_->message());
    out.push_back(line);
  } else if (s != nullptr && s->ledger().failing()) {
    // The facts first here too; the error (which names the file) last.
    const v1::LedgerStatus& l = s->ledger();
    out.push_back(absl::StrCat("LEDGER FAILING: ", l.held_events(),
                               l.held_events() == 1 ? " event" : " events",
                               " held in memory, ", l.dropped_events(),
                               " dropped; allocations are served: ", l.last_error()));
  } else if (restarted_at_.has_value() && now_ - *restarted_at_ < kRestartNoticeFor) {
    out.push_back(absl::StrCat(
        "daemon restarted (seen at ",
        absl::FormatTime("%H:%M:%S", *restarted_at_, absl::LocalTimeZone()),
        "): its counters started over; its earlier allocations are gone"));
  } else {
    out.push_back("");
  }

  std::vector<Section> sections;
  if (s != nullptr) {
    // Devices.
    constexpr int kDeviceFixed = 4 + 2 + 4 * 7 + 8 + 7;
    const int bar_width = std::max(1, width - kDeviceFixed);
    Section dev;
    dev.noun = "devices";
    dev.title = absl::StrFormat("DEV [%-*s]%7s%7s%7s%7s%8s%7s", bar_width,
                                Clip("#used +pooled rretained xother .free", bar_width),
                                "USED", "POOLED", "RETAIN", "FREE", "LARGEST", "ALLOCS");
    for (const v1::DeviceStats& d : s->devices()) {
      const uint64_t pooled_idle = d.pooled_bytes() - std::min(d.used_bytes(), d.pooled_bytes());
      const uint64_t ours = d.pooled_bytes() + d.retained_bytes();
      uint64_t other = 0;  // held outside gpumemd (cuda: the driver's own view)
      if (d.has_driver_total_bytes() && d.driver_total_bytes() > d.driver_free_bytes()) {
        const uint64_t held = d.driver_total_bytes() - d.driver_free_bytes();
        other = held > ours ? held - ours : 0;
      }
      const std::string bar =
          Bar({{d.used_bytes(), '#'}, {pooled_idle, '+'}, {d.retained_bytes(), 'r'},
               {other, 'x'}},
              d.total_bytes(), bar_width);
      dev.rows.push_back(absl::StrFormat(
          "%3d [%s]%7s%7s%7s%7s%8s%7d", d.index(), bar, ShortBytes(d.used_bytes()),
          ShortBytes(d.pooled_bytes()), ShortBytes(d.retained_bytes()),
          ShortBytes(d.free_bytes()), ShortBytes(d.largest_free_block_bytes()),
          d.allocation_count()));
    }
    dev.empty = "(the daemon has no devices)";
    sections.push_back(std::move(dev));

    // Tenants.
    Section ten;
    ten.noun = "tenants";
    ten.title = absl::StrFormat("%-18s%7s%7s%8s%6s%7s%6s%8s", "TENANT", "USED", "RETAIN",
                                "QUOTA", "USE%", "PEAK", "WAIT", "ALLOCS");
    for (const v1::TenantStats& t : s->tenants()) {
      std::string quota = "-", use = "-";
      if (t.has_quota() && t.quota().has_total_bytes()) {
        quota = ShortBytes(t.quota().total_bytes());
        if (t.quota().total_bytes() > 0) {
          use = absl::StrFormat(
              "%.0f%%", 100.0 * static_cast<double>(t.used_bytes() + t.retained_bytes()) /
                            static_cast<double>(t.quota().total_bytes()));
        }
      } else if (t.has_quota() && t.quota().devices_size() > 0) {
        quota = "per-dev";
      } else if (t.has_quota() && t.quota().has_max_allocations()) {
        quota = absl::StrCat(t.quota().max_allocations(), "al");
      }
      std::string name = t.name().empty() ? absl::StrCat("#", t.tenant()) : t.name();
      ten.rows.push_back(absl::StrFormat(
          "%-18s%7s%7s%8s%6s%7s%6d%8d", Clip(name, 17), ShortBytes(t.used_bytes()),
          ShortBytes(t.retained_bytes()), quota, use, ShortBytes(t.peak_bytes()),
          t.waiting_requests(), t.allocation_count()));
    }
    ten.empty = "(no tenant you may see holds memory or waits)";
    sections.push_back(std::move(ten));

    // Sessions, most memory first.
    std::vector<const v1::SessionStats*> by_use;
    for (const v1::SessionStats& ss : s->sessions()) by_use.push_back(&ss);
    std::stable_sort(by_use.begin(), by_use.end(),
                     [](const v1::SessionStats* a, const v1::SessionStats* b) {
                       if (a->used_bytes() != b->used_bytes()) {
                         return a->used_bytes() > b->used_bytes();
                       }
                       return a->session_id() < b->session_id();
                     });
    Section ses;
    ses.noun = "sessions";
    ses.title = absl::StrFormat("%-10s%9s%8s%8s%8s%8s%8s%8s", "SESSION", "PID", "UID",
                                "USED", "ALLOCS", "LEASED", "IN-USE", "RETAIN");
    for (const v1::SessionStats* ss : by_use) {
      ses.rows.push_back(absl::StrFormat(
          "%-10d%9d%8d%8s%8d%8s%8s%8s", ss->session_id(), ss->pid(), ss->uid(),
          ShortBytes(ss->used_bytes()), ss->allocation_count(), ShortBytes(ss->leased_bytes()),
          ShortBytes(ss->in_use_bytes()), ShortBytes(ss->retained_bytes())));
    }
    ses.empty = "(no session you may see)";
    sections.push_back(std::move(ses));
  } else if (!unreachable_.has_value()) {
    out.push_back("(waiting for the daemon's first answer)");
  }

  // Rows per section: at least one each, then up to 5 for tenants and
  // sessions, then devices, then the rest in order.
  const int n = static_cast<int>(sections.size());
  std::vector<int> want(n), give(n, 0);
  for (int i = 0; i < n; ++i) want[i] = std::max<int>(1, sections[i].rows.size());
  if (plain) {
    give = want;
  } else {
    int left = height - static_cast<int>(out.size()) - n /* titles */ - std::max(n - 1, 0);
    auto grant = [&](int i, int cap) {
      const int g = std::clamp(std::min(cap, want[i]) - give[i], 0, std::max(left, 0));
      give[i] += g;
      left -= g;
    };
    for (int i = 0; i < n; ++i) grant(i, 1);
    for (int i = 1; i < n; ++i) grant(i, 5);
    for (int i = 0; i < n; ++i) grant(i, want[i]);
  }
  for (int i = 0; i < n; ++i) {
    const Section& sec = sections[i];
    if (i > 0) out.push_back("");
    out.push_back(sec.title);
    if (sec.rows.empty()) {
      if (give[i] > 0) out.push_back(sec.empty);
      continue;
    }
    const int rows = static_cast<int>(sec.rows.size());
    const int shown = give[i] >= rows ? rows : std::max(give[i] - 1, 0);
    for (int r = 0; r < shown; ++r) out.push_back(sec.rows[r]);
    if (shown < rows && give[i] > 0) {
      out.push_back(absl::StrFormat("  ... %d more %s (a taller terminal shows them)",
                                    rows - shown, sec.noun));
    }
  }
  if (!plain && static_cast<int>(out.size()) > height) out.resize(height);
  for (std::string& l : out) l = Clip(std::move(l), plain ? -1 : width);  // pipes: whole lines
  return out;
}

}  // namespace client
}  // namespace gpumem
