// Placement sets on the command line: turns the strings a user types
// (`--gpus=0,1 --exclude=2 --fallback=all --policy=near:0`) into the
// gpumem.v1.PlacementRequest the daemon understands.
//
// Invariants: syntax only: whether a selector names a device that exists is
// the daemon's call, because only the daemon knows its devices
// (server/placement/resolve.h); every syntax error is INVALID_ARGUMENT
// naming the offending item and its position, never a silent drop; the
// selectors are kept as typed (only trimmed) and sent as is ("all" too,
// which the daemon resolves to every device).
#ifndef GPUMEMD_COMMON_PLACEMENT_SET_H_
#define GPUMEMD_COMMON_PLACEMENT_SET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

// The selector that means every device.
inline constexpr absl::string_view kAllDevicesSelector = "all";

// True when `selector` is "all" in any case.
bool IsAllSelector(absl::string_view selector);

// True when `selector` is a device index: decimal digits only.
bool IsIndexSelector(absl::string_view selector);

// OK when `selector` (already trimmed) is a well-formed selector; otherwise
// INVALID_ARGUMENT saying what is wrong with it. A selector is one of:
//  - a decimal index in the daemon's numbering: "0", "12";
//  - a device UUID: "GPU-" or "MIG-" (any case) followed by hex digits and
//    dashes, e.g. "GPU-5f1c2b3a-...";
//  - the literal "all" (any case): every device.
absl::Status ValidateSelector(absl::string_view selector);

// Parses "0,1", "all", "GPU-<uuid>", "0,GPU-abc" into selector strings,
// one per item, in the order given (duplicates kept; the daemon refuses
// them). Items are separated by commas; blanks around an item are ignored;
// "0,,1" and "0,x" are refused.
// An empty list, an empty item or a malformed item is INVALID_ARGUMENT naming
// the item, e.g. `device list "0,,1": item 2 is empty`.
absl::StatusOr<std::vector<std::string>> ParseDeviceList(
    absl::string_view text);

// A placement policy and, for POLICY_NEAR, the selector of the device whose
// neighbours are preferred.
struct PolicySpec {
  gpumem::v1::PlacementRequest::Policy policy =
      gpumem::v1::PlacementRequest::POLICY_UNSPECIFIED;
  std::string near;  // set only for POLICY_NEAR
};

// Parses a --policy value (any case): "" (the daemon's default),
// "least-loaded" (or "least_loaded"), "pack", "near:<selector>".
// "near" without a selector, "near:all" or anything else is INVALID_ARGUMENT.
absl::StatusOr<PolicySpec> ParsePolicy(absl::string_view text);

// The placement flags of a command line, as typed. An empty string (or an
// empty vector) means the flag was not given.
struct PlacementFlags {
  std::string gpus;                   // --gpus=0,1
  std::string exclude;                // --exclude=2
  std::vector<std::string> fallback;  // --fallback=..., once per occurrence
  std::string policy;                 // --policy=pack|least-loaded|near:0
};

// Builds the request from the flags: `gpus` becomes `devices`, `exclude`
// becomes `exclude`, each --fallback occurrence becomes one DeviceSet in the
// order given, and the policy fills `policy` and `near`. Any parse error is
// INVALID_ARGUMENT prefixed with the flag, e.g. `--fallback[1]: ...`.
absl::StatusOr<gpumem::v1::PlacementRequest> BuildPlacementRequest(
    const PlacementFlags& flags);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_PLACEMENT_SET_H_
