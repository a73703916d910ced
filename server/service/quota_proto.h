// QuotaToProto: a tenant's Quota as the API shows it (gpumem.v1.Quota), the
// one conversion GetStats, GetUsage and SetQuota share. A limit that is not
// set is left unset; device limits are named by device index.
#ifndef GPUMEMD_SERVER_SERVICE_QUOTA_PROTO_H_
#define GPUMEMD_SERVER_SERVICE_QUOTA_PROTO_H_

#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/tenants/tenant.h"

namespace gpumem {

void QuotaToProto(const tenants::Quota& quota, v1::Quota* out);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_QUOTA_PROTO_H_
