#include "common/placement_set.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace gpumem {
namespace {

using ::gpumem::v1::PlacementRequest;

bool IsHexOrDash(char c) {
  return c == '-' || absl::ascii_isxdigit(static_cast<unsigned char>(c));
}

// INVALID_ARGUMENT with the message of `status` prefixed by `flag`.
absl::Status Prefixed(absl::string_view flag, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", status.message()));
}

// Parses the device list `text` of `flag` and appends its selectors to `out`;
// any error is prefixed with `flag`.
absl::Status AppendList(absl::string_view flag, absl::string_view text,
                        google::protobuf::RepeatedPtrField<std::string>* out) {
  absl::StatusOr<std::vector<std::string>> selectors = ParseDeviceList(text);
  if (!selectors.ok()) return Prefixed(flag, selectors.status());
  for (std::string& s : *selectors) *out->Add() = std::move(s);
  return absl::OkStatus();
}

absl::Status UnknownPolicy(absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy \"", value,
                   "\"; expected least-loaded, pack or near:<device>"));
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
  if (!absl::StartsWithIgnoreCase(value, "near")) return UnknownPolicy(value);
  absl::string_view rest = value.substr(4);
  if (rest.empty()) {
    return absl::InvalidArgumentError(
        "policy \"near\" needs a device: near:<index or UUID>");
  }
  // "near" followed by anything but ":", e.g. "nearest".
  if (!absl::ConsumePrefix(&rest, ":")) return UnknownPolicy(value);
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

absl::StatusOr<PlacementRequest> BuildPlacementRequest(
    const PlacementFlags& flags) {
  PlacementRequest request;
  if (!flags.gpus.empty()) {
    absl::Status status =
        AppendList("--gpus", flags.gpus, request.mutable_devices());
    if (!status.ok()) return status;
  }
  if (!flags.exclude.empty()) {
    absl::Status status =
        AppendList("--exclude", flags.exclude, request.mutable_exclude());
    if (!status.ok()) return status;
  }
  for (size_t i = 0; i < flags.fallback.size(); ++i) {
    absl::Status status =
        AppendList(absl::StrCat("--fallback[", i, "]"), flags.fallback[i],
                   request.add_fallback()->mutable_devices());
    if (!status.ok()) return status;
  }
  absl::StatusOr<PolicySpec> policy = ParsePolicy(flags.policy);
  if (!policy.ok()) return Prefixed("--policy", policy.status());
  request.set_policy(policy->policy);
  request.set_near(policy->near);
  return request;
}

}  // namespace gpumem
