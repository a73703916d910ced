// CallDispatch (server/service/call_dispatch.h) over a real MemoryBroker and
// the sim backend, with real worker pools: where each kind of request runs,
// where and how often its answer is delivered, what the observer is told,
// how a waiting request is given up, and what happens once the workers stop.
#include "server/service/call_dispatch.h"

#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/service/worker_pool.h"

namespace gpumem {
namespace {

using Delivery = CallDispatch::Delivery;
using Route = CallDispatch::Route;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDevice = 64 * kMiB;

PeerCred Self() { return PeerCred{getpid(), getuid(), getgid()}; }

v1::AllocateRequest Request(uint64_t size, uint32_t wait_ms = 0) {
  v1::AllocateRequest r;
  r.set_size_bytes(size);
  r.set_wait_ms(wait_ms);
  return r;
}

v1::FreeRequest FreeOf(uint64_t id) {
  v1::FreeRequest r;
  r.set_id(id);
  return r;
}

// Every answer a callback got, with where and on which thread.
template <typename Response>
class Answers {
 public:
  struct One {
    absl::StatusOr<Response> answer = absl::UnknownError("none");
    Delivery where = Delivery::kInline;
    std::thread::id thread;
  };

  CallDispatch::Done<Response> Callback() {
    return [this](absl::StatusOr<Response> answer, Delivery where) {
      absl::MutexLock lock(&mu_);
      got_.push_back({std::move(answer), where, std::this_thread::get_id()});
    };
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return got_.size();
  }
  // Waits at most 10 s for the first answer.
  One First() {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !got_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), absl::Seconds(10));
    return got_.empty() ? One{} : got_.front();
  }

 private:
  absl::Mutex mu_;
  std::vector<One> got_ ABSL_GUARDED_BY(mu_);
};

class CountingObserver : public CallObserver {
 public:
  void OnAllocate(const absl::Status& status, const v1::AllocateResponse&,
                  absl::Duration) override {
    absl::MutexLock lock(&mu_);
    allocates_.push_back(status);
  }
  void OnFree(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    frees_.push_back(status);
  }
  std::vector<absl::Status> allocates() {
    absl::MutexLock lock(&mu_);
    return allocates_;
  }
  std::vector<absl::Status> frees() {
    absl::MutexLock lock(&mu_);
    return frees_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Status> allocates_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> frees_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<MemoryBroker> MakeBroker(Backend* backend) {
  BrokerOptions o;
  o.pool.slab_size = 4 * kMiB;
  o.pool.granularity = 4096;
  o.reclaim_wait = absl::ZeroDuration();
  return std::make_unique<MemoryBroker>(backend, o);
}

class CallDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(broker_->Start().ok()); }
  void TearDown() override {
    broker_->StopWaiting();
    backend_workers_.Shutdown();
    query_workers_.Shutdown();
    broker_.reset();
  }

  // The first allocation on the device: it needs a slab.
  uint64_t WarmUp() {
    Answers<v1::AllocateResponse> a;
    dispatch_.Allocate(Self(), Request(4096), absl::Now(), a.Callback());
    Answers<v1::AllocateResponse>::One first = a.First();
    EXPECT_TRUE(first.answer.ok()) << first.answer.status();
    return first.answer.ok() ? first.answer->allocations(0).id() : 0;
  }

  uint64_t Waiting() { return broker_->Stats(Self()).counters.waiting_requests; }

  SimBackend backend_{{kDevice}};
  std::unique_ptr<MemoryBroker> broker_ = MakeBroker(&backend_);
  WorkerPool backend_workers_{1};
  WorkerPool query_workers_{1};
  CountingObserver observer_;
  CallDispatch dispatch_{{broker_.get(), &backend_workers_, &query_workers_, &observer_}};
};

TEST_F(CallDispatchTest, WhatNeedsNoBackendWorkIsAnsweredInlineBeforeItReturns) {
  ASSERT_NE(WarmUp(), 0u);
  Answers<v1::AllocateResponse> a;
  CallDispatch::Dispatched d = dispatch_.Allocate(Self(), Request(4096), absl::Now(), a.Callback());
  EXPECT_EQ(d.route, Route::kInline);
  EXPECT_EQ(d.cancel, nullptr);
  ASSERT_EQ(a.count(), 1u) << "answered before Allocate returned";
  Answers<v1::AllocateResponse>::One got = a.First();
  ASSERT_TRUE(got.answer.ok()) << got.answer.status();
  EXPECT_EQ(got.where, Delivery::kInline);
  EXPECT_EQ(got.thread, std::this_thread::get_id());

  Answers<v1::FreeResponse> f;
  EXPECT_EQ(dispatch_.Free(Self(), FreeOf(got.answer->allocations(0).id()), f.Callback()),
            Route::kInline);
  ASSERT_EQ(f.count(), 1u);
  EXPECT_TRUE(f.First().answer.ok());
  EXPECT_EQ(f.First().where, Delivery::kInline);
  EXPECT_EQ(observer_.allocates().size(), 2u);  // the warm-up's and this one's
  EXPECT_EQ(observer_.frees().size(), 1u);
}

TEST_F(CallDispatchTest, BackendWorkRunsOnAWorkerAndIsAnsweredFromThere) {
  Answers<v1::AllocateResponse> a;
  // A new slab, then (larger than a slab) a dedicated one.
  CallDispatch::Dispatched d = dispatch_.Allocate(Self(), Request(4096), absl::Now(), a.Callback());
  EXPECT_EQ(d.route, Route::kWorker);
  EXPECT_EQ(d.cancel, nullptr) << "no wait_ms: nothing to give up";
  Answers<v1::AllocateResponse>::One got = a.First();
  ASSERT_TRUE(got.answer.ok()) << got.answer.status();
  EXPECT_EQ(got.where, Delivery::kLater);
  EXPECT_NE(got.thread, std::this_thread::get_id());

  Answers<v1::AllocateResponse> big;
  EXPECT_EQ(dispatch_.Allocate(Self(), Request(8 * kMiB), absl::Now(), big.Callback()).route,
            Route::kWorker);
  got = big.First();
  ASSERT_TRUE(got.answer.ok()) << got.answer.status();
  Answers<v1::FreeResponse> f;
  EXPECT_EQ(dispatch_.Free(Self(), FreeOf(got.answer->allocations(0).id()), f.Callback()),
            Route::kWorker)
      << "a dedicated slab goes back to the backend with its block";
  Answers<v1::FreeResponse>::One freed = f.First();
  EXPECT_TRUE(freed.answer.ok()) << freed.answer.status();
  EXPECT_EQ(freed.where, Delivery::kLater);
  EXPECT_NE(freed.thread, std::this_thread::get_id());
  EXPECT_EQ(a.count() + big.count() + f.count(), 3u) << "each answered once";
  EXPECT_EQ(observer_.allocates().size(), 2u);
  EXPECT_EQ(observer_.frees().size(), 1u);
}

// A wait_ms request the full device cannot hold waits in admission (no
// thread); its handle gives it up: answered CANCELLED, its place freed.
TEST_F(CallDispatchTest, AWaitingAllocateHoldsNoThreadAndIsGivenUpThroughItsHandle) {
  Answers<v1::AllocateResponse> whole;
  dispatch_.Allocate(Self(), Request(kDevice), absl::Now(), whole.Callback());
  ASSERT_TRUE(whole.First().answer.ok()) << whole.First().answer.status();

  Answers<v1::AllocateResponse> plain;
  CallDispatch::Dispatched d = dispatch_.Allocate(Self(), Request(4096), absl::Now(), plain.Callback());
  EXPECT_EQ(plain.First().answer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.cancel, nullptr);

  Answers<v1::AllocateResponse> waiter;
  d = dispatch_.Allocate(Self(), Request(4096, 60000), absl::Now(), waiter.Callback());
  EXPECT_NE(d.route, Route::kInline);
  ASSERT_NE(d.cancel, nullptr);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (Waiting() != 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(Waiting(), 1u);
  EXPECT_EQ(waiter.count(), 0u);

  d.cancel->Cancel(broker_.get());
  Answers<v1::AllocateResponse>::One got = waiter.First();
  EXPECT_EQ(got.answer.status().code(), absl::StatusCode::kCancelled) << got.answer.status();
  EXPECT_EQ(got.where, Delivery::kLater);
  EXPECT_EQ(Waiting(), 0u);
  EXPECT_EQ(waiter.count(), 1u);
}

// A draining daemon's workers stop: an Allocate that needs one is refused
// with the one "stopping" answer; a Free and a query run inline instead.
TEST_F(CallDispatchTest, OnceTheWorkersStopAllocateIsRefusedAndFreeRunsInline) {
  Answers<v1::AllocateResponse> big;
  dispatch_.Allocate(Self(), Request(8 * kMiB), absl::Now(), big.Callback());
  ASSERT_TRUE(big.First().answer.ok()) << big.First().answer.status();
  const uint64_t id = big.First().answer->allocations(0).id();
  backend_workers_.Shutdown();
  query_workers_.Shutdown();

  Answers<v1::AllocateResponse> refused;
  EXPECT_EQ(dispatch_.Allocate(Self(), Request(8 * kMiB), absl::Now(), refused.Callback()).route,
            Route::kInline);
  ASSERT_EQ(refused.count(), 1u);
  EXPECT_EQ(refused.First().answer.status(), MemoryBroker::StoppingError());

  Answers<v1::FreeResponse> f;
  EXPECT_EQ(dispatch_.Free(Self(), FreeOf(id), f.Callback()), Route::kInline);
  ASSERT_EQ(f.count(), 1u);
  EXPECT_TRUE(f.First().answer.ok()) << f.First().answer.status();

  Answers<v1::GetSessionRequest> q;
  EXPECT_EQ(dispatch_.Query<v1::GetSessionRequest>(
                [] { return absl::StatusOr<v1::GetSessionRequest>(v1::GetSessionRequest()); },
                q.Callback()),
            Route::kInline);
  EXPECT_EQ(q.count(), 1u);
}

TEST_F(CallDispatchTest, QueriesRunOnTheQueryWorkers) {
  Answers<v1::GetSessionRequest> q;
  std::thread::id ran;
  EXPECT_EQ(dispatch_.Query<v1::GetSessionRequest>(
                [&ran]() -> absl::StatusOr<v1::GetSessionRequest> {
                  ran = std::this_thread::get_id();
                  return absl::NotFoundError("no such thing");
                },
                q.Callback()),
            Route::kWorker);
  Answers<v1::GetSessionRequest>::One got = q.First();
  EXPECT_EQ(got.answer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.where, Delivery::kLater);
  EXPECT_EQ(got.thread, ran);
  EXPECT_NE(ran, std::this_thread::get_id());
}

// A caller the transport could not establish: its status is the answer,
// inline, and counted like any other.
TEST_F(CallDispatchTest, AnUnknownCallersStatusIsTheAnswer) {
  Answers<v1::AllocateResponse> a;
  const absl::Status unknown = absl::PermissionDeniedError("no credentials for fd:7");
  EXPECT_EQ(dispatch_.Allocate(unknown, Request(4096), absl::Now(), a.Callback()).route,
            Route::kInline);
  ASSERT_EQ(a.count(), 1u);
  EXPECT_EQ(a.First().answer.status(), unknown);
  Answers<v1::FreeResponse> f;
  EXPECT_EQ(dispatch_.Free(unknown, FreeOf(1), f.Callback()), Route::kInline);
  EXPECT_EQ(f.First().answer.status(), unknown);
  ASSERT_EQ(observer_.allocates().size(), 1u);
  EXPECT_EQ(observer_.allocates()[0], unknown);
  ASSERT_EQ(observer_.frees().size(), 1u);
  EXPECT_EQ(observer_.frees()[0], unknown);
}

}  // namespace
}  // namespace gpumem
