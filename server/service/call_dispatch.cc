// See call_dispatch.h. A request a worker picks up carries copies of what it
// needs (caller, request, callback): the transport's own copy may be gone by
// then. A waiting request's cancellation is made only when it did not finish
// inline, and told its ticket by whichever thread learns it (WaitCancel).
#include "server/service/call_dispatch.h"

#include <utility>

namespace gpumem {

namespace {

std::shared_ptr<WaitCancel> CancelFor(const v1::AllocateRequest& request) {
  // Without wait_ms a request is held only briefly (a reclaim hold), and
  // answered then whatever its caller does.
  return request.wait_ms() != 0 ? std::make_shared<WaitCancel>() : nullptr;
}

}  // namespace

void CallDispatch::AnswerAllocate(MemoryBroker::AllocateAnswer answer, absl::Time arrived,
                                  Delivery where, const AllocateDone& done) const {
  if (p_.observer != nullptr) {
    p_.observer->OnAllocate(answer.status(), answer.ok() ? *answer : v1::AllocateResponse(),
                            absl::Now() - arrived);
  }
  done(std::move(answer), where);  // last: the transport may let go of the call
}

void CallDispatch::AnswerFree(absl::StatusOr<v1::FreeResponse> answer, Delivery where,
                              const FreeDone& done) const {
  if (p_.observer != nullptr) p_.observer->OnFree(answer.status());
  done(std::move(answer), where);
}

CallDispatch::Dispatched CallDispatch::Allocate(const absl::StatusOr<PeerCred>& caller,
                                                const v1::AllocateRequest& request,
                                                absl::Time arrived, AllocateDone done) {
  if (!caller.ok()) {
    AnswerAllocate(caller.status(), arrived, Delivery::kInline, done);
    return {};
  }
  // A request the broker holds is answered from admission's thread.
  auto waited = [this, arrived, done] {
    return MemoryBroker::AllocateCallback([this, arrived, done](MemoryBroker::AllocateAnswer a) {
      AnswerAllocate(std::move(a), arrived, Delivery::kLater, done);
    });
  };
  MemoryBroker::AllocateOutcome now = p_.broker->TryAllocate(*caller, request, waited());
  switch (now.kind) {
    case MemoryBroker::AllocateOutcome::Kind::kAnswered:
      AnswerAllocate(std::move(now.answer), arrived, Delivery::kInline, done);
      return {};
    case MemoryBroker::AllocateOutcome::Kind::kWaiting: {
      Dispatched held{Route::kWaiting, CancelFor(request)};
      if (held.cancel != nullptr) held.cancel->Waiting(p_.broker, now.wait_ticket);
      return held;
    }
    case MemoryBroker::AllocateOutcome::Kind::kNeedsBackendWork:
      break;
  }
  // A new slab, or releasing empty ones: not on this thread, which serves
  // every call of its queue.
  std::shared_ptr<WaitCancel> cancel = CancelFor(request);
  const bool submitted = p_.backend_workers->Submit(
      [this, caller = *caller, request, arrived, done, waited, cancel] {
        MemoryBroker::AllocateOutcome r = p_.broker->Allocate(caller, request, waited());
        if (r.kind == MemoryBroker::AllocateOutcome::Kind::kWaiting) {
          // `waited` answers it, maybe already: only `cancel` is touched.
          if (cancel != nullptr) cancel->Waiting(p_.broker, r.wait_ticket);
          return;
        }
        AnswerAllocate(std::move(r.answer), arrived, Delivery::kLater, done);
      });
  if (!submitted) {
    AnswerAllocate(MemoryBroker::StoppingError(), arrived, Delivery::kInline, done);
    return {};
  }
  return {Route::kWorker, std::move(cancel)};
}

CallDispatch::Route CallDispatch::Free(const absl::StatusOr<PeerCred>& caller,
                                       const v1::FreeRequest& request, FreeDone done) {
  if (!caller.ok()) {
    AnswerFree(caller.status(), Delivery::kInline, done);
    return Route::kInline;
  }
  std::optional<absl::StatusOr<v1::FreeResponse>> now = p_.broker->TryFree(*caller, request);
  if (now.has_value()) {
    AnswerFree(*std::move(now), Delivery::kInline, done);
    return Route::kInline;
  }
  // The block's dedicated slab goes back to the backend: not here.
  const bool submitted = p_.backend_workers->Submit([this, caller = *caller, request, done] {
    AnswerFree(p_.broker->Free(caller, request), Delivery::kLater, done);
  });
  if (submitted) return Route::kWorker;
  AnswerFree(p_.broker->Free(*caller, request), Delivery::kInline, done);
  return Route::kInline;
}

}  // namespace gpumem
