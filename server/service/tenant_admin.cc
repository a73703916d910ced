#include "server/service/tenant_admin.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "server/service/quota_proto.h"
#include "server/service/tenant_socket_file.h"
#include "server/tenants/socket_path.h"

namespace gpumem {
namespace {

void ToProto(const ledger::LedgerEvent& e, v1::LedgerEvent* out) {
  out->set_seq(e.seq);
  out->set_time_unix_ns(e.time_ns);
  out->set_kind(std::string(ledger::KindName(e.kind)));
  out->set_tenant(e.tenant);
  out->set_uid(e.uid);
  out->set_pid(e.pid);
  out->set_session(e.session);
  out->set_device(e.device);
  out->set_bytes(e.bytes);
  out->set_allocation_id(e.allocation_id);
  out->set_detail(e.detail);
}

// A request's quota (devices by selector) as the tenant's, devices by index.
absl::StatusOr<tenants::Quota> QuotaFromProto(const v1::Quota& q,
                                              const std::vector<placement::DeviceView>& devices) {
  tenants::Quota quota;
  if (q.has_total_bytes()) quota.total_bytes = q.total_bytes();
  if (q.has_max_allocations()) quota.max_allocations = q.max_allocations();
  quota.device_bytes.resize(devices.size());
  for (const v1::DeviceQuota& dq : q.devices()) {
    absl::StatusOr<uint32_t> index = tenants::ResolveDeviceSelector(dq.device(), devices);
    if (!index.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("quota.devices: ", index.status().message()));
    }
    if (!dq.has_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "quota.devices: device ", dq.device(), " has no bytes"));
    }
    if (quota.device_bytes[*index]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "quota.devices: device ", *index, " is given twice"));
    }
    quota.device_bytes[*index] = dq.bytes();
  }
  return quota;
}

bool SameQuota(const tenants::Quota& a, const tenants::Quota& b) {
  if (a.total_bytes != b.total_bytes || a.max_allocations != b.max_allocations) return false;
  const size_t n = std::max(a.device_bytes.size(), b.device_bytes.size());
  for (uint32_t d = 0; d < n; ++d) {
    if (a.device_limit(d) != b.device_limit(d)) return false;
  }
  return true;
}

// Who a refused administrator call names.
std::string NotAdmin(const char* rpc, const PeerCred& caller) {
  if (caller.socket_tenant != 0) {
    return absl::StrCat(rpc, " is for root and the admin group; a caller through a tenant's "
                        "socket is that tenant, not an administrator");
  }
  return absl::StrCat(rpc, " is for root and the admin group; uid ", caller.uid, " is neither");
}

}  // namespace

std::string DescribeQuota(const tenants::Quota& quota) {
  std::vector<std::string> parts;
  if (quota.total_bytes) parts.push_back(absl::StrCat("total_bytes ", FormatBytes(*quota.total_bytes)));
  for (size_t d = 0; d < quota.device_bytes.size(); ++d) {
    if (quota.device_bytes[d]) {
      parts.push_back(absl::StrCat("device ", d, " ", FormatBytes(*quota.device_bytes[d])));
    }
  }
  if (quota.max_allocations) parts.push_back(absl::StrCat("max_allocations ", *quota.max_allocations));
  return parts.empty() ? "no limit" : absl::StrJoin(parts, "; ");
}


absl::StatusOr<v1::GetUsageResponse> TenantAdmin::GetUsage(const PeerCred& caller) const {
  const std::shared_ptr<const tenants::TenantDirectory> directory = directory_->Get();
  absl::StatusOr<tenants::TenantRef> self =
      directory->ResolveCaller(caller.uid, caller.gid, caller.socket_tenant);
  const bool admin = is_admin_(caller);
  if (!admin && !self.ok()) return self.status();
  // Which tenants: the configured ones and socket tenants (and, for an
  // administrator, removed ones still holding allocations), or (one tenant
  // per uid) those the ledger has seen; never others' for a non-admin.
  std::map<std::string, uint32_t> ids;  // name -> id
  for (const tenants::Tenant& t : directory->tenants()) ids[t.name] = t.id;
  if (directory->configured()) {
    if (admin) {
      for (const auto& [id, name] : directory->retired()) {
        // A name configured again is shown as the configured tenant.
        if (ids.count(name) > 0) continue;
        const quota::TenantHoldings held = quotas_->Holdings(id);
        if (held.allocations > 0 || held.total_bytes > 0) ids[name] = id;
      }
    }
  }
  const auto usage = ledger_->Usage();
  if (!directory->configured()) {
    for (const auto& [key, row] : usage) {
      // Not a tenant of this mode (e.g. an earlier config's): only in the ledger.
      if (std::optional<uint32_t> id = directory->IdOf(key.first)) ids[key.first] = *id;
    }
  }
  if (self.ok()) ids[self->name] = self->id;
  v1::GetUsageResponse out;
  for (const auto& [name, tenant_id] : ids) {
    if (!admin && name != self->name) continue;
    v1::TenantUsage* tu = out.add_tenants();
    tu->set_name(name);
    if (const tenants::Tenant* t = directory->FindId(tenant_id)) tu->set_priority(t->priority);
    const tenants::Quota quota = quotas_->GetQuota(tenant_id);
    if (!quota.unlimited()) QuotaToProto(quota, tu->mutable_quota());
    const quota::TenantHoldings held = quotas_->Holdings(tenant_id);
    const std::string& tenant_name = name;  // a lambda may not name a binding (C++17)
    auto row = [&](int32_t device) {
      auto it = usage.find({tenant_name, device});
      return it == usage.end() ? ledger::UsageRow{} : it->second;
    };
    const ledger::UsageRow all = row(ledger::UsageAccount::kAllDevices);
    tu->set_current_bytes(held.total_bytes);
    tu->set_peak_bytes(std::max(all.peak_bytes, held.total_bytes));
    tu->set_byte_seconds(all.byte_seconds);
    tu->set_allocation_count(held.allocations);
    for (const placement::DeviceView& d : devices_) {
      const ledger::UsageRow r = row(static_cast<int32_t>(d.index));
      const uint64_t now = d.index < held.device_bytes.size() ? held.device_bytes[d.index] : 0;
      v1::DeviceUsage* du = tu->add_devices();
      du->set_device_index(d.index);
      du->set_current_bytes(now);
      du->set_peak_bytes(std::max(r.peak_bytes, now));
      du->set_byte_seconds(r.byte_seconds);
    }
  }
  return out;
}

absl::StatusOr<v1::GetLedgerResponse> TenantAdmin::GetLedger(
    const PeerCred& caller, const v1::GetLedgerRequest& request) const {
  ledger::EventQuery q;
  q.tenant = request.tenant();
  if (!is_admin_(caller)) {
    absl::StatusOr<tenants::TenantRef> self =
        directory_->Get()->ResolveCaller(caller.uid, caller.gid, caller.socket_tenant);
    if (!self.ok()) return self.status();
    if (!q.tenant.empty() && q.tenant != self->name) {
      return absl::PermissionDeniedError(absl::StrCat(
          caller.socket_tenant != 0 ? std::string("this socket")
                                    : absl::StrCat("uid ", caller.uid),
          " is charged to tenant \"", self->name,
          "\" and may not read the ledger of tenant \"", q.tenant,
          "\" (root and the admin group only)"));
    }
    q.tenant = self->name;
  }
  if (request.since_unix_ns() < 0 || request.until_unix_ns() < 0) {
    return absl::InvalidArgumentError("since_unix_ns and until_unix_ns must be >= 0");
  }
  q.since_ns = request.since_unix_ns();
  q.until_ns = request.until_unix_ns();
  if (request.limit() > 10000) {
    return absl::InvalidArgumentError(absl::StrCat("limit ", request.limit(), " is above 10000"));
  }
  q.limit = request.limit() == 0 ? 1000 : request.limit();
  q.newest = request.newest();
  if (!request.page_token().empty() && !absl::SimpleAtoi(request.page_token(), &q.after_seq)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token \"", request.page_token(), "\" is not one this daemon gave"));
  }
  if (!ledger_->enabled()) return ledger_->Query(q).status();
  // Events appended before the call are readable; a failing disk only means
  // the answer stops at the last commit.
  ledger_->Flush().IgnoreError();
  absl::StatusOr<std::vector<ledger::LedgerEvent>> events = ledger_->Query(q);
  if (!events.ok()) return events.status();
  v1::GetLedgerResponse out;
  for (const ledger::LedgerEvent& e : *events) ToProto(e, out.add_events());
  if (!q.newest && events->size() == q.limit) {
    out.set_next_page_token(absl::StrCat(events->back().seq));
  }
  return out;
}

absl::StatusOr<v1::SetQuotaResponse> TenantAdmin::SetQuota(const PeerCred& caller,
                                                          const v1::SetQuotaRequest& request) {
  if (!is_admin_(caller)) return absl::PermissionDeniedError(NotAdmin("SetQuota", caller));
  const std::shared_ptr<const tenants::TenantDirectory> directory = directory_->Get();
  std::optional<uint32_t> id = directory->IdOf(request.tenant());
  if (!id) {
    return absl::NotFoundError(absl::StrCat(
        "no tenant \"", request.tenant(), "\"",
        directory->configured() ? " in the daemon's config"
                                : " (without tenants in the config, tenants are named uid-N)"));
  }
  absl::StatusOr<tenants::Quota> parsed = QuotaFromProto(request.quota(), devices_);
  if (!parsed.ok()) return parsed.status();
  const tenants::Quota& quota = *parsed;
  quotas_->SetQuota(*id, quota);
  const std::string words = DescribeQuota(quota);
  ledger::LedgerEvent e;
  e.time_ns = absl::GetCurrentTimeNanos();
  e.kind = ledger::EventKind::kQuotaSet;
  e.tenant = request.tenant();
  e.uid = caller.uid;
  e.pid = caller.pid;
  e.bytes = quota.total_bytes.value_or(0);
  e.detail = words;
  ledger_->Append(e);
  ledger::QuotaRow row;
  row.tenant = request.tenant();
  row.quota = quota;
  row.source = absl::StrCat("SetQuota by uid ", caller.uid);
  row.set_ns = e.time_ns;
  ledger_->SetQuota(std::move(row));
  if (quota_changed_) quota_changed_();
  v1::SetQuotaResponse out;
  QuotaToProto(quota, out.mutable_quota());
  return out;
}

absl::StatusOr<uint32_t> TenantAdmin::Put(const tenants::TenantDirectory::SocketTenantSpec& spec,
                                           bool record, const PeerCred& caller, bool* created) {
  tenants::TenantDirectoryHolder* holder = sockets_.directory;
  const std::shared_ptr<const tenants::TenantDirectory> in_force = holder->Get();
  const tenants::Tenant* existing = in_force->Find(spec.name);
  *created = existing == nullptr;
  absl::StatusOr<tenants::TenantDirectory> next = in_force->WithSocketTenant(spec);
  if (!next.ok()) return next.status();
  const tenants::Tenant* made = next->Find(spec.name);
  const uint32_t id = made->id;
  const bool changed =
      existing == nullptr || existing->priority != spec.priority || !SameQuota(existing->quota, spec.quota);
  const int64_t now = absl::GetCurrentTimeNanos();
  ledger::SocketTenantRow row;
  row.name = spec.name;
  row.socket = spec.socket;
  row.priority = spec.priority;
  row.total_bytes = spec.quota.total_bytes;
  row.max_allocations = spec.quota.max_allocations;
  for (uint32_t d = 0; d < devices_.size(); ++d) {
    if (std::optional<uint64_t> b = spec.quota.device_limit(d)) {
      row.device_bytes.emplace_back(devices_[d].uuid, *b);
    }
  }
  row.source = absl::StrCat("PutTenant by uid ", caller.uid);
  row.set_ns = now;
  if (existing != nullptr) {
    // Its socket is where it was; made again if it is not served (it could
    // not be made when the tenant was restored at start).
    if (sockets_.sockets->TenantSockets().count(id) == 0) {
      absl::Status added = MakeSocket(id, spec.socket, spec.access);
      if (!added.ok()) return added;
    } else if (existing->socket_access != spec.access) {
      absl::Status set = SetTenantSocketAccess(sockets_.socket_dir, spec.socket, spec.access.uid,
                                               spec.access.gid, spec.access.mode);
      if (!set.ok()) return set;
    }
    if (!changed && existing->socket_access == spec.access) return id;
    if (record) {
      if (absl::Status kept = ledger_->PutSocketTenant(row); !kept.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "tenant \"", spec.name, "\" not changed: the ledger cannot record it: ",
            kept.message()));
      }
    }
    quotas_->SetQuota(id, spec.quota);
    holder->Replace(*std::move(next));
  } else {
    // Listed first (with its quota), so the first connection through the
    // socket finds it; then the socket; then the ledger row. Each undone
    // if a later one fails.
    quotas_->SetQuota(id, spec.quota);
    holder->Replace(*next);
    auto unlist = [&] {
      holder->Replace(next->Without(id));
      quotas_->SetQuota(id, tenants::Quota());
    };
    // Restoring at start (record false), the socket comes later
    // (ServeRestoredSockets).
    if (record) {
      absl::Status added = MakeSocket(id, spec.socket, spec.access);
      if (!added.ok()) {
        unlist();
        return added;
      }
    }
    if (record) {
      if (absl::Status kept = ledger_->PutSocketTenant(row); !kept.ok()) {
        sockets_.sockets->RemoveTenantSocket(id, /*close_connections=*/true);
        unlist();
        return absl::UnavailableError(absl::StrCat(
            "tenant \"", spec.name, "\" not made: the ledger cannot record it: ", kept.message()));
      }
    }
  }
  if (record) {
    ledger::LedgerEvent e;
    e.time_ns = now;
    e.kind = ledger::EventKind::kTenantPut;
    e.tenant = spec.name;
    e.uid = caller.uid;
    e.pid = caller.pid;
    e.bytes = spec.quota.total_bytes.value_or(0);
    e.detail = absl::StrCat(*created ? "made" : "changed", "; socket ", spec.socket, "; quota ",
                            DescribeQuota(spec.quota), "; priority ", spec.priority);
    ledger_->Append(std::move(e));
  }
  if (quota_changed_) quota_changed_();
  return id;
}

absl::Status TenantAdmin::MakeSocket(uint32_t id, const std::string& path,
                                     const tenants::SocketAccess& access) {
  absl::Status added = sockets_.sockets->AddTenantSocket(id, sockets_.socket_dir, path);
  if (!added.ok()) return added;
  absl::Status set =
      SetTenantSocketAccess(sockets_.socket_dir, path, access.uid, access.gid, access.mode);
  if (!set.ok()) {
    sockets_.sockets->RemoveTenantSocket(id, /*close_connections=*/true);
    return set;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PutTenantResponse> TenantAdmin::PutTenant(const PeerCred& caller,
                                                             const v1::PutTenantRequest& request) {
  if (!is_admin_(caller)) return absl::PermissionDeniedError(NotAdmin("PutTenant", caller));
  if (sockets_.sockets == nullptr) {
    return absl::UnimplementedError("this daemon serves no socket tenants");
  }
  if (absl::Status named = tenants::CheckSocketTenantName(request.name()); !named.ok()) {
    return named;
  }
  absl::StatusOr<tenants::Quota> quota = QuotaFromProto(request.quota(), devices_);
  if (!quota.ok()) return quota.status();
  tenants::TenantDirectory::SocketTenantSpec spec;
  spec.name = request.name();
  spec.priority = request.priority();
  spec.quota = *std::move(quota);
  const bool access_given =
      request.has_socket_uid() || request.has_socket_gid() || request.socket_mode() != 0;
  if (access_given) {
    spec.access.uid = request.has_socket_uid() ? request.socket_uid() : 0;
    spec.access.gid = request.has_socket_gid() ? request.socket_gid() : 0;
    spec.access.mode = request.socket_mode() != 0 ? request.socket_mode()
                       : request.has_socket_gid() ? 0660
                                                  : 0600;
    if (absl::Status mode = tenants::CheckSocketMode(spec.access.mode, "socket_mode");
        !mode.ok()) {
      return mode;
    }
  } else {
    spec.access.mode = 0666;  // reached through a mount of its directory (a claim)
  }
  absl::MutexLock changes(&sockets_.directory->changes());
  const tenants::Tenant* existing = sockets_.directory->Get()->Find(spec.name);
  if (!access_given && existing != nullptr && existing->runtime) {
    spec.access = existing->socket_access;  // an update without access keeps it
  }
  if (request.socket_path().empty() && existing != nullptr && existing->runtime) {
    spec.socket = existing->socket;  // an update without a path keeps the socket
  } else {
    absl::StatusOr<std::string> path =
        tenants::ResolveSocketPath(request.socket_path(), sockets_.socket_dir, spec.name);
    if (!path.ok()) return path.status();
    spec.socket = *std::move(path);
  }
  bool created = false;
  absl::StatusOr<uint32_t> id = Put(spec, /*record=*/true, caller, &created);
  if (!id.ok()) return id.status();
  v1::PutTenantResponse out;
  out.set_name(spec.name);
  out.set_tenant(*id);
  out.set_socket_path(spec.socket);
  out.set_created(created);
  QuotaToProto(spec.quota, out.mutable_quota());
  out.set_socket_uid(spec.access.uid);
  out.set_socket_gid(spec.access.gid);
  out.set_socket_mode(spec.access.mode);
  return out;
}

absl::StatusOr<v1::DeleteTenantResponse> TenantAdmin::DeleteTenant(
    const PeerCred& caller, const v1::DeleteTenantRequest& request) {
  if (!is_admin_(caller)) return absl::PermissionDeniedError(NotAdmin("DeleteTenant", caller));
  if (sockets_.sockets == nullptr) {
    return absl::UnimplementedError("this daemon serves no socket tenants");
  }
  tenants::TenantDirectoryHolder* holder = sockets_.directory;
  absl::MutexLock changes(&holder->changes());
  const std::shared_ptr<const tenants::TenantDirectory> in_force = holder->Get();
  const tenants::Tenant* t = in_force->Find(request.name());
  v1::DeleteTenantResponse out;
  if (t == nullptr) {
    // Not listed; a row left by a tenant that could not be restored goes.
    if (absl::Status gone = ledger_->DeleteSocketTenant(request.name()); !gone.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "the ledger cannot record the removal of tenant \"", request.name(), "\": ",
          gone.message()));
    }
    out.set_existed(false);
    return out;
  }
  if (!t->runtime) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tenant \"", t->name, "\" is defined in the daemon's config; remove it there and "
        "reload (DeleteTenant removes only tenants PutTenant made)"));
  }
  const uint32_t id = t->id;
  const std::string name = t->name;
  absl::StatusOr<MemoryBroker::TenantEnded> ended = sockets_.broker->EndTenant(
      id, name, request.end_sessions(), [&] { holder->Replace(in_force->Without(id)); });
  if (!ended.ok()) return ended.status();
  sockets_.sockets->RemoveTenantSocket(id, /*close_connections=*/true);
  quotas_->SetQuota(id, tenants::Quota());
  ledger::LedgerEvent e;
  e.kind = ledger::EventKind::kTenantDelete;
  e.tenant = name;
  e.uid = caller.uid;
  e.pid = caller.pid;
  e.detail = absl::StrCat("removed; ", ended->sessions, " session(s) ended, ",
                          ended->allocations, " allocation(s) freed");
  ledger_->Append(std::move(e));
  out.set_existed(true);
  out.set_sessions_ended(ended->sessions);
  out.set_allocations_freed(ended->allocations);
  if (absl::Status gone = ledger_->DeleteSocketTenant(name); !gone.ok()) {
    // Removed here; a restart before the row goes would bring it back, so
    // the caller is told to ask again (which finds no tenant, and retries
    // the row).
    return absl::UnavailableError(absl::StrCat(
        "tenant \"", name, "\" was removed, but the ledger cannot record it (",
        gone.message(), "); call DeleteTenant again"));
  }
  return out;
}

std::vector<std::string> TenantAdmin::RestoreSocketTenants() {
  std::vector<std::string> lines;
  if (sockets_.sockets == nullptr) return lines;
  absl::StatusOr<std::vector<ledger::SocketTenantRow>> rows = ledger_->SocketTenants();
  if (!rows.ok()) {
    lines.push_back(absl::StrCat("socket tenants not restored: ", rows.status().message()));
    return lines;
  }
  absl::MutexLock changes(&sockets_.directory->changes());
  size_t restored = 0;
  PeerCred daemon;  // the daemon itself, for the ledger's events
  daemon.uid = geteuid();
  daemon.pid = getpid();
  for (const ledger::SocketTenantRow& row : *rows) {
    tenants::TenantDirectory::SocketTenantSpec spec;
    spec.name = row.name;
    spec.priority = row.priority;
    spec.quota.total_bytes = row.total_bytes;
    spec.quota.max_allocations = row.max_allocations;
    spec.quota.device_bytes.resize(devices_.size());
    for (const auto& [uuid, bytes] : row.device_bytes) {
      absl::StatusOr<uint32_t> index = tenants::ResolveDeviceSelector(uuid, devices_);
      if (!index.ok()) {
        lines.push_back(absl::StrCat("socket tenant \"", row.name, "\": its quota on device ",
                                     uuid, " is dropped: this daemon has no such device"));
        continue;
      }
      spec.quota.device_bytes[*index] = bytes;
    }
    const absl::Status named = tenants::CheckSocketTenantName(row.name);
    absl::StatusOr<std::string> path =
        tenants::ResolveSocketPath(row.socket, sockets_.socket_dir, row.name);
    // A socket an earlier gpumemd made directly in tenant_socket_dir moves
    // into a directory of its tenant's own (its file name kept).
    const std::string moved_from = row.socket;
    if (!path.ok() && tenants::SocketDirOf(row.socket) == sockets_.socket_dir) {
      path = tenants::ResolveSocketPath(row.socket.substr(row.socket.rfind('/') + 1),
                                        sockets_.socket_dir, row.name);
    }
    const tenants::Tenant* clash = sockets_.directory->Get()->Find(row.name);
    if (clash != nullptr && clash->runtime) continue;  // put again already
    std::string why;
    if (!named.ok()) {
      why = std::string(named.message());
    } else if (!path.ok()) {
      why = absl::StrCat(path.status().message(), " (was tenant_socket_dir changed?)");
    } else if (clash != nullptr) {
      why = "the config defines a tenant of that name now";
    }
    if (!why.empty()) {
      lines.push_back(absl::StrCat("socket tenant \"", row.name, "\" is not restored and "
                                   "leaves the ledger: ", why));
      ledger_->DeleteSocketTenant(row.name).IgnoreError();
      continue;
    }
    spec.socket = *path;
    spec.access = tenants::SocketAccess();  // root-only: PutTenant's access is not kept
    ++restored;
    bool created = false;
    absl::StatusOr<uint32_t> id = Put(spec, /*record=*/false, daemon, &created);
    if (!id.ok()) {
      lines.push_back(absl::StrCat("socket tenant \"", row.name, "\" is not restored: ",
                                   id.status().message()));
    } else if (spec.socket != moved_from) {
      ledger::SocketTenantRow moved = row;
      moved.socket = spec.socket;
      absl::Status kept = ledger_->PutSocketTenant(moved);
      lines.push_back(absl::StrCat(
          "socket tenant \"", row.name, "\": its socket moves from ", moved_from, " to ",
          spec.socket, " (each tenant's socket has a directory of its own)",
          kept.ok() ? "" : absl::StrCat("; the ledger keeps the old path until it can be "
                                        "written: ", kept.message())));
    }
  }
  if (restored > 0) {
    lines.push_back(absl::StrCat(restored, " socket tenant(s) restored with root-only sockets "
                                 "(root, 0600) until PutTenant gives their socket_uid, "
                                 "socket_gid or socket_mode again"));
  }
  return lines;
}

std::vector<std::string> TenantAdmin::ServeRestoredSockets() {
  std::vector<std::string> lines;
  if (sockets_.sockets == nullptr) return lines;
  absl::MutexLock changes(&sockets_.directory->changes());
  const std::shared_ptr<const tenants::TenantDirectory> dir = sockets_.directory->Get();
  const std::map<uint32_t, std::string> served = sockets_.sockets->TenantSockets();
  for (const tenants::Tenant& t : dir->tenants()) {
    if (!t.runtime || t.socket.empty() || served.count(t.id) > 0) continue;
    absl::Status added = MakeSocket(t.id, t.socket, t.socket_access);
    if (!added.ok()) {
      lines.push_back(absl::StrCat("socket tenant \"", t.name, "\" is restored without its "
                                   "socket ", t.socket, " (", added.message(),
                                   "; PutTenant makes it again)"));
    }
  }
  return lines;
}

std::vector<std::string> TenantAdmin::SyncConfigSockets() {
  std::vector<std::string> lines;
  if (sockets_.sockets == nullptr) return lines;
  absl::MutexLock changes(&sockets_.directory->changes());
  const std::shared_ptr<const tenants::TenantDirectory> dir = sockets_.directory->Get();
  std::map<uint32_t, std::string> served = sockets_.sockets->TenantSockets();
  // Sockets of tenants the directory no longer has, or that moved: removed
  // (their connections stay, as a removed tenant's live sessions do).
  for (const auto& [id, path] : served) {
    const tenants::Tenant* t = dir->FindId(id);
    if (t == nullptr || t->socket != path) {
      sockets_.sockets->RemoveTenantSocket(id, /*close_connections=*/false);
    }
  }
  served = sockets_.sockets->TenantSockets();
  for (const tenants::Tenant& t : dir->tenants()) {
    if (t.runtime || t.socket.empty()) continue;
    if (served.count(t.id) > 0) {
      // Kept over a reload: its access as the config says now.
      absl::Status set = SetTenantSocketAccess(sockets_.socket_dir, t.socket, t.socket_access.uid,
                                               t.socket_access.gid, t.socket_access.mode);
      if (!set.ok()) {
        lines.push_back(absl::StrCat("tenant \"", t.name, "\": socket ", t.socket,
                                     " keeps its access: ", set.message()));
      }
      continue;
    }
    absl::Status added = MakeSocket(t.id, t.socket, t.socket_access);
    if (!added.ok()) {
      lines.push_back(absl::StrCat("tenant \"", t.name, "\": socket ", t.socket,
                                   " not made: ", added.message()));
    }
  }
  return lines;
}

}  // namespace gpumem
