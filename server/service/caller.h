// CallerOf: who is calling a gRPC method, as the kernel identified the
// connection (the PeerTable the SocketListener filled at accept, found by
// ServerContext::peer()), plus, for a caller without a visible pid, the
// connection-bound session it proves with the token its slab channel was
// given (gRPC metadata kSessionTokenHeader, common/fd_channel.h). Never a
// request field.
#ifndef GPUMEMD_SERVER_SERVICE_CALLER_H_
#define GPUMEMD_SERVER_SERVICE_CALLER_H_

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "server/core/memory_broker.h"
#include "server/session/peer_credentials.h"

namespace gpumem {

absl::StatusOr<PeerCred> CallerOf(grpc::ServerContext* ctx, const PeerTable& peers,
                                  const MemoryBroker& broker);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_CALLER_H_
