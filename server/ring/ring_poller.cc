// See ring_poller.h. Event ids: 0 is the stop eventfd, kQueueId the
// queue's, any other a ring's (ids are never reused). A worker takes one
// event at a time; under mu_ it finds the ring (by id, or the queue's
// oldest entry after taking one count from the queue's eventfd) and marks
// it busy, serves the turn without the lock, then under mu_ clears busy
// and either queues the ring or arms its doorbell again, unless Remove
// began. Remove, under mu_, deletes the doorbell from the epoll set, waits
// for busy to clear and drops a queued entry, so no worker touches a
// removed ring and none arms or queues one.
#include "server/ring/ring_poller.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ring/futex.h"

namespace gpumem {
namespace {

constexpr uint64_t kStopId = 0;
constexpr uint64_t kQueueId = UINT64_MAX;
// Rounds of step 3's carrying on: bounded, for a client that makes HasWork
// see a request that Collect then cannot take (it flips states).
constexpr int kMaxRounds = 4;

absl::Status Errno(const char* what) {
  const int e = errno;
  return absl::InternalError(absl::StrCat("ring poller: ", what, ": ", strerror(e)));
}

bool Watch(int epoll_fd, int op, int fd, uint32_t events, uint64_t id) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  return epoll_ctl(epoll_fd, op, fd, &ev) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingPoller>> RingPoller::Create(int workers, int per_turn,
                                                               absl::Duration spin) {
  if (workers < 1 || per_turn < 1 || spin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ring poller: ", workers, " workers, ",
                                                   per_turn, " per turn, spin ",
                                                   absl::FormatDuration(spin)));
  }
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int queue_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE);
  if (epoll_fd < 0 || stop_fd < 0 || queue_fd < 0 ||
      !Watch(epoll_fd, EPOLL_CTL_ADD, stop_fd, EPOLLIN, kStopId) ||
      !Watch(epoll_fd, EPOLL_CTL_ADD, queue_fd, EPOLLIN, kQueueId)) {
    absl::Status s = Errno("epoll set");
    for (int fd : {epoll_fd, stop_fd, queue_fd}) {
      if (fd >= 0) close(fd);
    }
    return s;
  }
  std::unique_ptr<RingPoller> poller(
      new RingPoller(epoll_fd, stop_fd, queue_fd, per_turn, spin));
  for (int i = 0; i < workers; ++i) poller->workers_.emplace_back([p = poller.get()] { p->Work(); });
  return poller;
}

RingPoller::RingPoller(int epoll_fd, int stop_fd, int queue_fd, int per_turn,
                       absl::Duration spin)
    : epoll_fd_(epoll_fd),
      stop_fd_(stop_fd),
      queue_fd_(queue_fd),
      per_turn_(per_turn),
      spin_(spin) {}

RingPoller::~RingPoller() {
  const uint64_t one = 1;
  while (write(stop_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  for (std::thread& t : workers_) t.join();
  close(queue_fd_);
  close(stop_fd_);
  close(epoll_fd_);
}

absl::Status RingPoller::Add(RingReader* reader, Handler handler) {
  absl::MutexLock lock(&mu_);
  if (ids_.contains(reader)) {
    return absl::AlreadyExistsError("ring poller: that ring is served already");
  }
  const uint64_t id = next_id_++;
  if (!Watch(epoll_fd_, EPOLL_CTL_ADD, reader->region()->eventfd(), EPOLLIN | EPOLLONESHOT,
             id)) {
    return Errno("epoll_ctl(ADD)");
  }
  auto ring = std::make_unique<Ring>();
  ring->reader = reader;
  ring->handler = std::move(handler);
  rings_.emplace(id, std::move(ring));
  ids_.emplace(reader, id);
  return absl::OkStatus();
}

absl::Status RingPoller::Remove(RingReader* reader) {
  absl::MutexLock lock(&mu_);
  auto it = ids_.find(reader);
  if (it == ids_.end()) return absl::NotFoundError("ring poller: that ring is not served");
  const uint64_t id = it->second;
  Ring* ring = rings_.at(id).get();
  ring->removing = true;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, reader->region()->eventfd(), nullptr);
  mu_.Await(absl::Condition(+[](Ring* r) { return !r->busy; }, ring));
  // A queued entry's count stays in queue_fd_; the worker it wakes finds
  // the queue shorter and goes back to sleep.
  if (ring->queued) queue_.erase(std::find(queue_.begin(), queue_.end(), id));
  rings_.erase(id);
  ids_.erase(it);
  return absl::OkStatus();
}

RingPoller::Ring* RingPoller::Take(uint64_t event_id, uint64_t* id) {
  if (event_id == kQueueId) {
    uint64_t count;
    // EFD_SEMAPHORE: takes one count; EAGAIN when another worker took the
    // last one (the fd is reported to every worker that waits).
    if (read(queue_fd_, &count, sizeof(count)) != sizeof(count)) return nullptr;
  }
  absl::MutexLock lock(&mu_);
  if (event_id == kQueueId) {
    if (queue_.empty()) return nullptr;  // its ring was removed
    event_id = queue_.front();
    queue_.pop_front();
  }
  auto it = rings_.find(event_id);
  if (it == rings_.end() || it->second->removing) return nullptr;
  Ring* ring = it->second.get();
  ring->queued = false;
  ring->busy = true;
  *id = event_id;
  return ring;
}

void RingPoller::Work() {
  for (;;) {
    epoll_event ev;
    if (epoll_wait(epoll_fd_, &ev, 1, -1) != 1) continue;  // EINTR
    if (ev.data.u64 == kStopId) return;
    uint64_t id;
    Ring* ring = Take(ev.data.u64, &id);
    if (ring == nullptr) continue;
    const bool more = Serve(ring);
    absl::MutexLock lock(&mu_);
    ring->busy = false;
    if (ring->removing) continue;
    if (more) {
      queue_.push_back(id);
      ring->queued = true;
      const uint64_t one = 1;
      while (write(queue_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
      }
    } else {
      Watch(epoll_fd_, EPOLL_CTL_MOD, ring->reader->region()->eventfd(), EPOLLIN | EPOLLONESHOT,
            id);
    }
  }
}

bool RingPoller::Serve(Ring* ring) {
  turns_.fetch_add(1, std::memory_order_relaxed);
  RingReader* reader = ring->reader;
  RingRegion* region = reader->region();
  RingHeader* header = region->header();
  region->DrainDoorbell();
  auto deliver = [ring, reader](RingRequest request) {
    ring->handler(reader, std::move(request));
  };
  const std::chrono::nanoseconds spin = absl::ToChronoNanoseconds(spin_);
  int budget = per_turn_;
  for (int round = 1;; ++round) {
    header->reader_active.store(1, std::memory_order_relaxed);
    auto spin_end = std::chrono::steady_clock::now() + spin;
    while (budget > 0) {
      const int taken = reader->Collect(budget, deliver);
      budget -= taken;
      if (taken > 0) {
        spin_end = std::chrono::steady_clock::now() + spin;
        continue;
      }
      if (std::chrono::steady_clock::now() >= spin_end) break;
      CpuRelax();
    }
    // The doorbell's pair (request_ring.h); HasWork's loads are seq_cst.
    header->reader_active.store(0, std::memory_order_seq_cst);
    if (!reader->HasWork()) return false;
    if (budget == 0 || round == kMaxRounds) return true;
  }
}

}  // namespace gpumem
