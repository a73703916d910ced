// RenderStats: a StatsView (what the core lets one caller see,
// server/core/stats_view.h) as the API's GetStatsResponse.
//
// Only the shape changes: every figure is the view's. Slab owners and
// holders are left out where the view says the caller may not see them; a
// session's leased bytes are never shown above the bytes it holds (the
// report is the client's word), nor its in-use bytes above its leased.
//
// RenderLedgerStatus: the ledger writer's state (TenantLedger::stats(), one
// snapshot) as GetStatsResponse.ledger; the service adds it to every answer.
#ifndef GPUMEMD_SERVER_SERVICE_STATS_PROTO_H_
#define GPUMEMD_SERVER_SERVICE_STATS_PROTO_H_

#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/core/stats_view.h"
#include "server/ledger/tenant_ledger.h"

namespace gpumem {

v1::GetStatsResponse RenderStats(const StatsView& view);

// A null `ledger` reads as --ledger=none (enabled false, every count 0).
v1::LedgerStatus RenderLedgerStatus(const ledger::TenantLedger* ledger);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_STATS_PROTO_H_
