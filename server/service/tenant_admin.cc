#include "server/service/tenant_admin.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "server/service/quota_proto.h"

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
  absl::StatusOr<tenants::TenantRef> self = directory->Resolve(caller.uid, caller.gid);
  const bool admin = is_admin_(caller);
  if (!admin && !self.ok()) return self.status();
  // Which tenants: the configured ones (and, for an administrator, removed
  // ones still holding allocations), or (one tenant per uid) those the
  // ledger has seen; never others' for a non-admin.
  std::map<std::string, uint32_t> ids;  // name -> id
  if (directory->configured()) {
    for (const tenants::Tenant& t : directory->tenants()) ids[t.name] = t.id;
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
    absl::StatusOr<tenants::TenantRef> self = directory_->Get()->Resolve(caller.uid, caller.gid);
    if (!self.ok()) return self.status();
    if (!q.tenant.empty() && q.tenant != self->name) {
      return absl::PermissionDeniedError(absl::StrCat(
          "uid ", caller.uid, " is charged to tenant \"", self->name,
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
  if (!is_admin_(caller)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "SetQuota is for root and the admin group; uid ", caller.uid,
        " may not change quotas"));
  }
  const std::shared_ptr<const tenants::TenantDirectory> directory = directory_->Get();
  std::optional<uint32_t> id = directory->IdOf(request.tenant());
  if (!id) {
    return absl::NotFoundError(absl::StrCat(
        "no tenant \"", request.tenant(), "\"",
        directory->configured() ? " in the daemon's config"
                                : " (without tenants in the config, tenants are named uid-N)"));
  }
  tenants::Quota quota;
  const v1::Quota& q = request.quota();
  if (q.has_total_bytes()) quota.total_bytes = q.total_bytes();
  if (q.has_max_allocations()) quota.max_allocations = q.max_allocations();
  quota.device_bytes.resize(devices_.size());
  for (const v1::DeviceQuota& dq : q.devices()) {
    absl::StatusOr<uint32_t> index = tenants::ResolveDeviceSelector(dq.device(), devices_);
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

// TODO(issue 24): socket tenants.
absl::StatusOr<v1::PutTenantResponse> TenantAdmin::PutTenant(const PeerCred&,
                                                             const v1::PutTenantRequest&) {
  return absl::UnimplementedError("socket tenants are not served by this daemon yet");
}

absl::StatusOr<v1::DeleteTenantResponse> TenantAdmin::DeleteTenant(
    const PeerCred&, const v1::DeleteTenantRequest&) {
  return absl::UnimplementedError("socket tenants are not served by this daemon yet");
}

}  // namespace gpumem
