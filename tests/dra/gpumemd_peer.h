// GpumemdPeer: the gpumemd that gpumemd-dra talks to in a test, behind one
// small seam so that the same test runs against the in-process double
// (FakeGpumemd) and against the real daemon //server:gpumemd, which serves
// PutTenant/DeleteTenant.
//
// Tests observe gpumemd only through its public API on socket() (GetStats:
// tenants, their quotas) and through the socket files, which both peers
// give the same meaning. What only the double can do (record calls,
// misbehave) is behind fake(), and tests that need it skip on the real one.
#ifndef GPUMEMD_TESTS_DRA_GPUMEMD_PEER_H_
#define GPUMEMD_TESTS_DRA_GPUMEMD_PEER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace dra {
namespace testing {

class FakeGpumemd;

class GpumemdPeer {
 public:
  virtual ~GpumemdPeer() = default;
  // The main socket (admin RPCs, GetStats).
  virtual std::string socket() const = 0;
  // Its tenant_socket_dir: the plugin's --claims_dir.
  virtual std::string claims_dir() const = 0;
  // Memory held on device `index` by a tenant that is not a claim (the
  // main socket's uid tenants): what the slice's capacity must leave out.
  virtual absl::Status HoldOutsideClaims(uint32_t index, uint64_t bytes) = 0;
  // The double, or nullptr for the real daemon.
  virtual FakeGpumemd* fake() { return nullptr; }

  // Through the public API, as root: GetStats.
  absl::StatusOr<v1::GetStatsResponse> Stats() const;
  // The tenant of that name in GetStats, if any.
  absl::StatusOr<std::unique_ptr<v1::TenantStats>> Tenant(const std::string& name) const;
};

// Both peers serve sim-like devices of these sizes (the real daemon with
// --sim_devices), so a golden slice holds for either.
std::vector<uint64_t> PeerDeviceSizes();

// The double, in this process.
std::unique_ptr<GpumemdPeer> StartFakePeer(const std::string& dir);
// //server:gpumemd from the runfiles, its tenant_socket_dir set in a config
// file; nullptr (and the reason in *why) when it does not start.
std::unique_ptr<GpumemdPeer> StartRealPeer(const std::string& dir, std::string* why);

// OK when the peer serves PutTenant and DeleteTenant (probes with a
// throwaway tenant); UNIMPLEMENTED from a daemon without part 1.
absl::Status ProbeTenantRpcs(const GpumemdPeer& peer);

}  // namespace testing
}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_DRA_GPUMEMD_PEER_H_
