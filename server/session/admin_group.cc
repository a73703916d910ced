#include "server/session/admin_group.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gpumem {

absl::Status AdminGroup::Set(const std::string& group) {
  if (group.empty()) {
    gid_.store(-1);
    return absl::OkStatus();
  }
  struct group grp;
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  getgrnam_r(group.c_str(), &grp, buf.data(), buf.size(), &found);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admin group \"", group, "\" does not exist on this machine"));
  }
  gid_.store(found->gr_gid);
  return absl::OkStatus();
}

bool AdminGroup::IsAdmin(const PeerCred& caller) const {
  // Through a tenant's own socket a caller is that tenant, nothing more: a
  // uid 0 in a container is not the node's root.
  if (caller.socket_tenant != 0) return false;
  if (caller.uid == 0) return true;
  const int64_t admin_gid = gid_.load();
  if (admin_gid < 0) return false;
  if (caller.gid == static_cast<gid_t>(admin_gid)) return true;
  // Supplementary groups, as the system's group database says for the uid.
  struct passwd pw;
  struct passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(caller.uid, &pw, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return false;
  }
  int n = 64;
  std::vector<gid_t> groups(n);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(n);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) return false;
  }
  groups.resize(n);
  return std::find(groups.begin(), groups.end(), static_cast<gid_t>(admin_gid)) !=
         groups.end();
}

}  // namespace gpumem
