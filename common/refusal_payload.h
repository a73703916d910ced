// The structured half of a placement refusal, as it rides on an absl::Status.
//
// The daemon refuses a placement with RESOURCE_EXHAUSTED whose message
// describes the refusal and whose payload (under kPlacementRefusalTypeUrl)
// is the serialized gpumem.v1.PlacementRefusal; the gRPC layer copies that
// payload into google.rpc.Status details and the client library puts it back
// on the absl::Status it returns. Both sides use this file, so the type URL
// and the parsing exist once.
#ifndef GPUMEMD_COMMON_REFUSAL_PAYLOAD_H_
#define GPUMEMD_COMMON_REFUSAL_PAYLOAD_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/refusal.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

inline constexpr absl::string_view kPlacementRefusalTypeUrl =
    "type.googleapis.com/gpumem.v1.PlacementRefusal";

// The PlacementRefusal carried by `status`, if any (and if it parses).
std::optional<v1::PlacementRefusal> RefusalFromStatus(const absl::Status& status);

// Why an Allocate was refused, in one word, for counters and metrics: the
// most common reason among the devices of its PlacementRefusal (capacity,
// fragmentation, quota; excluded devices and devices holding another shard
// do not vote; a tie goes to the first in that order), or kOther for any
// other error.
// (RefusalReason is common/refusal.h's.)
RefusalReason RefusalReasonOf(const absl::Status& status);
// "capacity", "fragmentation", "quota"; for kOther the status code in
// lower case ("invalid_argument", "unavailable", ...).
std::string RefusalLabel(const absl::Status& status);

// The wire's DeviceRefusal for `refusal`: its device, reason, figures and
// detail (the device's UUID is the caller's). The one place a Refusal
// becomes the payload; RefusalReasonOf reads it back.
v1::DeviceRefusal DeviceRefusalOf(const Refusal& refusal);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_REFUSAL_PAYLOAD_H_
