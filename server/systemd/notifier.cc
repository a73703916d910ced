// sd_notify wrappers and the watchdog thread (see notifier.h).
#include "server/systemd/notifier.h"

#include <systemd/sd-daemon.h>

#include <iostream>

#include <string.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace gpumem {
namespace {

// STATUS= is one line: a newline would start another assignment.
std::string OneLine(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"\n", " "}});
}

}  // namespace

SystemdNotifier::~SystemdNotifier() { StopWatchdog(); }

void SystemdNotifier::Send(const std::string& message) {
  int r = sd_notify(/*unset_environment=*/0, message.c_str());
  if (r < 0) {
    std::cerr << "gpumemd: sd_notify: " << strerror(-r) << "\n";
  }
}

void SystemdNotifier::Ready(absl::string_view status) {
  Send(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Reloading(absl::string_view status) {
  Send(absl::StrCat("RELOADING=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Stopping(absl::string_view status) {
  Send(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Status(absl::string_view status) {
  Send(absl::StrCat("STATUS=", OneLine(status)));
}

absl::Duration SystemdNotifier::WatchdogInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) {
    return absl::ZeroDuration();
  }
  return absl::Microseconds(usec);
}

void SystemdNotifier::StartWatchdog(std::function<bool()> alive) {
  const absl::Duration interval = WatchdogInterval();
  if (interval == absl::ZeroDuration() || watchdog_.joinable()) return;
  // Half the deadline, as sd_watchdog_enabled(3) recommends.
  const absl::Duration period = interval / 2;
  watchdog_ = std::thread([this, period, alive = std::move(alive)] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      const bool ok = alive();
      if (ok) Send("WATCHDOG=1");
      lock.lock();
      wake_.wait_for(lock, absl::ToChronoMicroseconds(period), [this] { return stop_; });
    }
  });
}

void SystemdNotifier::StopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

}  // namespace gpumem
