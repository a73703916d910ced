// GpuMemoryService: the unary methods of gpumem.v1.GpuMemory, served
// asynchronously from the daemon's completion queues, over MemoryBroker.
//
// Invariants: no call holds a thread while it is in flight; a slow device
// holds up no other call of the queue; each handler finds its caller's
// kernel credentials (caller.h) and maps absl statuses to gRPC statuses one
// to one (common/grpc_status.h): a placement refusal travels as binary
// error details. Thread policy, decided here: see the handlers.
#ifndef GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_

#include <vector>

#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "server/core/memory_broker.h"
#include "server/ledger/tenant_ledger.h"
#include "server/service/async_service.h"
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
  explicit GpuMemoryService(Parts parts) : p_(parts) {}
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

  // The handlers, on the queue's thread, each answering its call once.
  //  - Allocate and Free run on the queue's thread through the core's Try*
  //    calls, which never call the backend; a request that needs backend
  //    work (a new slab, a dedicated slab given back) runs on
  //    `backend_workers` instead.
  //  - An Allocate with wait_ms that must wait is held by admission (the
  //    core's), not by a thread: its answer comes from admission's thread
  //    through a callback. If the caller goes away (the call is cancelled),
  //    the wait is cancelled with it.
  //  - GetStats, GetUsage, GetLedger, SetQuota, PutTenant, DeleteTenant and
  //    Resume run on `query_workers` (they read the disk or walk every
  //    session or allocation). GetStats answers with what the broker shows
  //    the caller (its visibility rules) and the ledger writer's state
  //    (every caller sees it).
  //  - GetSession runs on the queue's thread.
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
  void ReplyAllocate(AllocateCall* call, MemoryBroker::AllocateAnswer answer);
  void ReplyFree(FreeCall* call, absl::StatusOr<v1::FreeResponse> answer);
  // Runs `query` on the query workers (inline once they stop) and replies;
  // refused at once past the caller's query budget.
  template <typename Call, typename Fn>
  void Query(Call* call, Fn query);

  const Parts p_;
  QueryBudget query_budget_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_GPUMEM_SERVICE_H_
