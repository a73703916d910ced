#include "server/systemd/fd_store.h"

#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include <iostream>

#include "absl/strings/str_cat.h"

namespace gpumem {

FdStore::FdStore() : enabled_(getenv("NOTIFY_SOCKET") != nullptr) {}

bool FdStore::ValidName(const std::string& name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status FdStore::Deposit(const std::string& name, int fd) {
  if (!enabled_) return absl::OkStatus();
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("fd store name \"", name, "\" is not valid"));
  }
  const std::string message = absl::StrCat("FDSTORE=1\nFDNAME=", name, "\nFDPOLL=0");
  const int r = sd_pid_notify_with_fds(0, /*unset_environment=*/0, message.c_str(), &fd, 1);
  if (r <= 0) {
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "systemd's fd store did not take ", name, ": ",
        r < 0 ? strerror(-r) : "no NOTIFY_SOCKET"));
    if (!warned_.exchange(true)) {
      std::cerr << "gpumemd: " << s.message()
                << " (is FileDescriptorStoreMax= set high enough?); slabs not stored there "
                   "need their clients to give their handles back after a restart\n";
    }
    return s;
  }
  return absl::OkStatus();
}

void FdStore::Remove(const std::string& name) {
  if (!enabled_ || !ValidName(name)) return;
  const std::string message = absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name);
  sd_notify(/*unset_environment=*/0, message.c_str());
}

}  // namespace gpumem
