// FakeGpumemd: an in-process test double of gpumemd's admin side: GetStats,
// PutTenant and DeleteTenant over gRPC on a Unix socket, with the semantics
// proto/gpumem/v1/gpumem.proto documents:
//   - PutTenant: name of letters, digits, '-', '_', '.', at most 63; quota
//     devices by selector (index or UUID; an unknown one is
//     INVALID_ARGUMENT), answered by index; socket_path inside
//     tenant_socket_dir or a bare file name there (empty: <dir>/<name>.sock;
//     outside is INVALID_ARGUMENT); the socket is really bound there (the
//     double listens and never answers); the same request again changes
//     nothing, answers created=false and keeps the socket where it was;
//     asking an existing tenant for another socket path is
//     FAILED_PRECONDITION (an empty one keeps it), a "uid-N" name
//     INVALID_ARGUMENT, as the real daemon answers.
//   - DeleteTenant: removes the tenant and its socket; an unknown name is
//     existed=false; a tenant holding memory (SetTenantUsage) is
//     FAILED_PRECONDITION unless end_sessions, which frees it.
//   - GetStats: sim-like devices (UUIDs, names and PCI ids as the sim
//     backend makes them), every tenant with its quota and usage.
// It records every admin call, and can misbehave on purpose: answer
// PutTenant with a socket path outside the claims directory.
#ifndef GPUMEMD_TESTS_DRA_FAKE_GPUMEMD_H_
#define GPUMEMD_TESTS_DRA_FAKE_GPUMEMD_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/dra/gpumemd_peer.h"

namespace gpumem {
namespace dra {
namespace testing {

class FakeGpumemd final : public GpumemdPeer, private v1::GpuMemory::Service {
 public:
  struct Call {
    std::string method;
    std::string request;  // the request, protobuf text format
  };

  FakeGpumemd(std::string socket, std::string claims_dir, std::vector<uint64_t> device_sizes);
  ~FakeGpumemd() override;

  std::string socket() const override { return socket_; }
  std::string claims_dir() const override { return claims_dir_; }
  absl::Status HoldOutsideClaims(uint32_t index, uint64_t bytes) override;
  FakeGpumemd* fake() override { return this; }

  // Memory `tenant` holds on device `index` (the tenant need not exist: a
  // uid tenant of the main socket is made up on the spot).
  void SetTenantUsage(const std::string& tenant, uint32_t index, uint64_t bytes);
  void SetDeviceSizes(std::vector<uint64_t> sizes);
  // Answer PutTenant with this socket path instead of the real one.
  void AnswerSocketPath(std::string path);
  std::vector<Call> Calls() const;
  std::vector<std::string> TenantNames() const;

 private:
  struct Tenant {
    uint32_t id = 0;
    v1::Quota quota;  // devices by index
    int32_t priority = 0;
    std::string socket_path;  // empty for uid tenants
    int socket_fd = -1;
    std::map<uint32_t, uint64_t> used;
  };
  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse*) override;
  grpc::Status PutTenant(grpc::ServerContext*, const v1::PutTenantRequest*,
                         v1::PutTenantResponse*) override;
  grpc::Status DeleteTenant(grpc::ServerContext*, const v1::DeleteTenantRequest*,
                            v1::DeleteTenantResponse*) override;
  std::string Uuid(uint32_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string socket_, claims_dir_;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> sizes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  uint32_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::string answer_socket_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing
}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_DRA_FAKE_GPUMEMD_H_
