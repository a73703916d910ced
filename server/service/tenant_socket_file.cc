// Every filesystem step below tenant_socket_dir goes through a directory fd
// opened with O_NOFOLLOW (openat, mkdirat, fstatat, unlinkat, renameat);
// bind and connect, which take a path, get /proc/self/fd/N/NAME. Without
// /proc (rare) they get the absolute path, checked the same way just before.
// A tenant's directory another uid owns (its socket_uid) is taken back
// (owner: the daemon, 0700) whenever the daemon must work in it and cannot:
// CAP_CHOWN is all a daemon that is not root needs.
#include "server/service/tenant_socket_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/tenants/socket_path.h"

namespace gpumem {
namespace {

std::atomic<uint64_t> temp_counter{0};

bool HaveProcFds() {
  static const bool have = access("/proc/self/fd", X_OK) == 0;
  return have;
}

// An address for NAME in directory fd `dir` (absolute path `abs` when the
// /proc form does not fit or /proc is missing); false if neither fits.
bool AddressOf(int dir, const std::string& name, const std::string& abs, sockaddr_un* addr) {
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  std::string p = absl::StrCat("/proc/self/fd/", dir, "/", name);
  if (!HaveProcFds() || p.size() >= sizeof(addr->sun_path)) p = abs;
  if (p.size() >= sizeof(addr->sun_path)) return false;
  memcpy(addr->sun_path, p.data(), p.size());
  return true;
}

// Makes `dir` and its parents (the configured tenant_socket_dir itself,
// which the admin chose: followed as the system resolves it).
absl::Status MakeDirs(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "tenant_socket_dir ", dir, " exists and is not a directory"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status parent = MakeDirs(dir.substr(0, slash));
    if (!parent.ok()) return parent;
  }
  if (mkdir(dir.c_str(), 0711) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create tenant_socket_dir ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

// FAILED_PRECONDITION if directory fd `d` (named `name`) may be written by
// group or others: they could swap what is in it.
absl::Status CheckNotShared(int d, const std::string& name) {
  struct stat st;
  if (fstat(d, &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot look at ", name, ": ", strerror(errno)));
  }
  if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "directory ", name, " is writable by group or others (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777),
        "), so the socket could be swapped; make it 0711 or 0755"));
  }
  if ((st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "directory ", name, " is a shared sticky directory (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), "); tenant sockets need one of their own"));
  }
  return absl::OkStatus();
}

// The daemon may list, make and remove entries in directory fd `d`.
bool CanWorkIn(int d) { return faccessat(d, ".", R_OK | W_OK | X_OK, AT_EACCESS) == 0; }

// Directory fd `d` (named `name`) made the daemon's own, mode 0700, so it
// can work in it: another uid's directory is chowned back first (CAP_CHOWN).
absl::Status TakeDir(int d, const std::string& name) {
  struct stat st;
  if (fstat(d, &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot look at ", name, ": ", strerror(errno)));
  }
  if (st.st_uid != geteuid() && fchown(d, geteuid(), static_cast<gid_t>(-1)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot take back directory ", name, " (owner uid ", st.st_uid, "): ", strerror(errno),
        errno == EPERM ? " (gpumemd needs CAP_CHOWN to manage sockets it gave to other uids)"
                       : ""));
  }
  if ((st.st_mode & 07777) != 0700 && fchmod(d, 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make directory ", name, " mode 0700: ", strerror(errno)));
  }
  return absl::OkStatus();
}

// Opens tenant directory `name` in `parent` (absolute: `abs`) without
// following a symlink, taking it back first (TakeDir, through its parent,
// which only the daemon may change) when the daemon may not open it;
// `*made`: it was missing and made (0700), when `make`.
absl::StatusOr<int> OpenTenantDir(int parent, const std::string& name, const std::string& abs,
                                  const std::string& path, bool make, bool* made) {
  if (made != nullptr) *made = false;
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int d = openat(parent, name.c_str(), kFlags);
  if (d < 0 && errno == ENOENT && make) {
    if (mkdirat(parent, name.c_str(), 0700) == 0) {
      if (made != nullptr) *made = true;
    } else if (errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create directory ", abs, ": ", strerror(errno)));
    }
    d = openat(parent, name.c_str(), kFlags);
  }
  struct stat st;
  if (d < 0 && errno == EACCES &&
      fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
    // Another uid's (a socket_uid's): taken back by name (the parent is the
    // daemon's, so the name cannot be swapped meanwhile), then opened.
    if (fchownat(parent, name.c_str(), geteuid(), static_cast<gid_t>(-1), AT_SYMLINK_NOFOLLOW) != 0 ||
        fchmodat(parent, name.c_str(), 0700, 0) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot take back directory ", abs, " (owner uid ", st.st_uid, "): ", strerror(errno),
          errno == EPERM ? " (gpumemd needs CAP_CHOWN to manage sockets it gave to other uids)"
                         : ""));
    }
    d = openat(parent, name.c_str(), kFlags);
  }
  if (d < 0) {
    const int err = errno;
    if (made != nullptr && *made) unlinkat(parent, name.c_str(), AT_REMOVEDIR);
    if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "socket path ", path, ": ", abs, " is a symlink (socket paths may not pass "
          "through symlinks)"));
    }
    if (err == ENOTDIR || err == ELOOP) {
      return absl::InvalidArgumentError(
          absl::StrCat("socket path ", path, ": ", abs, " is not a directory"));
    }
    if (err == ENOENT) {
      return absl::FailedPreconditionError(absl::StrCat("socket path ", path, ": no directory ", abs));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open directory ", abs, ": ", strerror(err)));
  }
  return d;
}

// Opens the directories from `socket_dir` to the one holding `path` with
// O_NOFOLLOW (none made; the last, the tenant's, taken back if need be);
// `dirs` gets the fds, the caller closes them.
absl::Status OpenExisting(const std::string& socket_dir, const std::string& path,
                          std::vector<int>* dirs, std::string* name) {
  if (path.size() <= socket_dir.size() + 1 ||
      path.compare(0, socket_dir.size() + 1, socket_dir + "/") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path ", path, " is not inside tenant_socket_dir ", socket_dir));
  }
  std::vector<std::string> parts = absl::StrSplit(path.substr(socket_dir.size() + 1), '/');
  if (parts.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path ", path, " is directly in tenant_socket_dir ", socket_dir,
        "; a tenant's socket has a directory of its own"));
  }
  const int root = open(socket_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open tenant_socket_dir ", socket_dir, ": ", strerror(errno)));
  }
  dirs->push_back(root);
  *name = parts.back();
  parts.pop_back();
  const std::string own = parts.back();
  parts.pop_back();
  for (const std::string& part : parts) {
    const int d = openat(dirs->back(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "socket path ", path, ": cannot open ", part, " without following symlinks: ",
          strerror(errno)));
    }
    dirs->push_back(d);
  }
  absl::StatusOr<int> d =
      OpenTenantDir(dirs->back(), own, path.substr(0, path.rfind('/')), path, false, nullptr);
  if (!d.ok()) return d.status();
  dirs->push_back(*d);
  return absl::OkStatus();
}

// Gives the entry `name` of directory fd `dir` (or `dir` itself, when
// `name` is empty) owner `uid`, group `gid` and mode `mode`: the mode
// first (once another uid owns it, only CAP_FOWNER could), taking it back
// (chown to the daemon, CAP_CHOWN) when another uid owns it already.
absl::Status SetAccess(int dir, const std::string& name, const std::string& what, uid_t uid,
                       gid_t gid, mode_t mode) {
  const bool self = name.empty();
  auto chmod_it = [&] {
    return self ? fchmod(dir, mode) : fchmodat(dir, name.c_str(), mode, 0);
  };
  auto chown_it = [&](uid_t u, gid_t g) {
    return self ? fchown(dir, u, g) : fchownat(dir, name.c_str(), u, g, AT_SYMLINK_NOFOLLOW);
  };
  struct stat st;
  if ((self ? fstat(dir, &st) : fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot look at ", what, ": ", strerror(errno)));
  }
  if ((st.st_mode & 07777) != mode) {
    int rc = chmod_it();
    int err = errno;
    if (rc != 0 && err == EPERM && st.st_uid != geteuid()) {
      // Another uid's: taken back first.
      rc = chown_it(geteuid(), static_cast<gid_t>(-1));
      err = errno;
      if (rc == 0) {
        st.st_uid = geteuid();
        rc = chmod_it();
        err = errno;
      }
    }
    if (rc != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot make ", what, " mode ", absl::StrFormat("%04o", mode), ": ", strerror(err),
          err == EPERM ? " (another uid owns it; gpumemd needs CAP_CHOWN to take it back)" : ""));
    }
  }
  if ((st.st_uid != uid || st.st_gid != gid) && chown_it(uid, gid) != 0) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot give ", what, " owner ", uid, " group ", gid, ": ", strerror(err),
        err == EPERM ? absl::StrCat(" (gpumemd runs as uid ", geteuid(),
                                    " without CAP_CHOWN; deploy/gpumemd.service grants it)")
                     : std::string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetTenantSocketAccess(const std::string& socket_dir, const std::string& path,
                                   uid_t uid, gid_t gid, mode_t mode) {
  // Root stands for the daemon itself when it does not run as root (root
  // reaches every socket anyway).
  if (uid == 0) uid = geteuid();
  if (gid == 0) gid = getegid();
  const mode_t dir_mode =
      tenants::SocketDirMode(tenants::SocketAccess{uid, gid, mode}, uid == geteuid());
  std::vector<int> dirs;
  std::string name;
  absl::Status result = OpenExisting(socket_dir, path, &dirs, &name);
  if (result.ok()) {
    const int dir = dirs.back();
    const std::string dir_name = path.substr(0, path.rfind('/'));
    struct stat st, dst;
    if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || fstat(dir, &dst) != 0) {
      result = absl::FailedPreconditionError(
          absl::StrCat("cannot look at ", path, ": ", strerror(errno)));
    } else if (S_ISLNK(st.st_mode)) {
      result = absl::InvalidArgumentError(absl::StrCat(path, " is a symlink, not the socket"));
    } else if (!S_ISSOCK(st.st_mode)) {
      result = absl::FailedPreconditionError(absl::StrCat(path, " is not a socket"));
    } else if ((st.st_mode & 07777) == mode && st.st_uid == uid && st.st_gid == gid &&
               (dst.st_mode & 07777) == dir_mode && dst.st_uid == uid && dst.st_gid == gid) {
      // As asked already: nothing changes (a reload re-applies every access).
    } else {
      // The directory taken back while it changes, if the daemon may not
      // work in it; the socket, then the directory, given their access.
      if (!CanWorkIn(dir)) result = TakeDir(dir, dir_name);
      if (result.ok()) result = SetAccess(dir, name, path, uid, gid, mode);
      if (result.ok()) result = SetAccess(dir, "", dir_name, uid, gid, dir_mode);
    }
  }
  for (int d : dirs) close(d);
  return result;
}

absl::StatusOr<std::unique_ptr<TenantSocketFile>> TenantSocketFile::Make(
    const std::string& socket_dir, const std::string& path) {
  if (path.size() <= socket_dir.size() + 1 ||
      path.compare(0, socket_dir.size() + 1, socket_dir + "/") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path ", path, " is not inside tenant_socket_dir ", socket_dir));
  }
  if (absl::Status made = MakeDirs(socket_dir); !made.ok()) return made;
  std::unique_ptr<TenantSocketFile> f(new TenantSocketFile());
  f->path_ = path;
  const int root = open(socket_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open tenant_socket_dir ", socket_dir, ": ", strerror(errno)));
  }
  f->dirs_.push_back(root);
  f->dir_names_.push_back(socket_dir);
  f->made_.push_back(false);
  if (absl::Status shared = CheckNotShared(root, socket_dir); !shared.ok()) {
    f->Remove();
    return shared;
  }
  // From here on a failure returns through `fail`, which undoes what was
  // made (the destructor: the directories made, the fds).
  auto fail = [&f](absl::Status s) -> absl::StatusOr<std::unique_ptr<TenantSocketFile>> {
    f->Remove();
    return s;
  };
  std::vector<std::string> parts = absl::StrSplit(path.substr(socket_dir.size() + 1), '/');
  if (parts.size() < 2) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "socket path ", path, " is directly in tenant_socket_dir ", socket_dir,
        "; a tenant's socket has a directory of its own")));
  }
  f->name_ = parts.back();
  parts.pop_back();
  std::string sofar = socket_dir;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    absl::StrAppend(&sofar, "/", part);
    const int parent = f->dirs_.back();
    bool made = false;
    if (i + 1 == parts.size()) {
      // The tenant's own directory.
      absl::StatusOr<int> d = OpenTenantDir(parent, part, sofar, path, true, &made);
      if (!d.ok()) return fail(d.status());
      f->dirs_.push_back(*d);
      f->dir_names_.push_back(part);
      f->made_.push_back(made);
      if (!CanWorkIn(*d)) {
        if (absl::Status taken = TakeDir(*d, sofar); !taken.ok()) return fail(taken);
      }
      if (absl::Status shared = CheckNotShared(*d, sofar); !shared.ok()) return fail(shared);
      break;
    }
    int d = openat(parent, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0 && errno == ENOENT) {
      if (mkdirat(parent, part.c_str(), 0711) == 0) {
        made = true;
      } else if (errno != EEXIST) {
        return fail(absl::FailedPreconditionError(
            absl::StrCat("cannot create directory ", sofar, ": ", strerror(errno))));
      }
      d = openat(parent, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (d < 0) {
      const int err = errno;
      if (made) unlinkat(parent, part.c_str(), AT_REMOVEDIR);
      struct stat st;
      if (fstatat(parent, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "socket path ", path, ": ", sofar, " is a symlink (socket paths may not pass "
            "through symlinks)")));
      }
      if (err == ENOTDIR || err == ELOOP) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("socket path ", path, ": ", sofar, " is not a directory")));
      }
      return fail(absl::FailedPreconditionError(
          absl::StrCat("cannot open directory ", sofar, ": ", strerror(err))));
    }
    f->dirs_.push_back(d);
    f->dir_names_.push_back(part);
    f->made_.push_back(made);
    if (absl::Status shared = CheckNotShared(d, sofar); !shared.ok()) return fail(shared);
  }
  const int dir = f->dirs_.back();

  // What is there now.
  struct stat st;
  if (fstatat(dir, f->name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "socket path ", path, " is a symlink; refusing to make a socket through it")));
    }
    if (!S_ISSOCK(st.st_mode)) {
      return fail(absl::AlreadyExistsError(absl::StrCat(
          path, " exists and is not a socket; refusing to replace it")));
    }
    sockaddr_un probe_addr;
    if (AddressOf(dir, f->name_, path, &probe_addr)) {
      const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool live =
          connect(probe, reinterpret_cast<sockaddr*>(&probe_addr), sizeof(probe_addr)) == 0;
      close(probe);
      if (live) {
        return fail(absl::AlreadyExistsError(absl::StrCat(
            "something is serving ", path, " already (another daemon, or this one's main "
            "socket); choose another socket path")));
      }
    }
    unlinkat(dir, f->name_.c_str(), 0);  // stale: left by a daemon that died
  } else if (errno != ENOENT) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("cannot look at ", path, ": ", strerror(errno))));
  }
  // The directory is the daemon's alone until the socket's access is set.
  if (absl::Status closed = SetAccess(dir, "", sofar, geteuid(), getegid(), 0700); !closed.ok()) {
    return fail(closed);
  }

  // Bound and listening under a temporary name, then renamed into place.
  const std::string tmp = absl::StrCat(".gpumemd-", getpid(), "-", temp_counter.fetch_add(1));
  const size_t slash = path.rfind('/');
  sockaddr_un addr;
  if (!AddressOf(dir, tmp, path.substr(0, slash + 1) + tmp, &addr)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is too long for a Unix socket address")));
  }
  f->fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (f->fd_ < 0) {
    return fail(absl::InternalError(absl::StrCat("socket: ", strerror(errno))));
  }
  if (bind(f->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("cannot bind a socket in ", path.substr(0, slash), ": ", strerror(errno))));
  }
  auto fail_bound = [&](absl::Status s) {
    unlinkat(dir, tmp.c_str(), 0);
    return fail(std::move(s));
  };
  // Root-only until SetTenantSocketAccess gives it its tenant's access
  // (the umask may have left it wider).
  if (fchmodat(dir, tmp.c_str(), 0600, 0) != 0) {
    return fail_bound(absl::FailedPreconditionError(
        absl::StrCat("cannot make ", path, " mode 0600: ", strerror(errno))));
  }
  // The kernel's largest backlog, as for the main socket.
  if (listen(f->fd_, SOMAXCONN) != 0) {
    return fail_bound(absl::InternalError(absl::StrCat("listen: ", strerror(errno))));
  }
  if (fstatat(dir, tmp.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return fail_bound(absl::FailedPreconditionError(
        absl::StrCat("cannot look at the socket made for ", path, ": ", strerror(errno))));
  }
  f->dev_ = st.st_dev;
  f->ino_ = st.st_ino;
  if (renameat(dir, tmp.c_str(), dir, f->name_.c_str()) != 0) {
    return fail_bound(absl::FailedPreconditionError(
        absl::StrCat("cannot move the socket into place at ", path, ": ", strerror(errno))));
  }
  return f;
}

TenantSocketFile::~TenantSocketFile() { Remove(); }

void TenantSocketFile::Remove() {
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
    struct stat st;
    if (!dirs_.empty() &&
        fstatat(dirs_.back(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == dev_ && st.st_ino == ino_) {
      // A directory given to another uid is taken back first, if need be.
      if (!CanWorkIn(dirs_.back())) TakeDir(dirs_.back(), path_).IgnoreError();
      unlinkat(dirs_.back(), name_.c_str(), 0);
    }
  }
  for (size_t i = dirs_.size(); i-- > 0;) {
    close(dirs_[i]);
    if (i > 0 && made_[i]) unlinkat(dirs_[i - 1], dir_names_[i].c_str(), AT_REMOVEDIR);
  }
  dirs_.clear();
  dir_names_.clear();
  made_.clear();
}

}  // namespace gpumem
