// See quota_proto.h.
#include "server/service/quota_proto.h"

#include "absl/strings/str_cat.h"

namespace gpumem {

void QuotaToProto(const tenants::Quota& quota, v1::Quota* out) {
  if (quota.total_bytes) out->set_total_bytes(*quota.total_bytes);
  if (quota.max_allocations) out->set_max_allocations(*quota.max_allocations);
  for (size_t d = 0; d < quota.device_bytes.size(); ++d) {
    if (!quota.device_bytes[d]) continue;
    v1::DeviceQuota* dq = out->add_devices();
    dq->set_device(absl::StrCat(d));
    dq->set_bytes(*quota.device_bytes[d]);
  }
}

}  // namespace gpumem
