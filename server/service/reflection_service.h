// ReflectionService: gRPC server reflection (grpc.reflection.v1 and
// v1alpha ServerReflectionInfo, what grpcurl and buf curl ask), served by
// the daemon itself from its completion queues, not by grpc::reflection's
// plugin: that is a synchronous service, so every open reflection stream
// would hold one of gRPC's few sync threads, and one client that opens
// streams and never ends them could leave nobody able to list or describe
// the daemon.
//
// Invariants: no thread of its own (every stream lives on one of the
// daemon's queues, event_queues.h, its events handled by that queue's
// thread, so neither it nor the number of streams adds threads); streams
// are bounded per uid (the kernel's, SO_PEERCRED through the PeerTable) and
// in time (ReflectionLimits). v1alpha shares v1's wire format, so both
// methods are served by the same code.
#ifndef GPUMEMD_SERVER_SERVICE_REFLECTION_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_REFLECTION_SERVICE_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server_builder.h>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/defaults/defaults.h"
#include "server/service/cq_event.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

struct ReflectionLimits {
  // Streams open at once per uid, over every connection and both versions;
  // one more is ended at once with RESOURCE_EXHAUSTED naming the limit.
  int max_streams_per_uid = defaults::kMaxReflectionStreamsPerUid;
  // A stream that sends no request for this long is ended with
  // DEADLINE_EXCEEDED naming it (cancelled if its client does not read the
  // answer it is being sent), so a held stream costs its buffers for at
  // most that long.
  absl::Duration idle_timeout = absl::Seconds(10);
};

class ReflectionService {
 public:
  // `peers` outlives this object. `services`: the full names of the
  // services the server serves (listed when the descriptor pool has them).
  // Answers come from the generated descriptor pool (every .proto linked
  // into the daemon): list_services (the services given that the pool
  // knows), file_by_filename, file_containing_symbol,
  // file_containing_extension (a file comes with those of its transitive
  // imports that were not yet sent on this stream), and
  // all_extension_numbers_of_type; an unknown name is an error_response
  // NOT_FOUND naming it, an empty request INVALID_ARGUMENT.
  ReflectionService(const PeerTable* peers, std::vector<std::string> services,
                    ReflectionLimits limits = {});
  ~ReflectionService();
  ReflectionService(const ReflectionService&) = delete;
  ReflectionService& operator=(const ReflectionService&) = delete;

  // Before builder->BuildAndStart(): registers both versions' method.
  void AddTo(grpc::ServerBuilder* builder);
  // After the server started: accepts streams on every queue of `queues`
  // (each drained after grpc::Server::Shutdown()).
  void Start(const std::vector<EventQueue*>& queues);

  class Method;  // reflection_service.cc
  class Call;

 private:
  // One more stream for `uid`: false (and nothing counted) at the limit.
  bool Admit(uid_t uid);
  void Release(uid_t uid);

  const PeerTable* const peers_;
  const std::vector<std::string> services_;
  const ReflectionLimits limits_;
  std::unique_ptr<Method> v1_;
  std::unique_ptr<Method> v1alpha_;
  absl::Mutex mu_;  // streams of every queue
  absl::flat_hash_map<uid_t, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_REFLECTION_SERVICE_H_
