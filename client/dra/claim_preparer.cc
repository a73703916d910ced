// Prepare = Plan (read the claim, check it against this node) + Make (the
// directory, the tenant, the spec), with the plan recorded before Make so a
// crash in between is visible to the next run; Undo is Make backwards and
// tolerates each piece being gone already.
#include "client/dra/claim_preparer.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/dra/atomic_file.h"
#include "client/dra/log.h"
#include "client/dra/node_devices.h"
#include "client/dra/quantity.h"

namespace gpumem {
namespace dra {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  return ctx;
}

// An absolute path with no empty, "." or ".." component and no trailing '/'.
bool IsNormalAbsolute(absl::string_view p) {
  if (p.size() < 2 || p[0] != '/' || p.back() == '/') return false;
  for (absl::string_view part : absl::StrSplit(p.substr(1), '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

std::string BaseName(const std::string& p) { return p.substr(p.rfind('/') + 1); }

std::string ClaimPath(const ClaimRef& r) {
  return absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", r.ns, "/resourceclaims/", r.name);
}

// Namespaces and names are DNS labels/subdomains: nothing that could
// change the request path.
absl::Status ValidatePathPart(absl::string_view what, absl::string_view v) {
  for (char c : v) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrCat("claim ", what, " \"", v,
                                                     "\" is not a Kubernetes name"));
    }
  }
  if (v == "." || v == "..") return absl::InvalidArgumentError(absl::StrCat("claim ", what, " \"", v, "\""));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePreparerConfig(const PreparerConfig& c) {
  if (c.driver.empty() || c.pool.empty()) {
    return absl::InvalidArgumentError("the driver name and node name must be set");
  }
  for (const auto& [flag, dir] : {std::pair<const char*, std::string>{"claims_dir", c.claims_dir},
                                  {"cdi_dir", c.cdi.dir},
                                  {"container_socket", c.cdi.container_socket}}) {
    if (!IsNormalAbsolute(dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, "=", dir, ": must be an absolute path without '.', '..' or '//'"));
    }
  }
  if (std::count(c.cdi.container_socket.begin(), c.cdi.container_socket.end(), '/') < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--container_socket=", c.cdi.container_socket,
        ": must be a file inside a directory (the directory is the mount point)"));
  }
  return absl::OkStatus();
}

ClaimPreparer::ClaimPreparer(PreparerConfig config, const ApiServer* api,
                             v1::GpuMemory::StubInterface* gpumemd, PluginState* state)
    : config_(std::move(config)), api_(api), gpumemd_(gpumemd), state_(state) {}

std::string ClaimPreparer::CdiDeviceId(const std::string& uid) const {
  return dra::CdiDeviceId(config_.cdi, uid);
}

absl::StatusOr<PreparedClaim> ClaimPreparer::Plan(const ClaimRef& ref) {
  absl::StatusOr<std::string> body = api_->Get(ClaimPath(ref));
  if (!body.ok()) {
    return absl::Status(body.status().code(),
                        absl::StrCat("cannot read claim ", ref.ns, "/", ref.name,
                                     " from the API server: ", body.status().message()));
  }
  absl::StatusOr<ClaimAllocation> alloc = ParseClaim(*body, ref, config_.driver, config_.pool);
  if (!alloc.ok()) return alloc.status();

  v1::GetStatsRequest req;
  v1::GetStatsResponse stats;
  const grpc::Status gs = gpumemd_->GetStats(Context(config_.gpumemd_timeout).get(), req, &stats);
  if (!gs.ok()) return FromGrpc(gs, "gpumemd GetStats");
  const std::vector<NodeDevice> devices = DevicesFromStats(stats);
  absl::flat_hash_map<std::string, const NodeDevice*> by_name;
  std::vector<std::string> names;
  for (const NodeDevice& d : devices) {
    by_name[d.name] = &d;
    names.push_back(d.name);
  }

  PreparedClaim plan;
  plan.ns = ref.ns;
  plan.name = ref.name;
  plan.uid = ref.uid;
  plan.tenant = absl::StrCat(kClaimTenantPrefix, ref.uid);
  plan.socket_dir = absl::StrCat(config_.claims_dir, "/", plan.tenant);
  plan.cdi_spec = CdiSpecPath(config_.cdi, ref.uid);
  plan.cdi_device = CdiDeviceId(ref.uid);
  absl::flat_hash_map<std::string, uint64_t> per_device;
  for (const AllocatedDevice& a : alloc->devices) {
    auto it = by_name.find(a.device);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "claim ", ref.ns, "/", ref.name, " is allocated device \"", a.device,
          "\", which gpumemd on this node does not have (it has: ",
          names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
    }
    const NodeDevice& d = *it->second;
    // Without consumedCapacity the scheduler gave the whole device.
    const uint64_t bytes = a.bytes.value_or(d.total_bytes);
    uint64_t& sum = per_device[d.name];
    sum += bytes;
    if (sum > d.total_bytes || sum < bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "claim ", ref.ns, "/", ref.name, " asks for ", FormatQuantityBytes(sum), " on ",
          d.name, ", which has ", FormatQuantityBytes(d.total_bytes)));
    }
    plan.devices.push_back({a.request, a.pool, a.device, d.uuid, bytes});
  }
  return plan;
}

absl::StatusOr<v1::PutTenantResponse> ClaimPreparer::PutTenant(const PreparedClaim& c) {
  v1::PutTenantRequest req;
  req.set_name(c.tenant);
  req.set_socket_path(absl::StrCat(c.socket_dir, "/", BaseName(config_.cdi.container_socket)));
  absl::flat_hash_map<std::string, uint64_t> per_uuid;
  std::vector<std::string> order;
  uint64_t total = 0;
  for (const PreparedDevice& d : c.devices) {
    if (!per_uuid.contains(d.uuid)) order.push_back(d.uuid);
    per_uuid[d.uuid] += d.bytes;
    total += d.bytes;
  }
  v1::Quota* q = req.mutable_quota();
  q->set_total_bytes(total);
  for (const std::string& uuid : order) {
    v1::DeviceQuota* dq = q->add_devices();
    dq->set_device(uuid);
    dq->set_bytes(per_uuid[uuid]);
  }
  v1::PutTenantResponse resp;
  const grpc::Status s = gpumemd_->PutTenant(Context(config_.gpumemd_timeout).get(), req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("gpumemd PutTenant ", c.tenant));
  // The socket must be the one asked for: inside the claims directory, in
  // the claim's own subdirectory. Anything else would mount another
  // tenant's socket, or a path nobody vetted, into the claim's containers.
  const std::string prefix = config_.claims_dir + "/";
  if (!IsNormalAbsolute(resp.socket_path()) || !absl::StartsWith(resp.socket_path(), prefix)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gpumemd put tenant ", c.tenant, "'s socket at ", resp.socket_path(),
        ", outside the claims directory ", config_.claims_dir,
        " (is gpumemd's tenant_socket_dir the plugin's --claims_dir?)"));
  }
  if (resp.socket_path() != req.socket_path()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gpumemd put tenant ", c.tenant, "'s socket at ", resp.socket_path(), ", not at ",
        req.socket_path(), " as asked"));
  }
  struct stat st;
  if (lstat(resp.socket_path().c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gpumemd answered tenant ", c.tenant, "'s socket ", resp.socket_path(),
        ", but there is no socket there (does this plugin see gpumemd's claims directory at the "
        "same path?)"));
  }
  return resp;
}

absl::Status ClaimPreparer::CloseClaimsDir() const {
  struct stat st;
  if (lstat(config_.claims_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
      st.st_uid == geteuid() && (st.st_mode & 07777) != 0700 &&
      chmod(config_.claims_dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make the claims directory ", config_.claims_dir, " mode 0700: ",
        std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ClaimPreparer::Make(PreparedClaim* c) {
  if (absl::Status closed = CloseClaimsDir(); !closed.ok()) return closed;
  struct stat st;
  // The claim's socket directory: only its tenant's socket goes there, and
  // it is what the containers get mounted.
  if (mkdir(c->socket_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create ", c->socket_dir, ": ", std::strerror(errno),
        " (--claims_dir must be gpumemd's tenant_socket_dir, shared with this plugin)"));
  }
  if (lstat(c->socket_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(c->socket_dir, " exists and is not a directory"));
  }
  absl::StatusOr<v1::PutTenantResponse> put = PutTenant(*c);
  if (!put.ok()) return put.status();
  c->socket = put->socket_path();
  const nlohmann::json spec = CdiSpec(config_.cdi, c->uid, c->socket_dir);
  if (absl::Status s = WriteFileAtomically(c->cdi_spec, spec.dump(2) + "\n", 0644); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot write the CDI spec: ", s.message()));
  }
  c->phase = PreparedClaim::Phase::kPrepared;
  return state_->Put(*c);
}

absl::Status ClaimPreparer::Reassert(const PreparedClaim& c) {
  if (absl::Status closed = CloseClaimsDir(); !closed.ok()) return closed;
  absl::StatusOr<v1::PutTenantResponse> put = PutTenant(c);
  if (!put.ok()) return put.status();
  if (put->created()) {
    Log("tenant ", c.tenant, " of prepared claim ", c.ns, "/", c.name,
        " was missing in gpumemd and is made again");
  }
  struct stat st;
  if (stat(c.cdi_spec.c_str(), &st) != 0) {
    const nlohmann::json spec = CdiSpec(config_.cdi, c.uid, c.socket_dir);
    if (absl::Status s = WriteFileAtomically(c.cdi_spec, spec.dump(2) + "\n", 0644); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("cannot write the CDI spec: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status ClaimPreparer::Undo(const PreparedClaim& c) {
  v1::DeleteTenantRequest req;
  req.set_name(c.tenant);
  req.set_end_sessions(true);
  v1::DeleteTenantResponse resp;
  const grpc::Status s = gpumemd_->DeleteTenant(Context(config_.gpumemd_timeout).get(), req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("gpumemd DeleteTenant ", c.tenant));
  if (resp.sessions_ended() > 0) {
    Log("claim ", c.ns, "/", c.name, ": ended ", resp.sessions_ended(), " session(s), freed ",
        resp.allocations_freed(), " allocation(s)");
  }
  // gpumemd removes the tenant's socket; one left behind (an older daemon,
  // a crash) must not outlive the tenant.
  const std::string socket = absl::StrCat(c.socket_dir, "/", BaseName(config_.cdi.container_socket));
  struct stat st;
  if (lstat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(socket.c_str());
  if (rmdir(c.socket_dir.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove ", c.socket_dir, ": ", std::strerror(errno)));
  }
  if (absl::Status r = RemoveFileDurably(c.cdi_spec); !r.ok()) return r;
  return state_->Remove(c.uid);
}

absl::StatusOr<std::vector<PreparedDevice>> ClaimPreparer::Prepare(const ClaimRef& ref) {
  if (absl::Status s = ValidateClaimRef(ref); !s.ok()) return s;
  if (absl::Status s = ValidatePathPart("namespace", ref.ns); !s.ok()) return s;
  if (absl::Status s = ValidatePathPart("name", ref.name); !s.ok()) return s;
  {
    absl::MutexLock l(&ops_mu_);
    std::optional<PreparedClaim> known = state_->Find(ref.uid);
    if (known && known->phase == PreparedClaim::Phase::kPrepared) {
      if (absl::Status s = Reassert(*known); !s.ok()) return s;
      return known->devices;
    }
    if (known) {  // PREPARING: a run before this one stopped halfway
      PreparedClaim c = *known;
      absl::Status s = Make(&c);
      if (s.ok()) return c.devices;
      if (absl::Status u = Undo(c); !u.ok()) {
        Log("claim ", ref.ns, "/", ref.name, ": cleanup after a failed prepare failed: ", u.ToString());
      }
      return s;
    }
  }
  // A new claim: read it without holding up other claims.
  absl::StatusOr<PreparedClaim> plan = Plan(ref);
  if (!plan.ok()) return plan.status();
  absl::MutexLock l(&ops_mu_);
  if (std::optional<PreparedClaim> known = state_->Find(ref.uid)) {
    // Prepared by a concurrent call meanwhile.
    if (known->phase == PreparedClaim::Phase::kPrepared) return known->devices;
  }
  if (absl::Status s = state_->Put(*plan); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot record the claim in the state file: ",
                                               s.message()));
  }
  PreparedClaim c = *plan;
  absl::Status s = Make(&c);
  if (s.ok()) {
    Log("prepared claim ", ref.ns, "/", ref.name, " (", ref.uid, "): tenant ", c.tenant, ", socket ",
        c.socket);
    return c.devices;
  }
  if (absl::Status u = Undo(c); !u.ok()) {
    Log("claim ", ref.ns, "/", ref.name, ": cleanup after a failed prepare failed (kept in ",
        state_->path(), " for the next try): ", u.ToString());
  }
  return s;
}

absl::Status ClaimPreparer::Unprepare(const ClaimRef& ref) {
  if (absl::Status s = ValidateClaimRef(ref); !s.ok()) return s;
  absl::MutexLock l(&ops_mu_);
  std::optional<PreparedClaim> known = state_->Find(ref.uid);
  if (!known) return absl::OkStatus();
  if (absl::Status s = Undo(*known); !s.ok()) return s;
  Log("unprepared claim ", known->ns, "/", known->name, " (", ref.uid, ")");
  return absl::OkStatus();
}

}  // namespace dra
}  // namespace gpumem
