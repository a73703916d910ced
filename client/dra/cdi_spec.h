// The CDI spec of a prepared claim: what the container runtime adds to each
// container that uses the claim (Container Device Interface, spec 0.5.0,
// JSON in the runtime's CDI directory, /var/run/cdi by default).
//
// One CDI device per claim, named by the claim's UID, kind
// "<driver>/claim": its edits bind-mount the claim's socket directory (on
// the host, under gpumemd's claims directory; it holds only the claim
// tenant's socket) read-only at the directory of the container's socket path,
// and set GPUMEMD_SOCKET to that path. The directory is mounted rather than
// the socket file because gpumemd re-creates the socket when it restarts; a
// bind mount of the old file would keep pointing at the dead one.
#ifndef GPUMEMD_CLIENT_DRA_CDI_SPEC_H_
#define GPUMEMD_CLIENT_DRA_CDI_SPEC_H_

#include <string>

#include <nlohmann/json.hpp>

namespace gpumem {
namespace dra {

struct CdiConfig {
  std::string dir = "/var/run/cdi";
  std::string driver;  // the CDI vendor
  // Where the client library in the container finds its socket.
  std::string container_socket = "/run/gpumemd/gpumemd.sock";
};

// "<driver>/claim"
std::string CdiKind(const CdiConfig& c);
// "<driver>/claim=<uid>"
std::string CdiDeviceId(const CdiConfig& c, const std::string& uid);
// "<dir>/<driver>-claim_<uid>.json"
std::string CdiSpecPath(const CdiConfig& c, const std::string& uid);

// The spec for one claim whose socket directory on the host is host_dir.
nlohmann::json CdiSpec(const CdiConfig& c, const std::string& uid, const std::string& host_dir);

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_CDI_SPEC_H_
