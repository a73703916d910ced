#include "server/tenants/socket_path.h"

#include <cctype>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/tenants/tenant.h"

namespace gpumem {
namespace tenants {
namespace {

// Why `part` (one component of a path) may not be one, or "".
std::string BadComponent(absl::string_view part) {
  if (part.empty()) return "has an empty component ('//' or a trailing '/')";
  if (part == "." || part == "..") return absl::StrCat("has a \"", part, "\" component");
  for (char c : part) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return "has a NUL or control byte";
  }
  return "";
}

}  // namespace

absl::Status CheckSocketDir(absl::string_view dir) {
  if (dir.size() < 2 || dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant_socket_dir \"", dir, "\" must be an absolute path below /"));
  }
  for (absl::string_view part : absl::StrSplit(dir.substr(1), '/')) {
    const std::string bad = BadComponent(part);
    if (!bad.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tenant_socket_dir \"", dir, "\" ", bad));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveSocketPath(absl::string_view requested,
                                              absl::string_view socket_dir,
                                              absl::string_view tenant_name) {
  std::string path;
  if (requested.empty() || !absl::StrContains(requested, '/')) {
    const absl::string_view file = requested.empty() ? kDefaultSocketFile : requested;
    std::string bad = BadComponent(file);
    if (!bad.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("socket path \"", requested, "\" ", bad));
    }
    // The tenant's name is its socket's directory: it must be one.
    bad = absl::StrContains(tenant_name, '/') ? "has a '/'" : BadComponent(tenant_name);
    if (!bad.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenant name \"", tenant_name, "\" ", bad, ", so it cannot name its socket's "
          "directory; give the socket as an absolute path inside ", socket_dir));
    }
    path = absl::StrCat(socket_dir, "/", tenant_name, "/", file);
  } else if (requested[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path \"", requested, "\" is relative: give a bare file name (made in ",
        socket_dir, "/", tenant_name, ") or an absolute path inside ", socket_dir));
  } else {
    const std::string prefix = absl::StrCat(socket_dir, "/");
    if (!absl::StartsWith(requested, prefix) || requested.size() == prefix.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "socket path \"", requested, "\" is outside the daemon's tenant_socket_dir ",
          socket_dir, " (socket tenants' sockets are made only there)"));
    }
    for (absl::string_view part : absl::StrSplit(requested.substr(prefix.size()), '/')) {
      const std::string bad = BadComponent(part);
      if (!bad.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("socket path \"", requested, "\" ", bad));
      }
    }
    if (!absl::StrContains(requested.substr(prefix.size()), '/')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "socket path \"", requested, "\" is directly in tenant_socket_dir ", socket_dir,
          ": each tenant's socket has a directory of its own there (",
          socket_dir, "/", tenant_name, "/", requested.substr(prefix.size()),
          ", or give the bare file name)"));
    }
    path = std::string(requested);
  }
  if (path.size() > kMaxSocketPath) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path \"", path, "\" is ", path.size(), " bytes; a Unix socket path holds at most ",
        kMaxSocketPath));
  }
  return path;
}

absl::string_view SocketDirOf(absl::string_view socket_path) {
  const size_t slash = socket_path.rfind('/');
  return slash == absl::string_view::npos ? absl::string_view() : socket_path.substr(0, slash);
}

bool SocketDirsOverlap(absl::string_view a, absl::string_view b) {
  absl::string_view da = SocketDirOf(a), db = SocketDirOf(b);
  if (da.size() > db.size()) std::swap(da, db);
  // da is db, or an ancestor of it.
  return absl::StartsWith(db, da) && (db.size() == da.size() || db[da.size()] == '/');
}

absl::Status CheckSocketMode(uint32_t mode, absl::string_view what) {
  const uint32_t group = (mode >> 3) & 07, other = mode & 07;
  if ((mode & ~0666u) != 0 || ((mode >> 6) & 07) != 06 || (group != 0 && group != 06) ||
      (other != 0 && other != 06)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", absl::StrFormat("%04o", mode), " is not a socket mode: give 0600, 0660, 0606 or 0666 (the owner reads and writes; "
        "group and others each all or nothing; no execute or special bits)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ParseSocketMode(absl::string_view text, absl::string_view what) {
  uint32_t mode = 0;
  if (text.empty() || text.size() > 5) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", text, "\" is not an octal mode"));
  }
  for (char c : text) {
    if (c < '0' || c > '7') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", text, "\" is not an octal mode (\"0660\")"));
    }
    mode = mode * 8 + static_cast<uint32_t>(c - '0');
  }
  if (absl::Status ok = CheckSocketMode(mode, what); !ok.ok()) return ok;
  return mode;
}

SocketAccess DefaultSocketAccess(const std::vector<uid_t>& uids, const std::vector<gid_t>& gids,
                                 std::optional<uint32_t> socket_uid,
                                 std::optional<uint32_t> socket_gid) {
  SocketAccess a;
  if (!gids.empty()) {
    a.gid = gids.front();
    a.mode = 0660;
  } else if (!uids.empty()) {
    a.uid = uids.front();
  }
  if (socket_uid) a.uid = *socket_uid;
  if (socket_gid) {
    a.gid = *socket_gid;
    a.mode = 0660;
  }
  return a;
}

uint32_t SocketDirMode(const SocketAccess& access, bool owner_is_daemon) {
  uint32_t mode = owner_is_daemon ? 0700 : 0100;
  if ((access.mode & 060) != 0) mode |= 010;
  if ((access.mode & 006) != 0) mode |= 001;
  return mode;
}

absl::Status CheckSocketTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 63) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant name \"", name, "\" must be 1 to 63 characters (it is ", name.size(), ")"));
  }
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '-' || c == '_' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenant name \"", name, "\" may hold only letters, digits, '-', '_' and '.'"));
    }
  }
  if (name[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant name \"", name, "\" may not start with '.'"));
  }
  if (UidOfTenantName(name).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant name \"", name, "\" is a uid tenant's name (uid-N); choose another"));
  }
  return absl::OkStatus();
}

}  // namespace tenants
}  // namespace gpumem
