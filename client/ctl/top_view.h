// TopView: what `gpumemctl top` shows, as lines of text, made from the
// daemon's GetStats answers. It keeps the last answer and the one before, so
// that each refresh shows rates (allocations, frees and refusals per second,
// by reason) as the difference of the daemon's counters over the daemon's
// own uptime between the two answers.
//
// Invariants: Render never returns more than `height` lines nor a line
// wider than `width` columns (ASCII only); a daemon that restarted (its
// uptime or a counter went down) shows no rates for that refresh, and a
// notice, never negative figures; it makes no calls of its own: what it
// shows is what the caller gave it (the daemon's visibility rules apply to
// that answer). Not thread-safe (one per loop).
#ifndef GPUMEMD_CLIENT_CTL_TOP_VIEW_H_
#define GPUMEMD_CLIENT_CTL_TOP_VIEW_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

class TopView {
 public:
  static constexpr int kMinWidth = 76;
  static constexpr int kMinHeight = 12;

  // `source` names the daemon in the title (its socket path).
  TopView(std::string source, absl::Duration interval)
      : source_(std::move(source)), interval_(interval) {}

  // A fresh answer, taken at `now`. While the daemon's ledger fails to
  // commit (GetStats' ledger.failing), the notice line says so: events held,
  // dropped, and the error.
  void Update(v1::GetStatsResponse stats, absl::Time now);
  // The daemon could not be asked at `now`: it says so on the first lines
  // and keeps showing the last answer, marked with when it was taken.
  void Unreachable(const absl::Status& why, absl::Time now);

  // The screen for `width` x `height`: per device a bar of used / pooled /
  // retained / free with the figures and the largest free block; per tenant
  // current use against its quota, peak and waiting requests; the sessions
  // holding the most memory. Sections that do not fit say how many rows they
  // left out. Below MinWidth x MinHeight, a one-line-per-fact message saying
  // so, and what size it needs.
  std::vector<std::string> Render(int width, int height) const;
  // Every row, bars and tables sized for `width` columns, no line cut (the
  // plain mode: a long message is kept whole).
  std::vector<std::string> RenderAll(int width) const;

  // Per-second rates of the last refresh; nullopt after the first answer, a
  // restart, or while unreachable.
  struct Rates {
    double allocations = 0, frees = 0;
    double capacity = 0, fragmentation = 0, quota = 0, other = 0;
  };
  const std::optional<Rates>& rates() const { return rates_; }

 private:
  std::vector<std::string> TooSmall(int width, int height) const;
  std::vector<std::string> Lay(int width, int height, bool plain) const;

  const std::string source_;
  const absl::Duration interval_;
  std::optional<v1::GetStatsResponse> last_;
  absl::Time last_at_;
  std::optional<Rates> rates_;
  // Set while the daemon cannot be reached: why, and since when.
  std::optional<absl::Status> unreachable_;
  absl::Time unreachable_since_;
  // When a restart was seen (shown for a while).
  std::optional<absl::Time> restarted_at_;
  absl::Time now_;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_CTL_TOP_VIEW_H_
