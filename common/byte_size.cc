// Parsing is strict: one number, optional spaces, one known suffix, nothing
// else. Overflow past 2^64 - 1 is an error, never a wrap.
#include "common/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpumem {
namespace {

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "bad byte size \"", text, "\": ", why,
      " (examples: 4096, 64KiB, 1.5GiB, 2G)"));
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (s.empty()) return Bad(text, "empty");
  size_t i = 0;
  while (i < s.size() && (absl::ascii_isdigit(s[i]) || s[i] == '.')) ++i;
  absl::string_view number = s.substr(0, i);
  std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(i)));
  if (number.empty()) return Bad(text, "no number");
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else {
    static const char kUnits[] = "kmgtpe";
    const char* u = std::strchr(kUnits, suffix[0]);
    if (u == nullptr) return Bad(text, "unknown unit");
    absl::string_view rest = absl::string_view(suffix).substr(1);
    if (!(rest.empty() || rest == "b" || rest == "ib")) {
      return Bad(text, "unknown unit");
    }
    shift = 10 * static_cast<int>(u - kUnits + 1);
  }
  if (number.find('.') == absl::string_view::npos) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(number, &v)) return Bad(text, "number too large");
    if (shift > 0 && (v >> (64 - shift)) != 0) return Bad(text, "too large");
    return v << shift;
  }
  double v = 0;
  if (!absl::SimpleAtod(number, &v) || !std::isfinite(v)) {
    return Bad(text, "not a number");
  }
  long double bytes = static_cast<long double>(v) * std::ldexp(1.0L, shift);
  if (bytes >= 18446744073709551615.0L) return Bad(text, "too large");
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

absl::StatusOr<std::vector<uint64_t>> ParseDeviceSizes(absl::string_view text) {
  std::vector<uint64_t> sizes;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad device list \"", text,
                       "\": empty item (examples: 4x16GiB, 80GiB,40GiB)"));
    }
    uint64_t count = 1;
    size_t x = item.find_first_of("xX");
    if (x != absl::string_view::npos) {
      if (!absl::SimpleAtoi(item.substr(0, x), &count) || count == 0 ||
          count > 64) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bad device list \"", text, "\": count in \"", item,
            "\" must be 1..64"));
      }
      item = item.substr(x + 1);
    }
    absl::StatusOr<uint64_t> size = ParseByteSize(item);
    if (!size.ok()) return size.status();
    if (*size < (1u << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad device list \"", text, "\": a device needs at least 1 MiB"));
    }
    sizes.insert(sizes.end(), count, *size);
  }
  if (sizes.size() > 64) {
    return absl::InvalidArgumentError("at most 64 devices");
  }
  return sizes;
}

}  // namespace gpumem
