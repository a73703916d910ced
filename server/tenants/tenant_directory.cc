// Config checks name the line through the ParseInfoTree the text was parsed
// with; a config built in code (tests) has none and names the field only.
#include "server/tenants/tenant_directory.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "server/tenants/socket_path.h"

namespace gpumem {
namespace tenants {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::TextFormat;

const FieldDescriptor* Field(const google::protobuf::Message& m, const char* name) {
  return m.GetDescriptor()->FindFieldByName(name);
}

// "FILE:LINE: " for field `name` (element `index` if repeated) of the message
// whose parse tree is `tree`; "FILE: " when unknown.
std::string Where(absl::string_view path, const TextFormat::ParseInfoTree* tree,
                  const google::protobuf::Message& m, const char* name, int index) {
  if (tree != nullptr) {
    TextFormat::ParseLocation loc = tree->GetLocation(Field(m, name), index);
    if (loc.line >= 0) return absl::StrCat(path, ":", loc.line + 1, ": ");
  }
  return absl::StrCat(path.empty() ? "config" : path, ": ");
}

const TextFormat::ParseInfoTree* Nested(const TextFormat::ParseInfoTree* tree,
                                        const google::protobuf::Message& m,
                                        const char* name, int index) {
  if (tree == nullptr) return nullptr;
  return tree->GetTreeForNested(Field(m, name), index);
}

// The words after a socket's path when its directory and that of tenant
// `other`'s socket `other_socket` overlap (SocketDirsOverlap).
std::string DirClash(absl::string_view other_socket, absl::string_view other) {
  return absl::StrCat(" would share a directory with tenant \"", other, "\"'s socket ",
                      other_socket, " (", SocketDirOf(other_socket),
                      "): each tenant's socket has a directory of its own, neither inside "
                      "another's nor holding one");
}

}  // namespace

absl::StatusOr<uint32_t> ResolveDeviceSelector(
    absl::string_view selector, const std::vector<placement::DeviceView>& devices) {
  uint32_t index = 0;
  if (absl::SimpleAtoi(selector, &index)) {
    if (index < devices.size()) return index;
  } else {
    for (const placement::DeviceView& d : devices) {
      if (absl::EqualsIgnoreCase(d.uuid, selector)) return d.index;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no device \"", selector, "\"; devices are 0..",
      devices.empty() ? 0 : devices.size() - 1, " or their UUIDs"));
}

absl::Status ParseConfigText(absl::string_view text, absl::string_view path,
                             v1::DaemonConfig* config,
                             TextFormat::ParseInfoTree* locations) {
  // The parser reports its complaint with the line on stderr, before ours.
  TextFormat::Parser parser;
  parser.WriteLocationsTo(locations);
  if (!parser.ParseFromString(std::string(text), config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config ", path, " is not a valid gpumem.v1.DaemonConfig textproto "
        "(the parser's complaint, with its line, is above)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TenantDirectory> TenantDirectory::Build(
    const v1::DaemonConfig& config, const TextFormat::ParseInfoTree* locations,
    absl::string_view path, const std::vector<placement::DeviceView>& devices,
    const TenantDirectory* previous, absl::string_view socket_dir) {
  if (socket_dir.empty()) socket_dir = config.tenant_socket_dir();
  TenantDirectory dir;
  absl::flat_hash_map<std::string, std::string> socket_owner;  // path -> tenant
  // Ids: kept by name from a configured `previous`, new ones above all it
  // ever gave. Without one, 1..N in config order.
  const bool carry =
      previous != nullptr && previous->configured() && config.tenant_size() > 0;
  if (carry) {
    dir.next_id_ = previous->next_id_;
    dir.retired_ = previous->retired_;
  }
  if (config.max_waiting_requests() > 0) {
    dir.max_waiting_requests_ = config.max_waiting_requests();
  }
  dir.max_sessions_ = config.max_sessions_per_tenant();
  absl::flat_hash_map<std::string, uint32_t> by_name;
  for (int i = 0; i < config.tenant_size(); ++i) {
    const v1::TenantConfig& tc = config.tenant(i);
    const TextFormat::ParseInfoTree* tree = Nested(locations, config, "tenant", i);
    const std::string at = Where(path, locations, config, "tenant", i);
    Tenant t;
    t.name = tc.name();
    t.priority = tc.priority();
    t.max_waiting_requests = tc.max_waiting_requests() > 0 ? tc.max_waiting_requests()
                                                           : dir.max_waiting_requests_;
    t.max_sessions = tc.max_sessions() > 0 ? tc.max_sessions() : dir.max_sessions_;
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(at, "tenant ", i + 1, " has no name"));
    }
    if (!by_name.emplace(t.name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path, tree, tc, "name", -1), "tenant \"", t.name, "\" is defined twice"));
    }
    for (int u = 0; u < tc.uids_size(); ++u) {
      auto [it, fresh] = dir.by_uid_.emplace(tc.uids(u), i);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path, tree, tc, "uids", u), "uid ", tc.uids(u), " is listed by tenant \"",
            config.tenant(it->second).name(), "\" and by tenant \"", t.name, "\""));
      }
      t.uids.push_back(tc.uids(u));
    }
    for (int g = 0; g < tc.gids_size(); ++g) {
      auto [it, fresh] = dir.by_gid_.emplace(tc.gids(g), i);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path, tree, tc, "gids", g), "gid ", tc.gids(g), " is listed by tenant \"",
            config.tenant(it->second).name(), "\" and by tenant \"", t.name, "\""));
      }
      t.gids.push_back(tc.gids(g));
    }
    const v1::QuotaConfig& qc = tc.quota();
    const TextFormat::ParseInfoTree* qtree = Nested(tree, tc, "quota", -1);
    if (!qc.total_bytes().empty()) {
      absl::StatusOr<uint64_t> total = ParseByteSize(qc.total_bytes());
      if (!total.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path, qtree, qc, "total_bytes", -1), "tenant \"", t.name,
            "\": quota total_bytes: ", total.status().message()));
      }
      t.quota.total_bytes = *total;
    }
    if (qc.max_allocations() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path, qtree, qc, "max_allocations", -1), "tenant \"", t.name,
          "\": quota max_allocations must be >= 0, not ", qc.max_allocations()));
    }
    if (qc.max_allocations() > 0) t.quota.max_allocations = qc.max_allocations();
    if (!tc.socket().empty()) {
      const std::string sat = Where(path, tree, tc, "socket", -1);
      absl::Status dir_ok = socket_dir.empty()
                                ? absl::InvalidArgumentError("tenant_socket_dir is not set")
                                : CheckSocketDir(socket_dir);
      if (!dir_ok.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            sat, "tenant \"", t.name, "\" has a socket, but ", dir_ok.message()));
      }
      absl::StatusOr<std::string> socket = ResolveSocketPath(tc.socket(), socket_dir, t.name);
      if (!socket.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(sat, "tenant \"", t.name, "\": ", socket.status().message()));
      }
      for (const auto& [other_socket, other] : socket_owner) {
        if (other_socket == *socket) {
          return absl::InvalidArgumentError(absl::StrCat(
              sat, "tenant \"", t.name, "\": socket ", *socket, " is tenant \"", other,
              "\"'s already"));
        }
        if (SocketDirsOverlap(other_socket, *socket)) {
          return absl::InvalidArgumentError(absl::StrCat(
              sat, "tenant \"", t.name, "\": socket ", *socket, DirClash(other_socket, other)));
        }
      }
      socket_owner.emplace(*socket, t.name);
      t.socket = *std::move(socket);
      t.socket_access = DefaultSocketAccess(
          t.uids, t.gids,
          tc.has_socket_uid() ? std::optional<uint32_t>(tc.socket_uid()) : std::nullopt,
          tc.has_socket_gid() ? std::optional<uint32_t>(tc.socket_gid()) : std::nullopt);
      if (!tc.socket_mode().empty()) {
        absl::StatusOr<uint32_t> mode = ParseSocketMode(tc.socket_mode(), "socket_mode");
        if (!mode.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(path, tree, tc, "socket_mode", -1), "tenant \"", t.name, "\": ",
              mode.status().message()));
        }
        t.socket_access.mode = *mode;
      }
    } else if (tc.has_socket_uid() || tc.has_socket_gid() || !tc.socket_mode().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path, tree, tc, tc.has_socket_uid()   ? "socket_uid"
                                : tc.has_socket_gid() ? "socket_gid"
                                                      : "socket_mode", -1),
          "tenant \"", t.name, "\" has socket_uid/socket_gid/socket_mode but no socket"));
    }
    t.quota.device_bytes.resize(devices.size());
    for (int d = 0; d < qc.device_size(); ++d) {
      const v1::DeviceQuotaConfig& dq = qc.device(d);
      const std::string dat = Where(path, qtree, qc, "device", d);
      absl::StatusOr<uint32_t> index = ResolveDeviceSelector(dq.device(), devices);
      if (!index.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            dat, "tenant \"", t.name, "\": quota device: ", index.status().message()));
      }
      absl::StatusOr<uint64_t> bytes = ParseByteSize(dq.bytes());
      if (!bytes.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            dat, "tenant \"", t.name, "\": quota of device ", dq.device(), ": ",
            bytes.status().message()));
      }
      if (t.quota.device_bytes[*index].has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            dat, "tenant \"", t.name, "\": two quotas for device ", *index));
      }
      t.quota.device_bytes[*index] = *bytes;
    }
    dir.tenants_.push_back(std::move(t));
  }
  dir.config_count_ = dir.tenants_.size();
  // Socket tenants made at run time stay, with their ids and sockets, unless
  // the config now takes one's name or socket.
  if (previous != nullptr) {
    dir.next_runtime_id_ = previous->next_runtime_id_;
    for (const Tenant& old : previous->tenants_) {
      if (!old.runtime) continue;
      if (auto named = by_name.find(old.name); named != by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path, locations, config, "tenant", named->second), "tenant \"", old.name,
            "\" is a socket tenant made at run time (PutTenant): remove it with DeleteTenant "
            "first, or give the config's tenant another name"));
      }
      for (const auto& [socket, owner] : socket_owner) {
        if (!SocketDirsOverlap(socket, old.socket)) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path, locations, config, "tenant", by_name.at(owner)), "tenant \"", owner,
            "\": socket ", socket,
            socket == old.socket ? absl::StrCat(" is the socket of tenant \"", old.name, "\"")
                                 : DirClash(old.socket, old.name),
            " (made at run time by PutTenant)"));
      }
      dir.tenants_.push_back(old);
      dir.tenants_.back().max_waiting_requests = dir.max_waiting_requests_;
    }
  }
  // Ids once the section is known good (a refused build gives none away).
  for (uint32_t i = 0; i < dir.config_count_; ++i) {
    Tenant& t = dir.tenants_[i];
    const Tenant* kept = carry ? previous->Find(t.name) : nullptr;
    if (kept != nullptr) {
      t.id = kept->id;
    } else {
      // kNoTenant (UINT32_MAX) is the pool's "nobody": never a tenant id.
      if (dir.next_id_ >= UINT32_MAX - 1) {
        return absl::ResourceExhaustedError(absl::StrCat(
            path, ": tenant \"", t.name, "\": no tenant id left in this daemon's life "
            "(restart it to number tenants from 1 again)"));
      }
      t.id = dir.next_id_++;
    }
    if (t.id >= kFirstRuntimeTenantId) {
      return absl::ResourceExhaustedError(absl::StrCat(
          path, ": tenant \"", t.name, "\": no configured tenant id left below ",
          kFirstRuntimeTenantId, " in this daemon's life (restart it)"));
    }
  }
  dir.Reindex();
  if (carry) {
    for (const Tenant& old : previous->tenants_) {
      if (!dir.by_id_.contains(old.id)) dir.retired_[old.id] = old.name;
    }
  } else if (previous != nullptr) {
    // Runtime tenants removed earlier keep their names (their ids are in a
    // range of their own, the same in either mode).
    for (const auto& [id, name] : previous->retired_) {
      if (id >= kFirstRuntimeTenantId) dir.retired_[id] = name;
    }
  }
  if (!config.default_tenant().empty()) {
    auto it = by_name.find(config.default_tenant());
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path, locations, config, "default_tenant", -1), "default_tenant \"",
          config.default_tenant(), "\" names no tenant"));
    }
    dir.default_index_ = static_cast<int>(it->second);
  }
  return dir;
}

void TenantDirectory::Reindex() {
  by_id_.clear();
  for (uint32_t i = 0; i < tenants_.size(); ++i) by_id_[tenants_[i].id] = i;
}

TenantRef TenantDirectory::RefOf(const Tenant& t) const {
  return TenantRef{t.id, t.name, t.priority, t.max_waiting_requests, t.max_sessions};
}

absl::StatusOr<TenantRef> TenantDirectory::ResolveCaller(uid_t uid, gid_t gid,
                                                        uint32_t socket_tenant) const {
  if (socket_tenant == 0) return Resolve(uid, gid);
  const Tenant* t = FindId(socket_tenant);
  if (t == nullptr || t->socket.empty()) {
    auto r = retired_.find(socket_tenant);
    return absl::PermissionDeniedError(absl::StrCat(
        "this socket's tenant",
        r == retired_.end() ? std::string() : absl::StrCat(" \"", r->second, "\""),
        " was removed; its socket serves nobody"));
  }
  return RefOf(*t);
}

absl::StatusOr<TenantDirectory> TenantDirectory::WithSocketTenant(
    const SocketTenantSpec& spec) const {
  TenantDirectory next = *this;
  Tenant* same = nullptr;
  for (size_t i = 0; i < next.tenants_.size(); ++i) {
    Tenant& t = next.tenants_[i];
    if (t.name == spec.name) {
      if (i < config_count_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tenant \"", spec.name, "\" is defined in the daemon's config; PutTenant makes and "
            "changes only tenants of its own (edit the config and reload instead)"));
      }
      same = &t;
    } else if (!t.socket.empty() && t.socket == spec.socket) {
      return absl::AlreadyExistsError(absl::StrCat(
          "socket ", spec.socket, " is tenant \"", t.name, "\"'s"));
    } else if (!t.socket.empty() && SocketDirsOverlap(t.socket, spec.socket)) {
      return absl::AlreadyExistsError(
          absl::StrCat("socket ", spec.socket, DirClash(t.socket, t.name)));
    }
  }
  if (same != nullptr) {
    if (same->socket != spec.socket) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenant \"", spec.name, "\" has its socket at ", same->socket, ", not ", spec.socket,
          "; a socket tenant's socket does not move (DeleteTenant it, then PutTenant)"));
    }
    same->priority = spec.priority;
    same->quota = spec.quota;
    same->socket_access = spec.access;
    return next;
  }
  if (next.next_runtime_id_ >= UINT32_MAX - 1) {
    return absl::ResourceExhaustedError(
        "no socket tenant id left in this daemon's life (restart it to number them again)");
  }
  Tenant t;
  t.id = next.next_runtime_id_++;
  t.name = spec.name;
  t.priority = spec.priority;
  t.max_waiting_requests = max_waiting_requests_;
  t.quota = spec.quota;
  t.socket = spec.socket;
  t.socket_access = spec.access;
  t.runtime = true;
  next.retired_.erase(t.id);
  next.tenants_.push_back(std::move(t));
  next.Reindex();
  return next;
}

TenantDirectory TenantDirectory::Without(uint32_t id) const {
  TenantDirectory next = *this;
  for (size_t i = config_count_; i < next.tenants_.size(); ++i) {
    if (next.tenants_[i].id != id) continue;
    next.retired_[id] = next.tenants_[i].name;
    next.tenants_.erase(next.tenants_.begin() + static_cast<ptrdiff_t>(i));
    next.Reindex();
    break;
  }
  return next;
}

absl::StatusOr<TenantRef> TenantDirectory::Resolve(uid_t uid, gid_t gid) const {
  if (config_count_ == 0) {
    if (uid >= kFirstRuntimeTenantId) {
      return absl::PermissionDeniedError(absl::StrCat(
          "uid ", uid, " is in the range gpumemd keeps for socket tenants' ids (2^31 and up) "
          "while no tenants are configured; configure tenants to serve it"));
    }
    return TenantRef{uid, UidTenantName(uid), 0, max_waiting_requests_, max_sessions_};
  }
  int index = -1;
  if (auto it = by_uid_.find(uid); it != by_uid_.end()) {
    index = static_cast<int>(it->second);
  } else if (auto g = by_gid_.find(gid); g != by_gid_.end()) {
    index = static_cast<int>(g->second);
  } else {
    index = default_index_;
  }
  if (index < 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "uid ", uid, " (gid ", gid, ") belongs to no tenant in the daemon's config "
        "and there is no default_tenant"));
  }
  return RefOf(tenants_[index]);
}

const Tenant* TenantDirectory::Find(absl::string_view name) const {
  for (const Tenant& t : tenants_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const Tenant* TenantDirectory::FindId(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tenants_[it->second];
}

std::optional<uint32_t> TenantDirectory::IdOf(absl::string_view name) const {
  if (const Tenant* t = Find(name)) return t->id;
  if (configured()) return std::nullopt;
  std::optional<uint32_t> uid = UidOfTenantName(name);
  if (uid.has_value() && *uid >= kFirstRuntimeTenantId) return std::nullopt;
  return uid;
}

std::string TenantDirectory::NameOf(uint32_t id) const {
  if (const Tenant* t = FindId(id)) return t->name;
  if (auto r = retired_.find(id); r != retired_.end()) return r->second;
  if (!configured() && id < kFirstRuntimeTenantId) return UidTenantName(id);
  return absl::StrCat("tenant-", id);
}

}  // namespace tenants
}  // namespace gpumem
