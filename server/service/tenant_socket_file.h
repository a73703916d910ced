// TenantSocketFile: a socket tenant's listening Unix socket, made in its
// tenant's own directory inside the daemon's tenant_socket_dir, and removed
// again.
//
// The path's text was checked already (server/tenants/socket_path.h: inside
// the directory, one directory below it at least, no "." or ".."
// components); what is checked here is the filesystem. Invariants: no
// symlink below the directory is ever followed (each directory on the way
// is opened with O_NOFOLLOW from the one before, and the socket is bound
// through the last one's fd, /proc/self/fd/N/NAME); the socket and its
// directory are never open wider than asked; a failure leaves nothing
// behind but a directory closed to everyone else; nothing but a dead
// socket is ever replaced.
#ifndef GPUMEMD_SERVER_SERVICE_TENANT_SOCKET_FILE_H_
#define GPUMEMD_SERVER_SERVICE_TENANT_SOCKET_FILE_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpumem {

class TenantSocketFile {
 public:
  // `socket_dir` is made (0711) if missing; `path` is at least one
  // directory below it. Directories on the way that are missing are made,
  // mode 0711 (others may pass through, never list or change them); one
  // writable by group or others is refused FAILED_PRECONDITION, since
  // whoever may write there could swap the socket. The socket's own
  // directory (the last one) is its tenant's: made 0700 if missing, and
  // one found there (made by the DRA plugin, or left by a previous daemon)
  // is taken over: the daemon's own, 0700, until SetTenantSocketAccess
  // opens it. What may already be at the path:
  //  - nothing: the socket is made;
  //  - a socket nobody serves (left by a daemon that died): replaced;
  //  - a socket something serves: ALREADY_EXISTS;
  //  - a symlink, or a directory on the way that is a symlink or no
  //    directory: INVALID_ARGUMENT;
  //  - any other file: ALREADY_EXISTS (never replaced).
  // The socket is made root-only (the daemon's uid and gid, mode 0600) and
  // appears only once it listens (bound under a temporary name and renamed
  // into place); who else may connect is set after, by
  // SetTenantSocketAccess. On any failure nothing is left: no socket, no
  // temporary name, no directory made for it.
  static absl::StatusOr<std::unique_ptr<TenantSocketFile>> Make(const std::string& socket_dir,
                                                                const std::string& path);
  // Closes the socket and removes its file (if the file is still this
  // socket; its directory taken back first if the daemon may not work in
  // it) and the directories it made, if empty.
  ~TenantSocketFile();
  TenantSocketFile(const TenantSocketFile&) = delete;
  TenantSocketFile& operator=(const TenantSocketFile&) = delete;

  // The listening socket (non-blocking, close-on-exec).
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  TenantSocketFile() = default;
  // Closes the socket, removes the file if it is still ours, then the
  // directories made for it (if empty), and closes every directory fd.
  void Remove();

  std::string path_;
  std::string name_;  // the file's name in its directory
  int fd_ = -1;
  // The directories from tenant_socket_dir down to the socket's, opened
  // without following symlinks; made[i]: dirs[i] was made for this socket.
  std::vector<int> dirs_;
  std::vector<std::string> dir_names_;  // dirs[i]'s name in dirs[i-1]
  std::vector<bool> made_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Owner `uid`, group `gid`, mode `mode` (checked by the caller:
// tenants::CheckSocketMode) for the socket at `path` inside `socket_dir`,
// and the same owner and group for its directory, with
// tenants::SocketDirMode (only those the socket lets connect may pass
// through it); uid or gid 0 stands for the daemon's own (the same when it
// runs as root). Another owner or group needs CAP_CHOWN when the daemon is
// not root; so does changing a socket or directory another uid owns (the
// daemon takes it back first: it is closed to everyone while it changes).
// Nothing is changed when both are as asked already. Goes through the same
// O_NOFOLLOW walk as Make, and changes only a socket and its directory.
// INVALID_ARGUMENT for a symlink on the way or at the path,
// FAILED_PRECONDITION when it is no socket or cannot be changed.
absl::Status SetTenantSocketAccess(const std::string& socket_dir, const std::string& path,
                                   uid_t uid, gid_t gid, mode_t mode);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_TENANT_SOCKET_FILE_H_
