// PluginState: what gpumemd-dra has prepared, kept in one JSON file so that
// a restarted plugin answers the kubelet exactly as before and can undo
// what it made.
//
// A claim is recorded as PREPARING before anything is made for it (tenant,
// socket directory, CDI spec) and as PREPARED once all of it exists, so
// that after a crash at any point the file names everything that may exist:
// the next Prepare of that claim finishes it (every step is idempotent),
// and Unprepare removes it. Every change is written with
// WriteFileAtomically before the call that made it returns. The pool
// generation of the published ResourceSlice is kept here too, so that it
// only ever grows across restarts.
// Thread-safe.
#ifndef GPUMEMD_CLIENT_DRA_PLUGIN_STATE_H_
#define GPUMEMD_CLIENT_DRA_PLUGIN_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gpumem {
namespace dra {

// One device of a prepared claim, as the kubelet is told and as the
// tenant's quota was made.
struct PreparedDevice {
  std::string request;
  std::string pool;
  std::string device;  // slice device name
  std::string uuid;    // gpumemd's device UUID (the quota's selector)
  uint64_t bytes = 0;  // consumed capacity charged to this device
};

struct PreparedClaim {
  enum class Phase { kPreparing, kPrepared };
  Phase phase = Phase::kPreparing;
  std::string ns, name, uid;
  std::string tenant;      // "claim-<uid>"
  std::string socket_dir;  // <claims_dir>/claim-<uid>
  std::string socket;      // the tenant's socket, as gpumemd answered
  std::string cdi_spec;    // path of the CDI spec file
  std::string cdi_device;  // the CDI device id
  std::vector<PreparedDevice> devices;
};

class PluginState {
 public:
  // Reads `path` (a missing file is an empty state). INVALID_ARGUMENT, naming
  // the file, when it is not a state file: the plugin must not guess what
  // it prepared.
  static absl::StatusOr<std::unique_ptr<PluginState>> Load(const std::string& path);

  std::optional<PreparedClaim> Find(const std::string& uid) const;
  std::vector<PreparedClaim> All() const;
  // Records (replaces) a claim and writes the file.
  absl::Status Put(const PreparedClaim& claim);
  // Forgets a claim and writes the file (a claim not recorded is fine).
  absl::Status Remove(const std::string& uid);

  int64_t slice_generation() const;
  absl::Status SetSliceGeneration(int64_t generation);

  const std::string& path() const { return path_; }

 private:
  explicit PluginState(std::string path) : path_(std::move(path)) {}
  absl::Status SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<std::string, PreparedClaim> claims_ ABSL_GUARDED_BY(mu_);
  int64_t slice_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_PLUGIN_STATE_H_
