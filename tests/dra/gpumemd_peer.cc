// The seam's two sides: the double (fake_gpumemd.cc) and a real daemon
// process started from the runfiles.
#include "tests/dra/gpumemd_peer.h"

#include <fstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/lib/cpp/client.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "tests/dra/fake_gpumemd.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace dra {
namespace testing {
namespace {

std::unique_ptr<v1::GpuMemory::Stub> Stub(const std::string& socket) {
  return v1::GpuMemory::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

class RealPeer final : public GpumemdPeer {
 public:
  RealPeer(std::unique_ptr<gpumem::testing::DaemonProcess> daemon, std::string claims_dir)
      : daemon_(std::move(daemon)), claims_dir_(std::move(claims_dir)) {}
  std::string socket() const override { return daemon_->socket(); }
  std::string claims_dir() const override { return claims_dir_; }
  absl::Status HoldOutsideClaims(uint32_t index, uint64_t bytes) override {
    if (!client_) {
      absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(socket());
      if (!c.ok()) return c.status();
      client_ = std::move(*c);
    }
    v1::PlacementRequest p;
    p.add_devices(absl::StrCat(index));
    absl::StatusOr<client::Buffer> b = client_->Allocate(bytes, p);
    if (!b.ok()) return b.status();
    held_.push_back(std::move(*b));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<gpumem::testing::DaemonProcess> daemon_;
  std::string claims_dir_;
  std::unique_ptr<client::Client> client_;
  std::vector<client::Buffer> held_;
};

}  // namespace

std::vector<uint64_t> PeerDeviceSizes() { return {uint64_t{4} << 30, uint64_t{2} << 30}; }

absl::StatusOr<v1::GetStatsResponse> GpumemdPeer::Stats() const {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::GetStatsRequest req;
  v1::GetStatsResponse resp;
  grpc::Status s = Stub(socket())->GetStats(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp;
}

absl::StatusOr<std::unique_ptr<v1::TenantStats>> GpumemdPeer::Tenant(const std::string& name) const {
  absl::StatusOr<v1::GetStatsResponse> s = Stats();
  if (!s.ok()) return s.status();
  for (const v1::TenantStats& t : s->tenants()) {
    if (t.name() == name) return std::make_unique<v1::TenantStats>(t);
  }
  return std::unique_ptr<v1::TenantStats>();
}

std::unique_ptr<GpumemdPeer> StartFakePeer(const std::string& dir) {
  return std::make_unique<FakeGpumemd>(dir + "/gpumemd.sock", dir + "/tenants", PeerDeviceSizes());
}

std::unique_ptr<GpumemdPeer> StartRealPeer(const std::string& dir, std::string* why) {
  const std::string claims_dir = dir + "/tenants";
  const std::string config = dir + "/gpumemd.textproto";
  std::ofstream(config) << "tenant_socket_dir: \"" << claims_dir << "\"\n";
  std::vector<std::string> sizes;
  for (uint64_t s : PeerDeviceSizes()) sizes.push_back(absl::StrCat(s >> 30, "GiB"));
  auto daemon = std::make_unique<gpumem::testing::DaemonProcess>(std::vector<std::string>{
      "--config=" + config,
      "--sim_devices=" + absl::StrJoin(sizes, ","), "--slab_size=64MiB"});
  if (!daemon->Start()) {
    *why = "gpumemd did not start: " + daemon->Log();
    return nullptr;
  }
  return std::make_unique<RealPeer>(std::move(daemon), claims_dir);
}

absl::Status ProbeTenantRpcs(const GpumemdPeer& peer) {
  auto stub = Stub(peer.socket());
  v1::PutTenantRequest put;
  put.set_name("dra-test-probe");
  v1::PutTenantResponse put_resp;
  grpc::ClientContext c1;
  Deadline(&c1);
  grpc::Status s = stub->PutTenant(&c1, put, &put_resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        "PutTenant: " + s.error_message());
  }
  v1::DeleteTenantRequest del;
  del.set_name("dra-test-probe");
  v1::DeleteTenantResponse del_resp;
  grpc::ClientContext c2;
  Deadline(&c2);
  s = stub->DeleteTenant(&c2, del, &del_resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        "DeleteTenant: " + s.error_message());
  }
  return absl::OkStatus();
}

}  // namespace testing
}  // namespace dra
}  // namespace gpumem
