// Daemon: gpumemd's parts, wired together, with its life in four steps:
// Start, Reload, Drain and Stop (or StopForRestart). main.cc only reads the
// command line and the config file into Settings and turns signals into
// these calls. Invariants: a start-up error is returned naming what failed,
// and nothing is left half-started that the destructor would not undo; a
// bad config on reload changes nothing; Stop releases everything and
// StopForRestart nothing. Not thread-safe: one thread (main's) drives it.
#ifndef GPUMEMD_SERVER_DAEMON_DAEMON_H_
#define GPUMEMD_SERVER_DAEMON_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/status/status.h"
#include "server/config/settings.h"

namespace gpumem {

class Daemon {
 public:
  // `flags` is kept: a reloaded file is resolved under the same flags.
  Daemon(CommandLine flags, Settings settings,
         std::unique_ptr<google::protobuf::TextFormat::ParseInfoTree> locations);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // The backend, the ledger, the tenant directory and quotas, the core
  // (MemoryBroker), the gRPC server with its services on shared completion
  // queues, metrics if asked, and the listening socket (bound, or taken from
  // systemd); then tells systemd it is ready.
  absl::Status Start();
  // SIGHUP: the whole file is loaded and checked; a bad one is refused with
  // FILE:LINE:COLUMN and the config in force stays; a good one goes through
  // ApplyReloadableConfig (server/config/reloadable.h). OK when the new file
  // is in force; otherwise why it was refused.
  absl::Status Reload();
  // SIGTERM/SIGINT: Allocate answers UNAVAILABLE, waiting requests are
  // answered, health checks say NOT_SERVING, other calls keep working; the
  // daemon waits up to drain_seconds for live allocations to be freed.
  // `why` names the cause in the log ("signal 15"); `cut_short` is polled
  // while waiting, and true ends the wait (a second signal).
  void Drain(const std::string& why, const std::function<bool()>& cut_short);
  // Stops accepting (the socket file is removed unless systemd owns it),
  // finishes in-flight gRPC calls, drains the worker pools and the
  // completion queues, releases every allocation and slab, commits the
  // ledger. Idempotent; the destructor calls it.
  void Stop();
  // Instead of Drain and Stop (SIGUSR2, and what `systemctl stop` and
  // `systemctl restart` send under deploy/gpumemd.service): answers every
  // call, then keeps every allocation, slab and session as they are for the
  // next daemon (the state file, systemd's fd store) and exits; nothing is
  // released.
  void StopForRestart();

 private:
  struct Parts;  // daemon.cc
  absl::Status StartParts();
  // Before serving: takes back what the last daemon kept (state file, fd
  // store) and reconciles the ledger with what survived.
  void RestoreFromPrevious();
  void StopKeeping(bool quiet);

  const CommandLine flags_;
  Settings settings_;
  std::unique_ptr<google::protobuf::TextFormat::ParseInfoTree> locations_;
  std::unique_ptr<Parts> parts_;
  bool stopped_ = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_DAEMON_DAEMON_H_
