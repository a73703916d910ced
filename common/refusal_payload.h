// The structured half of a placement refusal, as it rides on an absl::Status,
// and the one rule that names why a refused Allocate was refused.
//
// The daemon refuses a placement with RESOURCE_EXHAUSTED whose message
// describes the refusal and whose payload (under kPlacementRefusalTypeUrl)
// is the serialized gpumem.v1.PlacementRefusal; the gRPC layer copies that
// payload into google.rpc.Status details and the client library puts it back
// on the absl::Status it returns. Both sides use this file, so the type URL
// and the parsing exist once.
//
// Refusal reasons: a refused Allocate is counted once, under the most common
// reason among its devices' refusals (capacity, fragmentation, quota; ties go
// to the first of that list), or under its status code when no device was
// refused for one of those (an invalid argument, a permission, a shard
// placement with only excluded devices, ...). The daemon's Prometheus
// counter (gpumemd_allocation_refusals_total) and GetStats' DaemonCounters
// both use RefusalKindOf, so they agree.
#ifndef GPUMEMD_COMMON_REFUSAL_PAYLOAD_H_
#define GPUMEMD_COMMON_REFUSAL_PAYLOAD_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {

inline constexpr absl::string_view kPlacementRefusalTypeUrl =
    "type.googleapis.com/gpumem.v1.PlacementRefusal";

// The PlacementRefusal carried by `status`, if any (and if it parses).
std::optional<v1::PlacementRefusal> RefusalFromStatus(const absl::Status& status);

enum class RefusalKind { kCapacity, kFragmentation, kQuota, kOther };

// Why an Allocate that failed with `code` was refused (see the file comment);
// `refusal` is its placement refusal, if it carried one.
RefusalKind RefusalKindOf(absl::StatusCode code,
                          const std::optional<v1::PlacementRefusal>& refusal);
RefusalKind RefusalKindOf(const absl::Status& status);

// The label of a refusal: "capacity", "fragmentation", "quota", or for
// kOther the status code in lower case ("invalid_argument", "unavailable").
std::string RefusalLabel(absl::StatusCode code,
                         const std::optional<v1::PlacementRefusal>& refusal);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_REFUSAL_PAYLOAD_H_
