// TenantDirectory: which tenant a caller belongs to: from the kernel's
// uid/gid, as the config says, or the tenant whose own socket it came
// through; TenantDirectoryHolder: the directory in force, replaced whole
// when SIGHUP reloads the config or a socket tenant is put or deleted.
//
// Invariants: a TenantDirectory is immutable once built, so Resolve needs
// no lock; a directory that builds has a valid tenant section; tenant ids
// (what slabs, the quota book and GetStats key on; the ledger keys on
// names) are for this daemon's life and never reused, not even when a
// removed tenant's name comes back; no two tenants share a socket or its
// directory, nor has one's directory inside another's; a
// caller through a tenant's socket is that tenant, whatever its uid, and the
// main socket never resolves to a tenant made at run time.
#ifndef GPUMEMD_SERVER_TENANTS_TENANT_DIRECTORY_H_
#define GPUMEMD_SERVER_TENANTS_TENANT_DIRECTORY_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/placement/device_view.h"
#include "server/tenants/tenant.h"

namespace gpumem {
namespace tenants {

class TenantDirectory {
 public:
  // No tenants: each uid is its own tenant ("uid-1000", id = uid), no quota,
  // priority 0.
  TenantDirectory() = default;

  // Checks the whole tenant section and refuses (INVALID_ARGUMENT naming the
  // config file and line) a uid or gid listed under two tenants, two
  // tenants of one name, an empty name, an unknown device in a quota, a size
  // that does not parse (negative included), a negative max_allocations, or
  // a default_tenant that names no tenant. Each tenant's limit on waiting
  // requests is its own max_waiting_requests, else the config's, else
  // kDefaultMaxWaitingRequests; its limit on live sessions its own
  // max_sessions, else the config's max_sessions_per_tenant, else none.
  // At start, ids are 1..N in config order.

  // `locations` (may be null) is the parse tree the config was read with, for
  // line numbers in errors; `config_path` names the file in them.
  // `previous` (may be null): the directory in force, when reloading: the
  // id of every tenant it still has by name is kept, and each new name gets
  // an id above every id `previous` ever gave (next_id()); removed tenants
  // are remembered (retired()) so that their live allocations keep their
  // name until freed. When either has no
  // tenants configured there are no ids to keep: the result is as at start
  // (ids 1..N; the daemon does not switch between one tenant per uid and
  // configured tenants on reload, see server/config/reloadable.h).
  // `socket_dir` (the daemon's tenant_socket_dir, normalized) is where
  // TenantConfig.socket paths resolve (server/tenants/socket_path.h); when
  // empty, config.tenant_socket_dir(), which a tenant with a socket then
  // needs. The tenants `previous` made at run time are kept.
  static absl::StatusOr<TenantDirectory> Build(
      const v1::DaemonConfig& config,
      const google::protobuf::TextFormat::ParseInfoTree* locations,
      absl::string_view config_path,
      const std::vector<placement::DeviceView>& devices,
      const TenantDirectory* previous = nullptr, absl::string_view socket_dir = "");

  // A main-socket caller's tenant, by uid and gid. With tenants configured:
  // a uid listed by a tenant resolves to it; else the caller's primary gid;
  // else default_tenant; else PERMISSION_DENIED naming the uid. Root is
  // treated like any other uid. Without configured tenants, uids from
  // kFirstRuntimeTenantId (2^31) up are refused, so a uid's tenant id never
  // meets a runtime tenant's.
  absl::StatusOr<TenantRef> Resolve(uid_t uid, gid_t gid) const;
  // A caller's tenant: through tenant `socket_tenant`'s socket, that
  // tenant (PERMISSION_DENIED once it is removed); through the main socket
  // (socket_tenant 0), Resolve(uid, gid).
  absl::StatusOr<TenantRef> ResolveCaller(uid_t uid, gid_t gid, uint32_t socket_tenant) const;

  // A socket tenant as PutTenant asks for it; `socket` already resolved
  // (server/tenants/socket_path.h).
  struct SocketTenantSpec {
    std::string name;
    int32_t priority = 0;
    Quota quota;
    std::string socket;
    SocketAccess access;  // who may connect (replaces the old one on an update)
  };
  // This directory with a socket tenant made at run time (ids from
  // kFirstRuntimeTenantId up, never reused, in either mode; a reload keeps
  // them, with their sockets and quotas, unless the new config defines a
  // tenant of one's name, which refuses the reload): `spec.name` is
  // added with a new id, or, if this directory made it at run time already,
  // updated (quota, priority, socket access; same id; its socket must be
  // the same).
  // FAILED_PRECONDITION when the config defines a tenant of that name or
  // the existing one has another socket; ALREADY_EXISTS when another
  // tenant has that socket, or its socket's directory is the same as, or
  // inside or around, this one's; RESOURCE_EXHAUSTED when no id is left.
  absl::StatusOr<TenantDirectory> WithSocketTenant(const SocketTenantSpec& spec) const;
  // This directory without the runtime tenant `id` (remembered as retired,
  // so its name stays known). Unchanged if it has no such runtime tenant.
  TenantDirectory Without(uint32_t id) const;

  // Whether the config defines tenants (tenants made at run time do not
  // count: without configured ones each uid is still its own tenant).
  bool configured() const { return config_count_ > 0; }
  // Every tenant: the configured ones in config order, then those made at
  // run time.
  const std::vector<Tenant>& tenants() const { return tenants_; }
  // A configured tenant by name or id, or null (removed tenants included).
  const Tenant* Find(absl::string_view name) const;
  const Tenant* FindId(uint32_t id) const;
  // The id of the configured tenant named `name` ("uid-N" when not
  // configured); nullopt for a removed tenant.
  std::optional<uint32_t> IdOf(absl::string_view name) const;
  // The name of tenant `id`: configured, removed by a reload (retired), or
  // "uid-N" when not configured.
  std::string NameOf(uint32_t id) const;
  // Tenants removed by reloads during this daemon's life: id -> name.
  const absl::flat_hash_map<uint32_t, std::string>& retired() const { return retired_; }
  // The id the next new tenant gets (above every id ever given).
  uint32_t next_id() const { return next_id_; }

 private:
  // Rebuilds by_id_ from tenants_.
  void Reindex();
  TenantRef RefOf(const Tenant& t) const;

  std::vector<Tenant> tenants_;
  size_t config_count_ = 0;  // tenants_[0, config_count_) are the config's
  absl::flat_hash_map<uid_t, uint32_t> by_uid_;  // -> index into tenants_
  absl::flat_hash_map<gid_t, uint32_t> by_gid_;
  absl::flat_hash_map<uint32_t, uint32_t> by_id_;  // tenant id -> index
  absl::flat_hash_map<uint32_t, std::string> retired_;
  uint32_t next_id_ = 1;
  uint32_t next_runtime_id_ = kFirstRuntimeTenantId;
  int default_index_ = -1;
  // The daemon's limit on waiting requests per tenant (uid tenants too).
  uint32_t max_waiting_requests_ = kDefaultMaxWaitingRequests;
  // The daemon's limit on live sessions per tenant (0: none).
  uint32_t max_sessions_ = 0;
};

// The directory in force. Get is a shared_ptr copy under a small lock; a
// request takes one snapshot and resolves with it, holding no lock, and a
// Replace never waits for readers (they keep the old snapshot).
class TenantDirectoryHolder {
 public:
  explicit TenantDirectoryHolder(TenantDirectory initial)
      : current_(std::make_shared<const TenantDirectory>(std::move(initial))) {}

  std::shared_ptr<const TenantDirectory> Get() const {
    absl::MutexLock lock(&mu_);
    return current_;
  }
  void Replace(TenantDirectory next) {
    auto fresh = std::make_shared<const TenantDirectory>(std::move(next));
    absl::MutexLock lock(&mu_);
    current_.swap(fresh);  // the old one is freed below, outside the lock
  }
  // Held by whoever changes the directory (a reload, PutTenant,
  // DeleteTenant) from reading the one in force (Get) to replacing it, so no
  // change is lost to another made at the same time. Readers never take it.
  absl::Mutex& changes() const { return changes_; }

 private:
  mutable absl::Mutex changes_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TenantDirectory> current_ ABSL_GUARDED_BY(mu_);
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
