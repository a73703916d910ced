// Files that are either wholly old or wholly new: the plugin's state file and
// its CDI specs, which the container runtime may read at any moment and
// which must survive a crash of the plugin mid-write.
//
// WriteFileAtomically writes a temporary file beside the target, fsyncs it,
// renames it over the target and fsyncs the directory. A reader sees the old
// contents or the new, never a part; after a crash the target holds one of
// them and at most a stray "<name>.tmp.<pid>" is left (removed by the next
// write of the same file from the same pid, and harmless otherwise).
#ifndef GPUMEMD_CLIENT_DRA_ATOMIC_FILE_H_
#define GPUMEMD_CLIENT_DRA_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpumem {
namespace dra {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 int mode = 0644);

// The whole file; NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Removes the file and fsyncs its directory; a file already gone is fine.
absl::Status RemoveFileDurably(const std::string& path);

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_ATOMIC_FILE_H_
