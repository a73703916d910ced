// See ring_transport.h. A Ring is shared by the transport's map (while it
// is lent), the poller's handler (until Remove) and every request of it not
// yet answered (its dispatch callback); whichever lets go last frees the
// region. A waiting Allocate's cancel is kept in its ring until the answer
// comes; the answer and the dispatch's return race (the answer may come
// first, from admission's thread), settled under the ring's lock.
#include "server/service/ring_transport.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/ring/request_ring.h"
#include "common/ring/ring_kinds.h"
#include "server/service/wait_cancel.h"

namespace gpumem {

struct RingTransport::Ring {
  Ring(const PeerCred& c, uint64_t session, std::unique_ptr<RingRegion> r)
      : caller(c), session_id(session), region(std::move(r)), reader(region.get()) {}

  const PeerCred caller;
  const uint64_t session_id;
  const std::unique_ptr<RingRegion> region;
  RingReader reader;

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
  // Waiting Allocates (wait_ms) by this ring's own number for them.
  absl::flat_hash_map<uint64_t, std::shared_ptr<WaitCancel>> waits ABSL_GUARDED_BY(mu);
  // Answered before the dispatch returned their cancel.
  absl::flat_hash_set<uint64_t> answered_early ABSL_GUARDED_BY(mu);
  uint64_t next_wait ABSL_GUARDED_BY(mu) = 1;

  uint64_t NewWait() {
    absl::MutexLock l(&mu);
    return next_wait++;
  }
  // The dispatch returned `cancel` for wait `key`.
  void Held(uint64_t key, std::shared_ptr<WaitCancel> cancel, MemoryBroker* broker) {
    {
      absl::MutexLock l(&mu);
      if (answered_early.erase(key) > 0) return;
      if (!ended) {
        waits.emplace(key, std::move(cancel));
        return;
      }
    }
    cancel->Cancel(broker);  // the ring ended meanwhile
  }
  // Wait `key` was answered.
  void Answered(uint64_t key) {
    absl::MutexLock l(&mu);
    if (waits.erase(key) == 0) answered_early.insert(key);
  }
  // Marks the ring ended; the cancels of what still waits.
  std::vector<std::shared_ptr<WaitCancel>> EndWaits() {
    absl::MutexLock l(&mu);
    ended = true;
    std::vector<std::shared_ptr<WaitCancel>> out;
    for (auto& [key, cancel] : waits) out.push_back(std::move(cancel));
    waits.clear();
    return out;
  }

  // Answers with a status other than OK: its message is the payload.
  void AnswerStatus(uint32_t slot, uint32_t seq, const absl::Status& status) {
    absl::string_view message = status.message();
    if (message.size() > kRingPayloadBytes) message = message.substr(0, kRingPayloadBytes);
    reader.Answer(slot, seq, status.code(), message).IgnoreError();
  }
};

namespace {

absl::Status AnswerTooLarge() {
  return absl::ResourceExhaustedError(absl::StrCat(
      "answer too large for the request ring (more than ", kRingPayloadBytes,
      " bytes); use gRPC"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingTransport>> RingTransport::Create(
    MemoryBroker* broker, WorkerPool* backend_workers, CallObserver* observer,
    RingTransportOptions options) {
  std::unique_ptr<RingPoller> poller;
  if (options.enabled) {
    absl::StatusOr<std::unique_ptr<RingPoller>> made =
        RingPoller::Create(options.workers, options.per_turn, options.spin);
    if (!made.ok()) return made.status();
    poller = *std::move(made);
  }
  std::unique_ptr<RingTransport> t(
      new RingTransport(broker, backend_workers, observer, options, std::move(poller)));
  RingTransport* raw = t.get();
  broker->SetSessionEndListener([raw](uint64_t session_id) { raw->SessionEnded(session_id); });
  return t;
}

RingTransport::RingTransport(MemoryBroker* broker, WorkerPool* backend_workers,
                             CallObserver* observer, RingTransportOptions options,
                             std::unique_ptr<RingPoller> poller)
    : broker_(broker),
      dispatch_({broker, backend_workers, /*query_workers=*/nullptr, observer}),
      options_(options),
      poller_(std::move(poller)),
      max_rings_per_uid_(options.max_rings_per_uid) {}

RingTransport::~RingTransport() {
  Close();
  poller_.reset();  // joins the workers
}

absl::StatusOr<LentRing> RingTransport::Lend(const PeerCred& caller, uint64_t slots) {
  if (!options_.enabled) return RingsOffError();
  absl::StatusOr<std::shared_ptr<Session>> session = broker_->SessionOf(caller);
  if (!session.ok()) return session.status();
  const uint64_t session_id = (*session)->id();
  const uint32_t count = slots == 0              ? kDefaultRingSlots
                         : slots > kRingMaxSlots ? kRingMaxSlots
                                                 : static_cast<uint32_t>(slots);
  std::shared_ptr<Ring> ring;
  LentRing lent;
  {
    absl::MutexLock l(&mu_);
    if (closed_) return MemoryBroker::StoppingError();
    if (by_session_.contains(session_id)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "session ", session_id, " has a request ring already (one per session)"));
    }
    if (per_uid_[caller.uid] >= max_rings_per_uid_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("uid ", caller.uid, " holds ", max_rings_per_uid_,
                       " request rings, its limit (max_connections_per_uid); use gRPC"));
    }
    if (by_session_.size() >= options_.max_rings) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon lends at most ", options_.max_rings, " request rings at once; use gRPC"));
    }
    absl::StatusOr<std::unique_ptr<RingRegion>> region = RingRegion::Create(count);
    if (!region.ok()) return region.status();
    lent.memfd = fcntl((*region)->memfd(), F_DUPFD_CLOEXEC, 0);
    lent.eventfd = fcntl((*region)->eventfd(), F_DUPFD_CLOEXEC, 0);
    lent.size = (*region)->size();
    if (lent.memfd < 0 || lent.eventfd < 0) {
      if (lent.memfd >= 0) close(lent.memfd);
      if (lent.eventfd >= 0) close(lent.eventfd);
      return absl::ResourceExhaustedError("no file descriptor left for a request ring");
    }
    ring = std::make_shared<Ring>(caller, session_id, *std::move(region));
    absl::Status added = poller_->Add(
        &ring->reader, [this, ring](RingReader*, RingRequest request) {
          Serve(ring, std::move(request));
        });
    if (!added.ok()) {
      close(lent.memfd);
      close(lent.eventfd);
      return added;
    }
    by_session_.emplace(session_id, ring);
    ++per_uid_[caller.uid];
  }
  // The session may have ended before the ring was in the map, its end
  // finding nothing to end: it is marked ended before its listener runs.
  if ((*session)->ended()) SessionEnded(session_id);
  return lent;
}

void RingTransport::SessionEnded(uint64_t session_id) {
  std::shared_ptr<Ring> ring;
  {
    absl::MutexLock l(&mu_);
    auto it = by_session_.find(session_id);
    if (it == by_session_.end()) return;
    ring = std::move(it->second);
    by_session_.erase(it);
    if (--per_uid_[ring->caller.uid] == 0) per_uid_.erase(ring->caller.uid);
  }
  End(ring);
}

void RingTransport::End(const std::shared_ptr<Ring>& ring) {
  poller_->Remove(&ring->reader).IgnoreError();  // no handler runs after this
  for (const std::shared_ptr<WaitCancel>& cancel : ring->EndWaits()) cancel->Cancel(broker_);
}

void RingTransport::Close() {
  broker_->SetSessionEndListener(nullptr);  // returns once none runs
  std::vector<std::shared_ptr<Ring>> rings;
  {
    absl::MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, ring] : by_session_) rings.push_back(std::move(ring));
    by_session_.clear();
    per_uid_.clear();
  }
  for (const std::shared_ptr<Ring>& ring : rings) End(ring);
  // The poller (its workers idle now) goes with the transport: a Lend's own
  // SessionEnded may still be ending a ring on it.
}

size_t RingTransport::ring_count() const {
  absl::MutexLock l(&mu_);
  return by_session_.size();
}

void RingTransport::SetMaxRingsPerUid(uint32_t n) {
  absl::MutexLock l(&mu_);
  max_rings_per_uid_ = n;
}

void RingTransport::Serve(const std::shared_ptr<Ring>& ring, RingRequest request) {
  const absl::Time arrived = absl::Now();
  const uint32_t slot = request.slot;
  const uint32_t seq = request.seq;
  switch (request.kind) {
    case kRingAllocate: {
      v1::AllocateRequest r;
      if (!r.ParseFromString(request.bytes)) {
        ring->AnswerStatus(slot, seq,
                           absl::InvalidArgumentError(
                               "request ring: the payload is not an AllocateRequest"));
        return;
      }
      const uint64_t key = r.wait_ms() != 0 ? ring->NewWait() : 0;
      MemoryBroker* broker = broker_;
      CallDispatch::Dispatched d = dispatch_.Allocate(
          ring->caller, r, arrived,
          [ring, slot, seq, key, broker](absl::StatusOr<v1::AllocateResponse> answer,
                                         CallDispatch::Delivery) {
            if (key != 0) ring->Answered(key);
            if (!answer.ok()) {
              ring->AnswerStatus(slot, seq, answer.status());
              return;
            }
            std::string bytes;
            if (answer->ByteSizeLong() <= kRingPayloadBytes && answer->SerializeToString(&bytes) &&
                ring->reader.Answer(slot, seq, absl::StatusCode::kOk, bytes).ok()) {
              return;
            }
            // Its ids cannot reach the client: nothing else would free it.
            for (const v1::Allocation& a : answer->allocations()) {
              v1::FreeRequest free;
              free.set_id(a.id());
              broker->Free(ring->caller, free).IgnoreError();
            }
            ring->AnswerStatus(slot, seq, AnswerTooLarge());
          });
      if (key != 0) {
        if (d.cancel != nullptr) {
          ring->Held(key, std::move(d.cancel), broker_);
        } else {
          ring->Held(key, std::make_shared<WaitCancel>(), broker_);  // forgets `key`
        }
      }
      return;
    }
    case kRingFree: {
      v1::FreeRequest r;
      if (!r.ParseFromString(request.bytes)) {
        ring->AnswerStatus(
            slot, seq, absl::InvalidArgumentError("request ring: the payload is not a FreeRequest"));
        return;
      }
      dispatch_.Free(ring->caller, r,
                     [ring, slot, seq](absl::StatusOr<v1::FreeResponse> answer,
                                       CallDispatch::Delivery) {
                       if (!answer.ok()) {
                         ring->AnswerStatus(slot, seq, answer.status());
                         return;
                       }
                       std::string bytes;
                       answer->SerializeToString(&bytes);  // a few bytes
                       ring->reader.Answer(slot, seq, absl::StatusCode::kOk, bytes).IgnoreError();
                     });
      return;
    }
    default:
      ring->AnswerStatus(slot, seq,
                         absl::InvalidArgumentError(absl::StrCat(
                             "request ring: unknown kind ", request.kind, " (", kRingAllocate,
                             ": Allocate, ", kRingFree, ": Free)")));
      return;
  }
}

}  // namespace gpumem
