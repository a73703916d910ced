// TenantSocketHost: where socket tenants' sockets are served. The
// SocketListener is one; TenantAdmin makes and removes sockets through it.
//
// Guarantees an implementation gives:
//  - AddTenantSocket returns once `path` accepts connections (a connect
//    after it returns succeeds) and every connection accepted on it is
//    marked with `tenant` (PeerCred::socket_tenant); on failure nothing is
//    left at the path (see tenant_socket_file.h for what is refused and
//    with which status).
//  - RemoveTenantSocket returns once the socket no longer accepts and its
//    file is gone; with `close_connections`, the connections accepted on
//    it are closed too (gRPC connections and slab channels, whose
//    connection-bound sessions end).
// Thread-safe.
#ifndef GPUMEMD_SERVER_SERVICE_TENANT_SOCKET_HOST_H_
#define GPUMEMD_SERVER_SERVICE_TENANT_SOCKET_HOST_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"

namespace gpumem {

class TenantSocketHost {
 public:
  virtual ~TenantSocketHost() = default;
  // `path` is inside `socket_dir` (server/tenants/socket_path.h). One
  // socket per tenant: a tenant that has one is FAILED_PRECONDITION.
  virtual absl::Status AddTenantSocket(uint32_t tenant, const std::string& socket_dir,
                                       const std::string& path) = 0;
  // A tenant without a socket is no error.
  virtual void RemoveTenantSocket(uint32_t tenant, bool close_connections) = 0;
  // The sockets served now: tenant -> path.
  virtual std::map<uint32_t, std::string> TenantSockets() const = 0;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_TENANT_SOCKET_HOST_H_
