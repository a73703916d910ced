// gpumemd: the daemon's entry point, a wiring list.
//
// Reads the command line and the optional config file into Settings (flags
// over file over defaults, server/config/settings.h), builds the Daemon
// (server/daemon/daemon.h), and turns signals into its steps:
//  - SIGHUP: Reload (a bad file is logged with FILE:LINE:COLUMN and changes
//    nothing);
//  - SIGTERM/SIGINT: Drain (a second one cuts the wait short), then Stop,
//    exit 0.
//  - SIGUSR2: StopForRestart, exit kRestartExitStatus (75): everything is
//    kept for the next daemon (deploy/gpumemd.service sends it for stop and
//    restart, and restarts on this status).
// Start-up errors are one line on stderr and exit status 1.
#include <signal.h>
#include <sys/resource.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <google/protobuf/text_format.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/config/daemon_config.h"
#include "server/config/setting_table.h"
#include "server/config/settings.h"
#include "server/daemon/daemon.h"

// Every setting's flag is optional: not given, the config file decides, then
// the built-in default (listed by --help). One flag per row of the settings
// table (server/config/setting_table.h), defined here so that --help lists
// them as this file's.
ABSL_FLAG(std::optional<std::string>, config, std::nullopt,
          "daemon config file, protobuf text format (gpumem.v1.DaemonConfig)");
#define GPUMEMD_DEFINE_FLAG(FLAG, MEMBER, KIND, FIELD, DEFAULT, RULE, WHEN, SHOWN, HELP) \
  ABSL_FLAG(std::optional<gpumem::setting_kind::KIND::Flag>, FLAG, std::nullopt, HELP);
GPUMEMD_SETTINGS(GPUMEMD_DEFINE_FLAG)
#undef GPUMEMD_DEFINE_FLAG
ABSL_FLAG(bool, check_config, false,
          "read the config file and flags as a start would, say what is wrong "
          "(FILE:LINE:COLUMN) or \"config ok\", and exit (1 or 0) without starting");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Abseil's lock-order checking on every absl::Mutex (gRPC's own locks "
          "included): a debugging aid that costs a global lock per acquisition in "
          "Debian's Abseil build; the test fixtures turn it on");

namespace gpumem {
namespace {

CommandLine FromFlags() {
  CommandLine c;
  c.config = absl::GetFlag(FLAGS_config);
#define GPUMEMD_READ_FLAG(FLAG, ...) c.FLAG = absl::GetFlag(FLAGS_##FLAG);
  GPUMEMD_SETTINGS(GPUMEMD_READ_FLAG)
#undef GPUMEMD_READ_FLAG
  return c;
}

// EX_TEMPFAIL: stopped for a restart (deploy/gpumemd.service restarts on it).
constexpr int kRestartExitStatus = 75;

int Fail(const absl::Status& s) {
  std::cerr << "gpumemd: " << s.message() << std::endl;
  return 1;
}

int Run() {
  const CommandLine flags = FromFlags();
  const std::string path = flags.config.value_or("");
  auto locations = std::make_unique<google::protobuf::TextFormat::ParseInfoTree>();
  absl::StatusOr<v1::DaemonConfig> file = LoadDaemonConfig(path, locations.get());
  if (!file.ok()) return Fail(file.status());
  absl::StatusOr<Settings> settings = ResolveSettings(flags, path, *file);
  if (!settings.ok()) return Fail(settings.status());
  if (absl::GetFlag(FLAGS_check_config)) {
    std::cout << "gpumemd: config ok" << (path.empty() ? "" : ": ") << path << std::endl;
    return 0;
  }

  // Signals are handled by sigwait below; every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // The soft RLIMIT_NOFILE is raised to the hard one by Daemon::Start,
  // which says so.

  Daemon daemon(flags, *std::move(settings), std::move(locations));
  if (absl::Status started = daemon.Start(); !started.ok()) return Fail(started);

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) daemon.Reload().IgnoreError();
  if (sig == SIGUSR2) {
    daemon.StopForRestart();
    return kRestartExitStatus;
  }

  // A second SIGTERM/SIGINT ends the drain at once; SIGHUP stays pending (a
  // reload while stopping means nothing).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  daemon.Drain(absl::StrCat("signal ", sig), [&stop_signals] {
    struct timespec now = {0, 0};
    return sigtimedwait(&stop_signals, nullptr, &now) > 0;
  });
  daemon.Stop();
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(absl::StrCat(
      "gpumemd: lends the memory of every GPU on this machine to client processes.\n"
      "Usage: gpumemd [--config=FILE] [--flag=value ...]; flags win over the config "
      "file, which wins over the defaults:\n  ",
      gpumem::DefaultsText()));
  // --help lists the flags of this file (Abseil's default looks for a file
  // named after the program, gpumemd.cc, and found none).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "gpumemd: unexpected argument \"" << rest[1] << "\" (see --help)\n";
    return 1;
  }
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  return gpumem::Run();
}
