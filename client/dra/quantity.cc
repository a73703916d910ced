// Quantity grammar (k8s.io/apimachinery resource.Quantity):
//   [+-]? digits [. digits]? (Ki|Mi|Gi|Ti|Pi|Ei | n|u|m|k|M|G|T|P|E | [eE][+-]?digits)?
// The value is exact: the digits form an integer N, the suffix and the
// fraction a factor 2^p2 * 10^p10, computed in 128 bits and rounded up.
#include "client/dra/quantity.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace dra {
namespace {

using u128 = unsigned __int128;
constexpr u128 kLimit = static_cast<u128>(UINT64_MAX);

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a byte quantity: ", why));
}

}  // namespace

absl::StatusOr<uint64_t> ParseQuantityBytes(absl::string_view text) {
  absl::string_view s = text;
  if (s.empty()) return Bad(text, "empty");
  if (s.size() > 64) return Bad(text, "too long");
  bool negative = false;
  if (s[0] == '+' || s[0] == '-') {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  // N: every digit; F: how many came after the point. At most 30 of each,
  // so N < 10^30 < 2^100 and 10^F fits in 128 bits with room to spare.
  u128 n = 0;
  int digits = 0, fraction = 0;
  bool in_fraction = false, any_digit = false;
  while (!s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) {
    if (s[0] == '.') {
      if (in_fraction) return Bad(text, "two decimal points");
      in_fraction = true;
    } else {
      any_digit = true;
      if (n != 0 || s[0] != '0') ++digits;
      if (in_fraction) ++fraction;
      if (digits > 30 || fraction > 30) return Bad(text, "too many digits");
      n = n * 10 + static_cast<unsigned>(s[0] - '0');
    }
    s.remove_prefix(1);
  }
  if (!any_digit) return Bad(text, "no digits");
  // The value is n * 2^p2 * 10^p10.
  int p2 = 0, p10 = -fraction;
  if (s.empty()) {
  } else if (s.size() == 2 && s[1] == 'i') {
    static constexpr char kBinary[] = "KMGTPE";
    int k = 0;
    while (k < 6 && kBinary[k] != s[0]) ++k;
    if (k == 6) return Bad(text, "unknown suffix");
    p2 = 10 * (k + 1);
  } else if (s.size() == 1 && absl::string_view("numkMGTPE").find(s[0]) != absl::string_view::npos) {
    static constexpr char kDecimal[] = "num kMGTPE";
    p10 += 3 * static_cast<int>(absl::string_view(kDecimal).find(s[0])) - 9;
  } else if (s[0] == 'e' || s[0] == 'E') {
    s.remove_prefix(1);
    bool neg_exp = false;
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
      neg_exp = s[0] == '-';
      s.remove_prefix(1);
    }
    if (s.empty() || s.size() > 3) return Bad(text, "bad exponent");
    int e = 0;
    for (char c : s) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return Bad(text, "bad exponent");
      e = e * 10 + (c - '0');
    }
    p10 += neg_exp ? -e : e;
  } else {
    return Bad(text, "unknown suffix");
  }
  if (n == 0) return uint64_t{0};
  if (negative) return Bad(text, "negative");
  const absl::Status too_big = Bad(text, "larger than 2^64 bytes");
  if (p10 >= 0) {  // an integer times 10^p10 (or times 2^p2: one is 0)
    u128 v = n;
    if (v > kLimit) return too_big;
    for (int i = 0; i < p10; ++i) {
      v *= 10;
      if (v > kLimit) return too_big;
    }
    if (v > (kLimit >> p2)) return too_big;
    return static_cast<uint64_t>(v << p2);
  }
  const int d = -p10;
  if (d > 38) return uint64_t{1};  // 0 < value < 1 byte (n < 10^30 < 10^d)
  u128 den = 1;
  for (int i = 0; i < d; ++i) den *= 10;
  // ceil(n * 2^p2 / den) = q * 2^p2 + ceil(r * 2^p2 / den), the second term
  // by binary long division (r stays below den, so 2r fits in 128 bits).
  u128 q = n / den, r = n % den;
  if (q > (kLimit >> p2)) return too_big;
  u128 v = q << p2, frac = 0;
  for (int i = 0; i < p2; ++i) {
    r <<= 1;
    frac <<= 1;
    if (r >= den) {
      r -= den;
      frac |= 1;
    }
  }
  v += frac + (r != 0 ? 1 : 0);
  if (v > kLimit) return too_big;
  return static_cast<uint64_t>(v);
}

std::string FormatQuantityBytes(uint64_t bytes) {
  static constexpr const char* kSuffix[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  if (bytes == 0) return "0";
  int k = 0;
  uint64_t v = bytes;
  while (k < 6 && (v & 1023) == 0) {
    v >>= 10;
    ++k;
  }
  if (k == 0) return absl::StrCat(bytes);
  return absl::StrCat(v, kSuffix[k - 1]);
}

}  // namespace dra
}  // namespace gpumem
