// One row of the settings table (setting_table.h): what a setting holds and
// how its flag parses (its kind), how its value is checked and how its
// errors read (its rule), when it applies, and how its default is shown.
//
// Every column here is data; what differs between settings beyond it is a
// Finish function named in the row (a check against settings resolved
// before it, which may also fill values derived from it). A kind fixes the
// config file's convention for "not set" (below), so that convention is the
// same for every setting of a kind.
#ifndef GPUMEMD_SERVER_CONFIG_SETTING_ROW_H_
#define GPUMEMD_SERVER_CONFIG_SETTING_ROW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/backend/backend.h"

namespace gpumem {

struct CommandLine;
struct Settings;
enum class Source;  // settings.h

// What a setting holds (Value) and what its flag parses as (Flag: part of
// the command line's syntax, e.g. an int flag refuses "1.5" itself). In the
// config file:
//  - Text, Bytes ("1GiB"): a string field; "" is not set.
//  - Integer, Millis: an integer field; 0 is not set (the default), and a
//    negative value means 0 (off, or no limit).
//  - Seconds: a double field; 0 or less is not set.
//  - HandleKinds: a repeated string field; none is not set.
//  - Number, Bool: flags only (Bool: --name=true or --name=false).
namespace setting_kind {
struct Text {
  using Value = std::string;
  using Flag = std::string;
};
struct Bytes {
  using Value = uint64_t;
  using Flag = std::string;
};
template <typename V, typename F>
struct Integer {
  using Value = V;
  using Flag = F;
};
using Count = Integer<uint32_t, int>;
using Threads = Integer<int, int>;
using BigCount = Integer<int64_t, int64_t>;
template <typename F>
struct Millis {
  using Value = absl::Duration;
  using Flag = F;
};
using Milliseconds = Millis<int>;
using LongMilliseconds = Millis<int64_t>;
struct Seconds {
  using Value = absl::Duration;
  using Flag = double;
};
struct Number {
  using Value = double;
  using Flag = double;
};
struct Bool {
  using Value = bool;
  using Flag = bool;
};
struct HandleKinds {
  using Value = std::vector<HandleKind>;
  using Flag = std::string;
};
}  // namespace setting_kind

// "" when the setting (already picked into `s`) is right, else why not; it
// may fill what is derived from the setting.
using Finish = std::string (*)(Settings* s);

// How a number is checked, and the words of its error. "--name" when the
// value came from a flag, "config field <field>" when from the file:
//  - kPositive: "W: must be > 0".
//  - kAtLeast: "--name must be >= MIN".
//  - kIn: "W: must be in [MIN, MAX]UNIT" ("--name must be in [MIN, MAX]"
//    for a setting with no config field). Bytes read as FormatBytes says.
//  - kUpTo: as kIn for a flag; the file's field (whose 0 means the default)
//    "W: must be at most MAXUNIT".
// Then `finish`, if any: "W: <why>".
struct Rule {
  enum class Bound { kNone, kPositive, kAtLeast, kIn, kUpTo };
  Bound bound = Bound::kNone;
  int64_t min = 0;
  int64_t max = 0;
  const char* unit = "";
  Finish finish = nullptr;

  constexpr Rule Then(Finish f) const { return Rule{bound, min, max, unit, f}; }
};
constexpr Rule NoBounds() { return Rule{}; }
constexpr Rule Checked(Finish f) { return Rule{}.Then(f); }
constexpr Rule Positive() { return Rule{Rule::Bound::kPositive}; }
constexpr Rule AtLeast(int64_t min) { return Rule{Rule::Bound::kAtLeast, min}; }
constexpr Rule In(int64_t min, int64_t max) { return Rule{Rule::Bound::kIn, min, max}; }
constexpr Rule UpTo(int64_t min, int64_t max, const char* unit) {
  return Rule{Rule::Bound::kUpTo, min, max, unit};
}

// Fixed for the daemon's life (a reload reports a changed field and keeps
// the running value), or applied at start and again on every SIGHUP.
enum class When { kStart, kReload };

// How `gpumemd --help` shows the default: as the flag would say it
// ("--slab_size=1GiB"), as a text in its place ("--state=<the socket's
// path>.state"), in the closing aside ("--admin_group: root only"), or not
// at all. The README's default column says the same.
struct Shown {
  enum class Where { kValue, kText, kAside, kHidden };
  Where where = Where::kValue;
  const char* text = "";
};
constexpr Shown ShowValue() { return Shown{}; }
constexpr Shown ShowText(const char* text) { return Shown{Shown::Where::kText, text}; }
constexpr Shown Aside(const char* text) { return Shown{Shown::Where::kAside, text}; }
constexpr Shown Hidden() { return Shown{Shown::Where::kHidden}; }

// A row as the code sees it: the table's columns, and what its kind does
// with the row's own members of CommandLine and Settings.
struct SettingRow {
  const char* flag;   // "slab_size": --slab_size
  const char* field;  // "pool.slab_size" in v1::DaemonConfig; nullptr: flags only
  When when;
  Rule rule;
  Shown shown;
  const char* help;
  // Flag over file over default, checked; the error names where the value
  // came from.
  absl::Status (*resolve)(const SettingRow& row, const CommandLine& flags,
                          const v1::DaemonConfig& file, Settings* s);
  // The value in `s` as its flag would be written ("1GiB", "300").
  std::string (*format)(const Settings& s);
  // Where the value in `s` came from.
  Source (*source)(const Settings& s);
  // `to` takes `from`'s value (a restart-only setting on reload).
  void (*keep)(const Settings& from, Settings* to);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_SETTING_ROW_H_
