// Settings: every setting of the daemon, resolved once: a command-line flag
// wins over the config file, the file over the built-in default.
//
// The settings are the rows of setting_table.h; CommandLine and Settings
// have one member per row, made from it, and ResolveSettings walks the rows
// in order. It is the one place the three sources meet, both at start and
// on a reload (flags given at start keep winning over a reloaded file), so
// start and reload cannot disagree.
//
// Guarantees: ResolveSettings returns settings only if every value parses
// and passes its row's rule; otherwise INVALID_ARGUMENT naming the flag
// (--name) or the file's field and saying why. Each setting remembers where
// its value came from, for the daemon's start and reload lines ("(flag)",
// "(config)", "(default)"). The tenant section is not here: it is the
// tenant directory's (server/tenants/tenant_directory.h), built from the file.
#ifndef GPUMEMD_SERVER_CONFIG_SETTINGS_H_
#define GPUMEMD_SERVER_CONFIG_SETTINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/gpumem/v1/config.pb.h"
#include "server/backend/backend.h"
#include "server/config/setting_row.h"
#include "server/config/setting_table.h"

namespace gpumem {

// What the command line said; nullopt: not given.
struct CommandLine {
  std::optional<std::string> config;
#define GPUMEMD_COMMAND_LINE_MEMBER(FLAG, MEMBER, KIND, ...) \
  std::optional<setting_kind::KIND::Flag> FLAG;
  GPUMEMD_SETTINGS(GPUMEMD_COMMAND_LINE_MEMBER)
#undef GPUMEMD_COMMAND_LINE_MEMBER
};

enum class Source { kDefault, kConfig, kFlag };
// "default", "config", "flag".
const char* SourceName(Source source);

template <typename T>
struct Setting {
  T value;
  Source source = Source::kDefault;
};

struct Settings {
  // The config file ("" for none) and what it said (validated as a whole by
  // LoadDaemonConfig).
  std::string config_path;
  v1::DaemonConfig file;

  // One member per row of setting_table.h, holding its default until
  // resolved.
#define GPUMEMD_SETTINGS_MEMBER(FLAG, MEMBER, KIND, FIELD, DEFAULT, ...) \
  Setting<setting_kind::KIND::Value> MEMBER{DEFAULT};
  GPUMEMD_SETTINGS(GPUMEMD_SETTINGS_MEMBER)
#undef GPUMEMD_SETTINGS_MEMBER

  // Derived by the rows' Finish: sim_devices parsed, sim_topology parsed,
  // and sim_slab_create_delay parsed (slab creation on these devices sleeps
  // first: tests, benchmarks).
  std::vector<uint64_t> sim_device_sizes;
  std::vector<PeerLink> sim_links;
  std::vector<std::pair<uint32_t, absl::Duration>> sim_slab_create_delays;
  // device_headroom parsed: unset for "auto".
  std::optional<uint64_t> device_headroom_bytes;
};

// `file` as LoadDaemonConfig accepted it, from `path`.
absl::StatusOr<Settings> ResolveSettings(const CommandLine& flags, const std::string& path,
                                         const v1::DaemonConfig& file);

// The rows of setting_table.h, in its order.
absl::Span<const SettingRow> SettingRows();

// The defaults, as `gpumemd --help` prints them ("--slab_size=1GiB ...").
std::string DefaultsText();

// On reload: the config fields of restart-only rows whose value, as
// written, differs between the two files (an edit is reported even where a
// flag overrides it now), in table order.
std::vector<std::string> RestartOnlyChanges(const Settings& running, const Settings& next);

// On reload: `next` keeps `running`'s restart-only settings (and what is
// derived from them), so it says what is in force.
void KeepRestartOnly(const Settings& running, Settings* next);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_CONFIG_SETTINGS_H_
