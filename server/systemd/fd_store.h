// FdStore: systemd's file-descriptor store, through libsystemd: file
// descriptors the service manager keeps for the daemon while it restarts
// (crash, kill -9, `systemctl restart`) and hands back to the next one with
// LISTEN_FDS/LISTEN_FDNAMES. gpumemd keeps there what must outlive its
// process and cannot live in a file: slab handles (memfds, CUDA VMM fds) and
// its listening socket. Invariants: without NOTIFY_SOCKET every call is a
// no-op and enabled() is false; a refused Deposit never stops the daemon.
// Thread-safe.
#ifndef GPUMEMD_SERVER_SYSTEMD_FD_STORE_H_
#define GPUMEMD_SERVER_SYSTEMD_FD_STORE_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"

namespace gpumem {

class FdStore {
 public:
  FdStore();
  bool enabled() const { return enabled_; }
  // Sends FDSTORE=1 with FDNAME=name and FDPOLL=0 (systemd must not drop a
  // memfd or a quiet socket on POLLHUP). The unit must allow enough fds
  // (FileDescriptorStoreMax=); a Deposit the manager refuses is logged,
  // once, and the daemon carries on: that slab then relies on its clients to
  // give its handle back after a restart.
  absl::Status Deposit(const std::string& name, int fd);
  // Sends FDSTOREREMOVE=1 for the name.
  void Remove(const std::string& name);
  // At most 255 characters of [A-Za-z0-9_.-] (systemd's rule; others are
  // refused, saying so).

  static bool ValidName(const std::string& name);

 private:
  const bool enabled_;
  std::atomic<bool> warned_{false};
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SYSTEMD_FD_STORE_H_
