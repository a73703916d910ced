// Write-to-temporary, fsync, rename, fsync-directory: POSIX's rename is
// atomic, and the two fsyncs order the data before the name on disk.
#include "client/dra/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace dra {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  return absl::Status(e == ENOENT ? absl::StatusCode::kNotFound
                                  : absl::StatusCode::kInternal,
                      absl::StrCat(what, " ", path, ": ", std::strerror(e)));
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory", dir);
  const int r = fsync(fd);
  close(fd);
  if (r != 0) return Errno("fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 int mode) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                      mode);
  if (fd < 0) return Errno("create", tmp);
  // The umask must not narrow the mode (the runtime reads CDI specs).
  fchmod(fd, mode);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = Errno("write", tmp);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    absl::Status s = Errno("fsync", tmp);
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno("rename to", path);
    unlink(tmp.c_str());
    return s;
  }
  return SyncDir(DirOf(path));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (64u << 20)) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, " is larger than 64 MiB"));
    }
  }
  close(fd);
  return out;
}

absl::Status RemoveFileDurably(const std::string& path) {
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("remove", path);
  }
  return SyncDir(DirOf(path));
}

}  // namespace dra
}  // namespace gpumem
