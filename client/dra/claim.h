// ClaimAllocation: what the scheduler gave a ResourceClaim on this node, read
// from the claim's JSON (resource.k8s.io/v1 ResourceClaim) as the API
// server returns it.
//
// ParseClaim trusts nothing in the body: it must be a JSON object whose
// metadata.uid is the UID the kubelet named (a claim deleted and recreated
// under the same name is another claim), it must be allocated, and the
// allocation results of this driver must name this node's pool and carry
// well-formed quantities. Every failure is a status naming the claim and
// the field: INVALID_ARGUMENT for a malformed body or field,
// FAILED_PRECONDITION for a claim that is well formed but not something this
// plugin can prepare (another UID, not allocated, nothing for this driver,
// another node's pool, adminAccess).
#ifndef GPUMEMD_CLIENT_DRA_CLAIM_H_
#define GPUMEMD_CLIENT_DRA_CLAIM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpumem {
namespace dra {

// Which claim, as the kubelet names it.
struct ClaimRef {
  std::string ns;
  std::string name;
  std::string uid;
};

// OK when the three are set and the UID can name a tenant ("claim-" + UID
// must be a gpumemd tenant name: letters, digits, '-', '_', '.', at most 63).
absl::Status ValidateClaimRef(const ClaimRef& ref);

struct AllocatedDevice {
  std::string request;  // the claim's request (or "request/subrequest")
  std::string pool;
  std::string device;   // the ResourceSlice device name
  // consumedCapacity["memory"]; absent when the scheduler allocated the
  // whole device (consumable capacity off in the cluster).
  std::optional<uint64_t> bytes;
};

struct ClaimAllocation {
  ClaimRef ref;
  std::vector<AllocatedDevice> devices;  // this driver's results only
};

absl::StatusOr<ClaimAllocation> ParseClaim(const std::string& body, const ClaimRef& expected,
                                           const std::string& driver,
                                           const std::string& pool);

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_CLAIM_H_
