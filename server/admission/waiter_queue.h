// WaiterQueue: the order waiting requests (AllocateRequest.wait_ms) are
// served in: higher tenant priority first, then earlier arrival.
//
// It only orders values (ticket numbers, pointers); its owner (Admission)
// tries the waiters in InOrder() when memory comes back and removes those
// it served or dropped. Arrival numbers come from the queue, so two waiters
// never tie. Not thread-safe: guarded by the owner's lock.
#ifndef GPUMEMD_SERVER_ADMISSION_WAITER_QUEUE_H_
#define GPUMEMD_SERVER_ADMISSION_WAITER_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace gpumem {
namespace admission {

template <typename T>
class WaiterQueue {
 public:
  // A waiter's place; pass it back to Remove.
  using Ticket = std::pair<int64_t, uint64_t>;  // (-priority, arrival)

  Ticket Add(int32_t priority, T value) {
    Ticket t(-static_cast<int64_t>(priority), next_arrival_++);
    waiters_.emplace(t, std::move(value));
    return t;
  }
  void Remove(const Ticket& ticket) { waiters_.erase(ticket); }

  // Snapshot in serving order (the caller may Remove while walking it).
  std::vector<std::pair<Ticket, T>> InOrder() const {
    return {waiters_.begin(), waiters_.end()};
  }
  bool empty() const { return waiters_.empty(); }
  size_t size() const { return waiters_.size(); }

 private:
  uint64_t next_arrival_ = 0;
  std::map<Ticket, T> waiters_;
};

}  // namespace admission
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_ADMISSION_WAITER_QUEUE_H_
