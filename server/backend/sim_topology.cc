#include "server/backend/sim_topology.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpumem {

absl::StatusOr<std::vector<PeerLink>> ParseSimTopology(absl::string_view text,
                                                       uint32_t n) {
  std::vector<PeerLink> m(static_cast<size_t>(n) * n, PeerLink::kHost);
  for (uint32_t i = 0; i < n; ++i) m[i * n + i] = PeerLink::kSelf;
  absl::string_view all = absl::StripAsciiWhitespace(text);
  if (all.empty()) return m;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --sim_topology \"", text, "\": ", why,
        " (example: nvlink:0-1,2-3;pcie:0-2; devices are 0..", n - 1, ")"));
  };
  for (absl::string_view section : absl::StrSplit(all, ';')) {
    absl::string_view t = absl::StripAsciiWhitespace(section);
    PeerLink link;
    if (absl::ConsumePrefix(&t, "nvlink:")) {
      link = PeerLink::kNvLink;
    } else if (absl::ConsumePrefix(&t, "pcie:")) {
      link = PeerLink::kPcie;
    } else {
      return bad(absl::StrCat("section \"", section, "\" must start with nvlink: or pcie:"));
    }
    for (absl::string_view group : absl::StrSplit(t, ',')) {
      std::vector<uint32_t> members;
      for (absl::string_view item : absl::StrSplit(group, '-')) {
        uint32_t d = 0;
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &d)) {
          return bad(absl::StrCat("\"", item, "\" is not a device index"));
        }
        if (d >= n) return bad(absl::StrCat("no device ", d));
        members.push_back(d);
      }
      if (members.size() < 2) {
        return bad(absl::StrCat("group \"", group, "\" needs two devices or more"));
      }
      for (uint32_t a : members) {
        for (uint32_t b : members) {
          // NVLink wins over PCIe where a pair is in both.
          if (a != b && m[a * n + b] != PeerLink::kNvLink) m[a * n + b] = link;
        }
      }
    }
  }
  return m;
}

}  // namespace gpumem
