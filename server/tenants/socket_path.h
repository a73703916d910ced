// Socket tenants' names and socket paths, checked by their text alone.
// A socket tenant's socket lives in a directory of its own below the
// daemon's tenant_socket_dir. Invariants: a resolved path is the one
// absolute path the socket will have, at least one directory below that
// directory, so comparing two answers compares two sockets; nothing is
// cleaned up: a path that is not already in normal form is refused, saying
// why. The filesystem (symlinks, what already exists there) is checked when
// the socket is made (server/service/tenant_socket_file.h). Who may connect
// is the socket file's owner, group and mode (SocketAccess; the tenant's
// socket_uid/socket_gid/socket_mode, or DefaultSocketAccess), and the
// socket's directory lets through only those (SocketDirMode).
#ifndef GPUMEMD_SERVER_TENANTS_SOCKET_PATH_H_
#define GPUMEMD_SERVER_TENANTS_SOCKET_PATH_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/tenants/tenant.h"

namespace gpumem {
namespace tenants {

// The longest path a Unix socket address holds (sun_path less its NUL).
inline constexpr size_t kMaxSocketPath = 107;

// The socket's file name in its tenant's directory when none is given:
// the main socket's, so a container that mounts the directory where the
// main socket's would be finds it at the client library's default path.
inline constexpr char kDefaultSocketFile[] = "gpumemd.sock";

// What a request or the config may name (PutTenant.socket_path,
// TenantConfig.socket), with DIR `socket_dir`, and what it resolves to:
//  - empty: DIR/NAME/gpumemd.sock (NAME the tenant's name);
//  - a bare file name ("team.sock"): DIR/NAME/team.sock;
//  - an absolute path at least one directory below DIR
//    ("DIR/claim-1/gpumemd.sock"): itself.
// Anything else is INVALID_ARGUMENT saying why: a relative path with a '/',
// a path outside DIR, DIR itself or a file directly in it (a socket's
// directory is its tenant's alone), an empty, "." or ".." component (so
// "DIR/../x" and "DIR//x" are refused, not cleaned up), a NUL or control
// byte, a path longer than kMaxSocketPath, or (for the first two forms) a
// tenant name that is no file name.
// `socket_dir` must be absolute and normalized (CheckSocketDir).
absl::StatusOr<std::string> ResolveSocketPath(absl::string_view requested,
                                              absl::string_view socket_dir,
                                              absl::string_view tenant_name);

// The directory of a resolved socket path (all but its last component).
absl::string_view SocketDirOf(absl::string_view socket_path);

// Whether two resolved socket paths' directories are the same or one is
// inside the other: then one tenant's directory would hold or lead to
// another's socket, which each tenant's directory of its own rules out.
bool SocketDirsOverlap(absl::string_view a, absl::string_view b);

// OK if `dir` is an absolute path without empty, "." or ".." components
// and without a trailing '/' ("/" itself is refused too).
absl::Status CheckSocketDir(absl::string_view dir);

// A socket's mode: only read/write bits (no x, setuid, sticky), the
// owner's rw, and each of group and others either rw or nothing (0600,
// 0660, 0606, 0666). INVALID_ARGUMENT naming `what` (the setting) otherwise.
absl::Status CheckSocketMode(uint32_t mode, absl::string_view what);
// Octal text ("0660", "660") to a mode checked by CheckSocketMode.
absl::StatusOr<uint32_t> ParseSocketMode(absl::string_view text, absl::string_view what);

// The access a configured tenant's socket gets when its config sets none
// of socket_uid/socket_gid/socket_mode (each given one wins):
//  - with gids: owner root, group its first gid, mode 0660;
//  - else with uids: owner its first uid, group root, mode 0600;
//  - else: root only (0600).
// A socket_gid given makes the default mode 0660.
SocketAccess DefaultSocketAccess(const std::vector<uid_t>& uids, const std::vector<gid_t>& gids,
                                 std::optional<uint32_t> socket_uid,
                                 std::optional<uint32_t> socket_gid);

// The mode of a socket's directory for `access`: only search bits for
// those the socket lets connect (its owner; its group when the socket is
// group rw; others when it is other rw), so nobody else may even reach the
// socket's name, and nobody lists the directory; plus read and write for
// the owner when the owner is the daemon itself (`owner_is_daemon`), which
// makes and removes the socket there. 0700 | ... or 0100 | ... .
uint32_t SocketDirMode(const SocketAccess& access, bool owner_is_daemon);

// A name PutTenant may give: 1..63 letters, digits, '-', '_' and '.', not
// starting with '.', and not of the form "uid-N" (the name of uid N's own
// tenant when no tenants are configured). INVALID_ARGUMENT otherwise.
absl::Status CheckSocketTenantName(absl::string_view name);

}  // namespace tenants
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_TENANTS_SOCKET_PATH_H_
