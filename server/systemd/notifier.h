// SystemdNotifier: tells the service manager how the daemon is doing, through
// libsystemd's sd_notify (the protocol is systemd's, not re-implemented here).
// Invariants: without NOTIFY_SOCKET in the environment every call is a
// no-op, so the daemon behaves the same outside systemd; a hung core stops
// the watchdog pings, so systemd restarts it. Every method may be called
// from any thread.
#ifndef GPUMEMD_SERVER_SYSTEMD_NOTIFIER_H_
#define GPUMEMD_SERVER_SYSTEMD_NOTIFIER_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpumem {

class SystemdNotifier {
 public:
  SystemdNotifier() = default;
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // "READY=1" with a STATUS= line.
  void Ready(absl::string_view status);
  void Reloading(absl::string_view status);  // RELOADING=1; Ready() ends it
  // "STOPPING=1".
  void Stopping(absl::string_view status);
  // Replaces the one-line status.
  void Status(absl::string_view status);

  // Zero when systemd asked for no watchdog.
  static absl::Duration WatchdogInterval();
  // Starts the ping thread if a watchdog was asked for (WATCHDOG_USEC, and
  // WATCHDOG_PID naming this process if set): it sends "WATCHDOG=1" every
  // half of WATCHDOG_USEC until the notifier is destroyed or StopWatchdog()
  // is called. `alive` (a cheap liveness probe of the daemon's core) is
  // called before each ping and must return quickly; false skips the ping.
  void StartWatchdog(std::function<bool()> alive);
  void StopWatchdog();

 private:
  void Send(const std::string& message);

  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mu_
  std::thread watchdog_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SYSTEMD_NOTIFIER_H_
