// QueryBudget: bounds the bytes of requests one caller may have waiting
// for, or running on, the query workers (GetStats, GetUsage, GetLedger,
// SetQuota, PutTenant, DeleteTenant, Resume), and all callers together.
// Those requests are parsed and kept until a worker answers them, so
// without it one caller with many connections, each with many calls in
// flight, could make the daemon keep gigabytes of them.
//
// Invariants: a caller is its uid and the tenant socket it came through
// (pods on tenant sockets are all uid 0); what one caller holds never
// exceeds kPerCallerBytes and what all hold never exceeds kTotalBytes
// (bytes on the wire, each request counted at least 1 KiB); a request over
// either is refused RESOURCE_EXHAUSTED naming the limit, and holds nothing.
// Thread-safe.
#ifndef GPUMEMD_SERVER_SERVICE_QUERY_BUDGET_H_
#define GPUMEMD_SERVER_SERVICE_QUERY_BUDGET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

class QueryBudget {
 public:
  // A caller's share: room for a few Resume pages of a restarting client's
  // processes and any number of small queries; past it the client library
  // retries its Resume.
  static constexpr size_t kPerCallerBytes = size_t{4} << 20;
  static constexpr size_t kTotalBytes = size_t{64} << 20;
  // What the smallest request counts (its call's own state).
  static constexpr size_t kMinRequestBytes = size_t{1} << 10;

  // Held while the request waits or runs; gives its bytes back when
  // destroyed.
  class Hold {
   public:
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    friend class QueryBudget;
    Hold(QueryBudget* budget, std::pair<uint32_t, uint32_t> caller, size_t bytes)
        : budget_(budget), caller_(caller), bytes_(bytes) {}
    QueryBudget* const budget_;
    const std::pair<uint32_t, uint32_t> caller_;
    const size_t bytes_;
  };

  // Room for a request of `bytes` from uid `uid` through tenant socket
  // `socket_tenant` (0: the main socket), or RESOURCE_EXHAUSTED saying
  // which limit refused it. The budget must outlive the hold.
  absl::StatusOr<std::shared_ptr<Hold>> Take(uint32_t uid, uint32_t socket_tenant, size_t bytes);

  // What is held now (tests).
  size_t held() const;

 private:
  void Give(std::pair<uint32_t, uint32_t> caller, size_t bytes);

  mutable absl::Mutex mu_;
  size_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, size_t> by_caller_ ABSL_GUARDED_BY(mu_);
};

// `budget`'s room for a request of `bytes` from the caller of gRPC peer
// `peer` (its kernel credentials in `peers`; an unknown peer is counted as
// one caller, uid UINT32_MAX).
absl::StatusOr<std::shared_ptr<QueryBudget::Hold>> TakeQueryBudget(QueryBudget* budget,
                                                                   const PeerTable& peers,
                                                                   absl::string_view peer,
                                                                   size_t bytes);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_QUERY_BUDGET_H_
