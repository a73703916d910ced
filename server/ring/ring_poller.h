// RingPoller: serves many request rings with a fixed set of worker threads,
// woken by the rings that have work, never a thread per client.
//
// One epoll set holds each ring's doorbell (its eventfd) with EPOLLONESHOT,
// the poller's own queue of rings that want another turn (a private
// eventfd, level-triggered), and a stop eventfd. At any time a ring is in
// exactly one place: armed on its doorbell, in a worker's turn, or in the
// queue; so no two workers serve a ring at once. A turn:
//   1. reads the doorbell back to 0 and sets reader_active = 1 (clients
//      stop ringing: the worker is looking);
//   2. Collects requests, handing each to the ring's handler, at most
//      per_turn in the turn; while none come it spins, for at most `spin`
//      since the last one, so a client's next call finds it awake;
//   3. stores reader_active = 0 and looks once more (request_ring.h: no
//      wake-up is lost); if a request came meanwhile it carries on with what
//      is left of per_turn (a few rounds at most);
//   4. ends: a ring that still has work goes to the back of the queue; any
//      other is armed on its doorbell again.
// The queue's eventfd is one entry of epoll's ready list, moved to its end
// each time it is reported, so rings waiting in the queue get their turns
// between the turns of rings whose doorbells rang.
//
// Guarantees: a turn does at most per_turn requests and spins at most
// `spin` past the last one, however the client floods or scribbles; a
// request published and rung for (or published while reader_active was 1)
// is collected by a later turn; a ring with work waits behind at most a
// turn of each ring ahead of it in epoll's ready list. The daemon never
// writes a ring's eventfd and reads it only with RWF_NOWAIT: the client's
// copy shares the eventfd's open file, flags included, so it could clear
// O_NONBLOCK and make a plain read or write block.
//
// Handlers run on the workers, inside RingReader::Collect; they may Answer
// at once or leave the answer to another thread (a waiting request holds
// no worker).
#ifndef GPUMEMD_SERVER_RING_RING_POLLER_H_
#define GPUMEMD_SERVER_RING_RING_POLLER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ring/ring_reader.h"

namespace gpumem {

class RingPoller {
 public:
  // Called on a worker for each request collected from `reader`'s ring.
  using Handler = std::function<void(RingReader* reader, RingRequest request)>;

  static constexpr int kDefaultPerTurn = 16;
  static constexpr absl::Duration kDefaultSpin = absl::Microseconds(20);

  // `workers` threads (at least 1); per_turn at least 1; spin zero or more.
  static absl::StatusOr<std::unique_ptr<RingPoller>> Create(
      int workers, int per_turn = kDefaultPerTurn, absl::Duration spin = kDefaultSpin);

  // Stops and joins the workers (a turn under way finishes first). Rings
  // still added are simply dropped.
  ~RingPoller();
  RingPoller(const RingPoller&) = delete;
  RingPoller& operator=(const RingPoller&) = delete;

  // Serves `reader`'s ring from now on; `reader` (not owned) and its region
  // stay alive until Remove returned or the poller is gone. A doorbell rung
  // before Add is seen. ALREADY_EXISTS for a reader added twice.
  absl::Status Add(RingReader* reader, Handler handler);

  // Stops serving `reader`'s ring and returns once no worker is inside it
  // (its handler is not running and will not run again). Requests it holds
  // stay held; their answers may still come through the reader. Must not be
  // called from a handler (it would wait for itself). NOT_FOUND for a
  // reader not added.
  absl::Status Remove(RingReader* reader);

  // Turns begun so far, over all rings (tests measure fairness with it).
  uint64_t turns() const { return turns_.load(std::memory_order_relaxed); }

 private:
  struct Ring {
    RingReader* reader;
    Handler handler;
    bool busy = false;      // a worker is in its turn
    bool queued = false;    // in queue_
    bool removing = false;  // Remove began: never armed or queued again
  };

  RingPoller(int epoll_fd, int stop_fd, int queue_fd, int per_turn, absl::Duration spin);
  void Work();
  // The ring for a worker woken by `event_id`, marked busy; null if none
  // (removed meanwhile, or another worker took the queue's entry).
  Ring* Take(uint64_t event_id, uint64_t* id);
  // One turn on `ring` (steps 1-3 above); true if it still has work.
  bool Serve(Ring* ring);

  const int epoll_fd_;
  const int stop_fd_;   // level-triggered, never drained: wakes every worker
  const int queue_fd_;  // EFD_SEMAPHORE: one count per entry of queue_
  const int per_turn_;
  const absl::Duration spin_;
  std::atomic<uint64_t> turns_{0};

  absl::Mutex mu_;
  // By the id in its doorbell's epoll event; a worker finds its ring here,
  // so an event of a ring removed meanwhile finds nothing.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RingReader*, uint64_t> ids_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // rings wanting another turn
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  std::vector<std::thread> workers_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_RING_RING_POLLER_H_
