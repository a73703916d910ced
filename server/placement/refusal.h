// Refusal: how placement says "nothing can hold this", in words and in a
// structured detail that say the same thing.
//
// The status message is built from the PlacementRefusal proto, never
// separately, so the two cannot disagree. Example:
//   cannot place 8.00 GiB: device 0 (GPU-1a..): capacity, 2.00 GiB free;
//   device 1 (GPU-2b..): fragmentation, largest free range 1.00 GiB of
//   3.00 GiB free; device 2 (GPU-3c..): excluded
// The status also carries the serialized proto as an absl::Status payload
// under kPlacementRefusalTypeUrl (common/refusal_payload.h, which also reads
// it back), so a gRPC layer can copy it into the binary error details
// (google.rpc.Status.details) unchanged.
#ifndef GPUMEMD_SERVER_PLACEMENT_REFUSAL_H_
#define GPUMEMD_SERVER_PLACEMENT_REFUSAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/refusal_payload.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace placement {

// The message text for `refusal`.
std::string DescribeRefusal(const gpumem::v1::PlacementRefusal& refusal);

// RESOURCE_EXHAUSTED with DescribeRefusal's text and the proto as payload.
absl::Status RefusalStatus(const gpumem::v1::PlacementRefusal& refusal);

}  // namespace placement
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_PLACEMENT_REFUSAL_H_
