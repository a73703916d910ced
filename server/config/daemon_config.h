// The daemon's config file (gpumem.v1.DaemonConfig, protobuf text format):
// read, parsed and validated as a whole, both at start and on SIGHUP.
//
// Guarantees: LoadDaemonConfig returns a config only if every field in it
// is acceptable, so a caller may apply any part of it without further
// checks. Otherwise the status is INVALID_ARGUMENT (NOT_FOUND when the file
// cannot be read) and its message starts "FILE:LINE:COLUMN: " (1-based)
// naming the first bad place and saying why, e.g.
//   /etc/gpumemd/gpumemd.textproto:7:14: pool.slab_size "1Gx": ...
// An empty path is an empty (valid) config.
#ifndef GPUMEMD_SERVER_CONFIG_DAEMON_CONFIG_H_
#define GPUMEMD_SERVER_CONFIG_DAEMON_CONFIG_H_

#include <string>

#include <google/protobuf/text_format.h>

#include "absl/status/statusor.h"
#include "proto/gpumem/v1/config.pb.h"

namespace gpumem {

// `locations` (may be null) receives where each field was written, for
// checks made later by other parts (their errors can name the line too).
absl::StatusOr<v1::DaemonConfig> LoadDaemonConfig(
    const std::string& path,
    google::protobuf::TextFormat::ParseInfoTree* locations = nullptr);

// The same checks on text already read (`name` is used in messages).
absl::StatusOr<v1::DaemonConfig> ParseDaemonConfig(
    const std::string& name, const std::string& text,
    google::protobuf::TextFormat::ParseInfoTree* locations = nullptr);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_DAEMON_CONFIG_H_
