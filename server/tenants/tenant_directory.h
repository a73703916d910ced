// TenantDirectory: which tenant a caller belongs to, from the kernel's
// uid/gid, as the config says.
//
// Guarantees:
//  - Built once at start from the config; immutable afterwards, so Resolve
//    needs no lock. Building it checks the whole tenant section and refuses
//    (INVALID_ARGUMENT naming the config file and line) a uid or gid listed
//    under two tenants, two tenants of one name, an empty name, an unknown
//    device in a quota, a size that does not parse (negative included), a
//    negative max_allocations, or a default_tenant that names no tenant.
//  - With tenants configured: a uid listed by a tenant resolves to it; else
//    the caller's primary gid; else default_tenant; else PERMISSION_DENIED
//    naming the uid. Root is treated like any other uid.
//  - With no tenants: each uid is its own tenant ("uid-1000", id = uid), no
//    quota, priority 0.
#ifndef GPUMEMD_SERVER_TENANTS_TENANT_DIRECTORY_H_
#define GPUMEMD_SERVER_TENANTS_TENANT_DIRECTORY_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/placement/device_view.h"
#include "server/tenants/tenant.h"

namespace gpumem {
namespace tenants {

// Who a caller is charged as.
struct TenantRef {
  uint32_t id = 0;
  std::string name;
  int32_t priority = 0;
};

class TenantDirectory {
 public:
  // No tenants: each uid its own.
  TenantDirectory() = default;

  // `locations` (may be null) is the parse tree the config was read with, for
  // line numbers in errors; `config_path` names the file in them.
  static absl::StatusOr<TenantDirectory> Build(
      const v1::DaemonConfig& config,
      const google::protobuf::TextFormat::ParseInfoTree* locations,
      absl::string_view config_path,
      const std::vector<placement::DeviceView>& devices);

  absl::StatusOr<TenantRef> Resolve(uid_t uid, gid_t gid) const;

  bool configured() const { return !tenants_.empty(); }
  // The configured tenants, id order (empty when not configured).
  const std::vector<Tenant>& tenants() const { return tenants_; }
  // A configured tenant by name, or null.
  const Tenant* Find(absl::string_view name) const;
  // The id of the tenant named `name` ("uid-N" when not configured).
  std::optional<uint32_t> IdOf(absl::string_view name) const;
  // The name of tenant `id` (configured, or "uid-N").
  std::string NameOf(uint32_t id) const;

 private:
  std::vector<Tenant> tenants_;
  absl::flat_hash_map<uid_t, uint32_t> by_uid_;  // -> index into tenants_
  absl::flat_hash_map<gid_t, uint32_t> by_gid_;
  int default_index_ = -1;
};

// A device selector (index or UUID, any case) to its index, or
// INVALID_ARGUMENT naming it.
absl::StatusOr<uint32_t> ResolveDeviceSelector(
    absl::string_view selector, const std::vector<placement::DeviceView>& devices);

// Parses a config text keeping field locations for TenantDirectory::Build.
absl::Status ParseConfigText(absl::string_view text, absl::string_view path,
                             v1::DaemonConfig* config,
                             google::protobuf::TextFormat::ParseInfoTree* locations);

}  // namespace tenants
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_TENANTS_TENANT_DIRECTORY_H_
