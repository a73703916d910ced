// GpuMemoryService: the unary methods of gpumem.v1.GpuMemory, served
// asynchronously from the daemon's completion queues, over MemoryBroker.
//
// Invariants: no call holds a thread while it is in flight; a slow device
// holds up no other call of the queue; each handler finds its caller's
// kernel credentials (caller.h) and maps absl statuses to gRPC statuses one
// to one (common/grpc_status.h): a placement refusal travels as binary
// error details. What runs where is CallDispatch's (call_dispatch.h), the
// same for the Stream.
#ifndef GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_

#include <vector>

#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/service/async_service.h"
#include "server/service/call_dispatch.h"
#include "server/service/call_observer.h"
#include "server/service/cq_event.h"
#include "server/service/query_budget.h"
#include "server/service/tenant_admin.h"
#include "server/service/worker_pool.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

template <typename Request, typename Response>
class UnaryCall;  // gpumem_service.cc

class GpuMemoryService {
 public:
  struct Parts {
    MemoryBroker* broker = nullptr;
    const PeerTable* peers = nullptr;
    // GetUsage, GetLedger, SetQuota, PutTenant, DeleteTenant; null: those
    // RPCs are UNIMPLEMENTED.
    TenantAdmin* tenants = nullptr;
    // GetStats' ledger status (read, never written); null: shown as
    // --ledger=none.
    const ledger::TenantLedger* ledger = nullptr;
    AsyncGpuMemory* service = nullptr;  // registered with the server
    WorkerPool* backend_workers = nullptr;
    WorkerPool* query_workers = nullptr;
    CallObserver* observer = nullptr;  // may be null
  };
  // Everything in `parts` must outlive the service.
  explicit GpuMemoryService(Parts parts)
      : p_(parts),
        dispatch_({parts.broker, parts.backend_workers, parts.query_workers, parts.observer}) {}
  GpuMemoryService(const GpuMemoryService&) = delete;
  GpuMemoryService& operator=(const GpuMemoryService&) = delete;

  // After the server started: accepts every unary method's calls on each of
  // `queues` (whose threads hand tags to CqEvent::OnEvent, cq_event.h).
  void Start(const std::vector<EventQueue*>& queues);

  using AllocateCall = UnaryCall<v1::AllocateRequest, v1::AllocateResponse>;
  using FreeCall = UnaryCall<v1::FreeRequest, v1::FreeResponse>;
  using GetStatsCall = UnaryCall<v1::GetStatsRequest, v1::GetStatsResponse>;
  using GetSessionCall = UnaryCall<v1::GetSessionRequest, v1::Session>;
  using GetUsageCall = UnaryCall<v1::GetUsageRequest, v1::GetUsageResponse>;
  using GetLedgerCall = UnaryCall<v1::GetLedgerRequest, v1::GetLedgerResponse>;
  using SetQuotaCall = UnaryCall<v1::SetQuotaRequest, v1::SetQuotaResponse>;
  using PutTenantCall = UnaryCall<v1::PutTenantRequest, v1::PutTenantResponse>;
  using DeleteTenantCall = UnaryCall<v1::DeleteTenantRequest, v1::DeleteTenantResponse>;
  using ResumeCall = UnaryCall<v1::ResumeRequest, v1::ResumeResponse>;

  // The handlers, on the queue's thread, each answering its call once,
  // through the dispatch:
  //  - Allocate and Free inline, on a backend worker, or (Allocate) waiting
  //    in admission (CallDispatch::Allocate, Free). A waiting Allocate whose
  //    call is cancelled (the caller went away) is cancelled with it.
  //  - GetStats, GetUsage, GetLedger, SetQuota, PutTenant, DeleteTenant and
  //    Resume as queries (CallDispatch::Query). GetStats answers with what
  //    the broker shows the caller (its visibility rules) and the ledger
  //    writer's state (every caller sees it).
  //  - GetSession inline.
  void Handle(AllocateCall* call);
  void Handle(FreeCall* call);
  void Handle(GetStatsCall* call);
  void Handle(GetSessionCall* call);
  void Handle(GetUsageCall* call);
  void Handle(GetLedgerCall* call);
  void Handle(SetQuotaCall* call);
  void Handle(PutTenantCall* call);
  void Handle(DeleteTenantCall* call);
  void Handle(ResumeCall* call);

  MemoryBroker* broker() const { return p_.broker; }

 private:
  // Runs `query` through the dispatch and replies with its answer; refused
  // at once past the caller's query budget.
  template <typename Call, typename Fn>
  void Query(Call* call, Fn query);

  const Parts p_;
  CallDispatch dispatch_;
  QueryBudget query_budget_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_
