// WaitCancel: the cancellation of one waiting Allocate (wait_ms), shared by
// the RPC that sent it and whoever learns its wait ticket (a backend worker,
// after the RPC may be gone). Either side may come first; each checks the
// other's flag after setting its own, so no cancel is lost (both are
// sequentially consistent). A cancel after the answer is harmless: the
// broker ignores a ticket it no longer holds.
#ifndef GPUMEMD_SERVER_SERVICE_WAIT_CANCEL_H_
#define GPUMEMD_SERVER_SERVICE_WAIT_CANCEL_H_

#include <atomic>
#include <cstdint>

#include "server/core/memory_broker.h"

namespace gpumem {

struct WaitCancel {
  std::atomic<uint64_t> ticket{0};
  std::atomic<bool> cancelled{false};

  // The request waits under `t` (MemoryBroker::AllocateOutcome::wait_ticket).
  void Waiting(MemoryBroker* broker, uint64_t t) {
    ticket.store(t);
    if (cancelled.load()) broker->CancelWait(t);
  }
  // Its caller went away: the broker answers it CANCELLED and frees its place.
  void Cancel(MemoryBroker* broker) {
    cancelled.store(true);
    if (const uint64_t t = ticket.load(); t != 0) broker->CancelWait(t);
  }
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_WAIT_CANCEL_H_
