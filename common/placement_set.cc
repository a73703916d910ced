#include "common/placement_set.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpumem {
namespace {

using ::gpumem::v1::PlacementRequest;

bool IsHexOrDash(char c) {
  return c == '-' || absl::ascii_isxdigit(static_cast<unsigned char>(c));
}

}  // namespace

bool IsIndexSelector(absl::string_view selector) {
  if (selector.empty()) return false;
  for (char c : selector) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool IsAllSelector(absl::string_view selector) {
  return absl::EqualsIgnoreCase(selector, kAllDevicesSelector);
}

absl::Status ValidateSelector(absl::string_view selector) {
  if (selector.empty()) {
    return absl::InvalidArgumentError("empty device selector");
  }
  if (IsAllSelector(selector)) return absl::OkStatus();
  if (IsIndexSelector(selector)) {
    uint32_t index = 0;
    if (!absl::SimpleAtoi(selector, &index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("device index \"", selector, "\" is out of range"));
    }
    return absl::OkStatus();
  }
  for (absl::string_view prefix : {"GPU-", "MIG-"}) {
    if (!absl::StartsWithIgnoreCase(selector, prefix)) continue;
    absl::string_view rest = selector.substr(prefix.size());
    if (rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device UUID \"", selector, "\" has nothing after \"", prefix, "\""));
    }
    for (char c : rest) {
      if (!IsHexOrDash(c)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device UUID \"", selector,
            "\" may hold only hex digits and dashes after \"", prefix, "\""));
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", selector,
      "\" is not a device selector (a decimal index, a GPU-... UUID or "
      "\"all\")"));
}

absl::StatusOr<std::vector<std::string>> ParseDeviceList(
    absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("empty device list");
  }
  std::vector<std::string> selectors;
  int position = 0;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    ++position;
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device list \"", text, "\": item ", position, " is empty"));
    }
    absl::Status valid = ValidateSelector(item);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("device list \"", text,
                                                     "\": item ", position,
                                                     ": ", valid.message()));
    }
    selectors.emplace_back(item);
  }
  return selectors;
}

absl::StatusOr<PolicySpec> ParsePolicy(absl::string_view text) {
  absl::string_view value = absl::StripAsciiWhitespace(text);
  PolicySpec spec;
  if (value.empty()) return spec;
  if (absl::EqualsIgnoreCase(value, "least-loaded") ||
      absl::EqualsIgnoreCase(value, "least_loaded")) {
    spec.policy = PlacementRequest::POLICY_LEAST_LOADED;
    return spec;
  }
  if (absl::EqualsIgnoreCase(value, "pack")) {
    spec.policy = PlacementRequest::POLICY_PACK;
    return spec;
  }
  if (absl::StartsWithIgnoreCase(value, "near")) {
    absl::string_view rest = value.substr(4);
    if (!absl::ConsumePrefix(&rest, ":")) {
      if (rest.empty()) {
        return absl::InvalidArgumentError(
            "policy \"near\" needs a device: near:<index or UUID>");
      }
      // e.g. "nearest": fall through to the generic error.
    } else {
      rest = absl::StripAsciiWhitespace(rest);
      if (rest.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "policy \"", value, "\" needs a device: near:<index or UUID>"));
      }
      if (IsAllSelector(rest)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "policy \"", value, "\": near takes one device, not \"all\""));
      }
      absl::Status valid = ValidateSelector(rest);
      if (!valid.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("policy \"", value, "\": ", valid.message()));
      }
      spec.policy = PlacementRequest::POLICY_NEAR;
      spec.near = std::string(rest);
      return spec;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy \"", value,
                   "\"; expected least-loaded, pack or near:<device>"));
}

absl::StatusOr<PlacementRequest> BuildPlacementRequest(
    const PlacementFlags& flags) {
  PlacementRequest request;
  auto prefixed = [](absl::string_view flag, const absl::Status& status) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", status.message()));
  };
  if (!flags.gpus.empty()) {
    absl::StatusOr<std::vector<std::string>> gpus = ParseDeviceList(flags.gpus);
    if (!gpus.ok()) return prefixed("--gpus", gpus.status());
    for (std::string& s : *gpus) request.add_devices(std::move(s));
  }
  if (!flags.exclude.empty()) {
    absl::StatusOr<std::vector<std::string>> exclude =
        ParseDeviceList(flags.exclude);
    if (!exclude.ok()) return prefixed("--exclude", exclude.status());
    for (std::string& s : *exclude) request.add_exclude(std::move(s));
  }
  for (size_t i = 0; i < flags.fallback.size(); ++i) {
    absl::StatusOr<std::vector<std::string>> set =
        ParseDeviceList(flags.fallback[i]);
    if (!set.ok()) {
      return prefixed(absl::StrCat("--fallback[", i, "]"), set.status());
    }
    gpumem::v1::DeviceSet* device_set = request.add_fallback();
    for (std::string& s : *set) device_set->add_devices(std::move(s));
  }
  absl::StatusOr<PolicySpec> policy = ParsePolicy(flags.policy);
  if (!policy.ok()) return prefixed("--policy", policy.status());
  request.set_policy(policy->policy);
  request.set_near(policy->near);
  return request;
}

}  // namespace gpumem
