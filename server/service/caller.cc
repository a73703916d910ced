#include "server/service/caller.h"

#include "common/fd_channel.h"

namespace gpumem {

absl::StatusOr<PeerCred> CallerOf(grpc::ServerContext* ctx, const PeerTable& peers,
                                  const MemoryBroker& broker) {
  absl::StatusOr<PeerCred> caller = peers.Lookup(ctx->peer());
  if (!caller.ok() || caller->pid > 0) return caller;
  auto token = ctx->client_metadata().find(kSessionTokenHeader);
  if (token == ctx->client_metadata().end()) return caller;  // the broker says why
  absl::StatusOr<uint64_t> session = broker.ResolveSessionToken(
      absl::string_view(token->second.data(), token->second.size()), *caller);
  if (!session.ok()) return session.status();
  caller->bound_session = *session;
  return caller;
}

}  // namespace gpumem
