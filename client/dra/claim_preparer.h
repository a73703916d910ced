// ClaimPreparer: turns a ResourceClaim allocated on this node into a gpumemd
// tenant that the claim's containers reach through their own socket, and
// back. Invariants: a failed Prepare leaves nothing behind; a claim already
// prepared gets the same answer every time; the socket gpumemd answers with
// must be the one asked for, inside the claims directory (anything else is
// refused); a failed Unprepare keeps its record, so the kubelet's retry
// finishes the job. Thread-safe; operations on claims are serialized, the
// API server read is not (a slow API server delays only the claims that
// need it).
#ifndef GPUMEMD_CLIENT_DRA_CLAIM_PREPARER_H_
#define GPUMEMD_CLIENT_DRA_CLAIM_PREPARER_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/dra/api_server.h"
#include "client/dra/cdi_spec.h"
#include "client/dra/claim.h"
#include "client/dra/plugin_state.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace dra {

struct PreparerConfig {
  std::string driver;
  std::string pool;        // this node's pool (the node name)
  // gpumemd's tenant_socket_dir: claim sockets live in subdirectories.
  std::string claims_dir = "/run/gpumemd/tenants";
  CdiConfig cdi;
  absl::Duration gpumemd_timeout = absl::Seconds(5);
};

// INVALID_ARGUMENT unless the directories are absolute, normalized paths and
// the container socket is an absolute path with a file name.
absl::Status ValidatePreparerConfig(const PreparerConfig& config);

class ClaimPreparer {
 public:
  ClaimPreparer(PreparerConfig config, const ApiServer* api, v1::GpuMemory::StubInterface* gpumemd,
                PluginState* state);

  // Reads the claim from the API server, checks its allocation against this
  // node's devices (a device gpumemd does not have, or more memory than a
  // device has, is INVALID_ARGUMENT), records the plan (PluginState,
  // PREPARING), then makes, in order: the claim's socket directory
  // <claims_dir>/claim-<uid>, the tenant claim-<uid> (PutTenant: per-device
  // quotas of the consumed capacity, the socket in that directory), the CDI
  // spec, and records PREPARED. If a step fails, everything made so far is
  // removed again (DeleteTenant with end_sessions, the directory, the spec,
  // the record). A claim already PREPARED is answered from the record,
  // without the API server, after making sure gpumemd still has the tenant
  // (PutTenant is idempotent) and the spec is in place.
  absl::StatusOr<std::vector<PreparedDevice>> Prepare(const ClaimRef& claim);
  // DeleteTenant (end_sessions: the claim's pods are gone), removes the
  // socket directory and the CDI spec, forgets the record. A claim never
  // prepared is not an error. On failure the record stays.
  absl::Status Unprepare(const ClaimRef& claim);

  // The claims directory root's alone (0700), if this process owns it: no
  // one on the node reaches a claim's socket through it; a claim's
  // containers get their own claim's directory through the CDI bind mount,
  // which does not pass through it. A hostPath the kubelet (re)made is 0755:
  // this runs at start, and before every PutTenant (Prepare, and the
  // re-assertion of a prepared claim after a node's reboot).
  absl::Status CloseClaimsDir() const;

  const PreparerConfig& config() const { return config_; }
  // The CDI device id every device of a prepared claim carries.
  std::string CdiDeviceId(const std::string& uid) const;

 private:
  absl::StatusOr<PreparedClaim> Plan(const ClaimRef& claim);
  absl::Status Make(PreparedClaim* claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  absl::Status Reassert(const PreparedClaim& claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  absl::Status Undo(const PreparedClaim& claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  absl::StatusOr<v1::PutTenantResponse> PutTenant(const PreparedClaim& claim);

  const PreparerConfig config_;
  const ApiServer* const api_;
  v1::GpuMemory::StubInterface* const gpumemd_;
  PluginState* const state_;
  absl::Mutex ops_mu_;
};

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_CLAIM_PREPARER_H_
