// The double keeps tenants in a map under one mutex; each socket tenant's
// socket is a real bound, listening Unix socket (never accepted from), so
// the plugin's checks on the file see what the daemon would leave there.
#include "tests/dra/fake_gpumemd.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cstring>

#include <google/protobuf/text_format.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"

namespace gpumem {
namespace dra {
namespace testing {
namespace {

std::string Text(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::TextFormat::PrintToString(m, &s);
  return s;
}

int BindSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    close(fd);
    return -1;
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > 63) return false;
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

}  // namespace

FakeGpumemd::FakeGpumemd(std::string socket, std::string claims_dir,
                         std::vector<uint64_t> device_sizes)
    : socket_(std::move(socket)), claims_dir_(std::move(claims_dir)), sizes_(std::move(device_sizes)) {
  mkdir(claims_dir_.c_str(), 0755);
  unlink(socket_.c_str());
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
  b.RegisterService(static_cast<v1::GpuMemory::Service*>(this));
  server_ = b.BuildAndStart();
}

FakeGpumemd::~FakeGpumemd() {
  server_->Shutdown();
  absl::MutexLock l(&mu_);
  for (auto& [name, t] : tenants_) {
    if (t.socket_fd >= 0) {
      close(t.socket_fd);
      unlink(t.socket_path.c_str());
    }
  }
}

std::string FakeGpumemd::Uuid(uint32_t i) const {
  // As server/backend/sim_backend.cc names its devices.
  const uint64_t h = 0x9e3779b97f4a7c15ull * (i + 1) ^ sizes_[i];
  return absl::StrFormat("GPU-51%06x-%04x-4000-8000-%012x", i,
                         static_cast<uint32_t>(h >> 48) & 0xffff, h & 0xffffffffffffull);
}

absl::Status FakeGpumemd::HoldOutsideClaims(uint32_t index, uint64_t bytes) {
  SetTenantUsage("uid-0", index, bytes);
  return absl::OkStatus();
}

void FakeGpumemd::SetTenantUsage(const std::string& tenant, uint32_t index, uint64_t bytes) {
  absl::MutexLock l(&mu_);
  Tenant& t = tenants_[tenant];
  if (t.id == 0) t.id = next_id_++;
  t.used[index] = bytes;
}

void FakeGpumemd::SetDeviceSizes(std::vector<uint64_t> sizes) {
  absl::MutexLock l(&mu_);
  sizes_ = std::move(sizes);
}

void FakeGpumemd::AnswerSocketPath(std::string path) {
  absl::MutexLock l(&mu_);
  answer_socket_ = std::move(path);
}

std::vector<FakeGpumemd::Call> FakeGpumemd::Calls() const {
  absl::MutexLock l(&mu_);
  return calls_;
}

std::vector<std::string> FakeGpumemd::TenantNames() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, t] : tenants_) out.push_back(name);
  return out;
}

grpc::Status FakeGpumemd::GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                                   v1::GetStatsResponse* resp) {
  absl::MutexLock l(&mu_);
  resp->set_backend("sim");
  for (uint32_t i = 0; i < sizes_.size(); ++i) {
    uint64_t used = 0;
    for (const auto& [name, t] : tenants_) {
      auto it = t.used.find(i);
      if (it != t.used.end()) used += it->second;
    }
    v1::DeviceStats* d = resp->add_devices();
    d->set_index(i);
    d->set_uuid(Uuid(i));
    d->set_name(absl::StrCat("gpumemd simulated GPU (", FormatBytes(sizes_[i]), ")"));
    d->set_pci_bus_id(absl::StrFormat("0000:%02x:00.0", 0x10 + i));
    d->set_total_bytes(sizes_[i]);
    d->set_used_bytes(used);
    d->set_free_bytes(sizes_[i] - std::min(used, sizes_[i]));
  }
  for (const auto& [name, t] : tenants_) {
    v1::TenantStats* ts = resp->add_tenants();
    ts->set_tenant(t.id);
    ts->set_name(name);
    uint64_t used = 0;
    for (const auto& [index, bytes] : t.used) {
      v1::TenantDeviceStats* td = ts->add_devices();
      td->set_device_index(index);
      td->set_used_bytes(bytes);
      used += bytes;
    }
    ts->set_used_bytes(used);
    if (t.quota.ByteSizeLong() > 0) *ts->mutable_quota() = t.quota;
  }
  return grpc::Status::OK;
}

grpc::Status FakeGpumemd::PutTenant(grpc::ServerContext*, const v1::PutTenantRequest* req,
                                    v1::PutTenantResponse* resp) {
  absl::MutexLock l(&mu_);
  calls_.push_back({"PutTenant", Text(*req)});
  if (!ValidName(req->name())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "tenant name must be 1-63 letters, digits, '-', '_', '.'");
  }
  // Quota devices by selector -> by index.
  v1::Quota quota = req->quota();
  for (v1::DeviceQuota& dq : *quota.mutable_devices()) {
    int found = -1;
    for (uint32_t i = 0; i < sizes_.size(); ++i) {
      if (dq.device() == Uuid(i) || dq.device() == absl::StrCat(i)) found = static_cast<int>(i);
    }
    if (found < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("no device ", dq.device()));
    }
    dq.set_device(absl::StrCat(found));
  }
  if (absl::StartsWith(req->name(), "uid-")) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("tenant name \"", req->name(), "\" is a uid tenant's name"));
  }
  std::string path = req->socket_path();
  if (auto known = tenants_.find(req->name()); known != tenants_.end() && path.empty()) {
    path = known->second.socket_path;
  }
  if (path.empty()) path = absl::StrCat(claims_dir_, "/", req->name(), ".sock");
  if (path.find('/') == std::string::npos) path = absl::StrCat(claims_dir_, "/", path);
  if (!absl::StartsWith(path, claims_dir_ + "/") || absl::StrContains(path, "/../") ||
      absl::StrContains(path, "/./") || absl::StrContains(path, "//")) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("socket_path ", path, " is outside ", claims_dir_));
  }
  auto it = tenants_.find(req->name());
  const bool created = it == tenants_.end();
  if (!created && it->second.socket_path != path) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("tenant ", req->name(), " has its socket at ",
                                     it->second.socket_path, ", not ", path));
  }
  Tenant& t = tenants_[req->name()];
  if (created) {
    t.id = next_id_++;
    t.socket_path = path;
    t.socket_fd = BindSocket(path);
    if (t.socket_fd < 0) {
      const std::string err = std::strerror(errno);
      tenants_.erase(req->name());
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("cannot bind ", path, ": ", err));
    }
  }
  t.quota = quota;
  t.priority = req->priority();
  resp->set_name(req->name());
  resp->set_tenant(t.id);
  resp->set_socket_path(answer_socket_.empty() ? t.socket_path : answer_socket_);
  resp->set_created(created);
  *resp->mutable_quota() = quota;
  return grpc::Status::OK;
}

grpc::Status FakeGpumemd::DeleteTenant(grpc::ServerContext*, const v1::DeleteTenantRequest* req,
                                       v1::DeleteTenantResponse* resp) {
  absl::MutexLock l(&mu_);
  calls_.push_back({"DeleteTenant", Text(*req)});
  auto it = tenants_.find(req->name());
  if (it == tenants_.end()) {
    resp->set_existed(false);
    return grpc::Status::OK;
  }
  uint64_t held = 0;
  for (const auto& [index, bytes] : it->second.used) held += bytes;
  if (held > 0 && !req->end_sessions()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("tenant ", req->name(), " holds ", held, " bytes"));
  }
  resp->set_existed(true);
  if (held > 0) {
    resp->set_sessions_ended(1);
    resp->set_allocations_freed(it->second.used.size());
  }
  if (it->second.socket_fd >= 0) {
    close(it->second.socket_fd);
    unlink(it->second.socket_path.c_str());
  }
  tenants_.erase(it);
  return grpc::Status::OK;
}

}  // namespace testing
}  // namespace dra
}  // namespace gpumem
