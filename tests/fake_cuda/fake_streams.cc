// Streams, events and the copy and memset calls, as the driver runs them:
// later, on the fake's own threads (one worker per stream).
//
// The rules kept (CUDA Driver API, "API synchronization behavior" and the
// stream and event reference):
//  - Work queued on a stream runs in order, after its dependencies: an event
//    the stream waits for (cuStreamWaitEvent), and the legacy NULL stream's
//    implicit ordering with the context's blocking streams (work on the NULL
//    stream waits for work queued before it on every blocking stream, and
//    blocking streams wait for the NULL stream). Non-blocking streams are
//    ordered with nothing but their own queue.
//  - cuMemsetD8 is asynchronous with respect to the host (queued on the NULL
//    stream); cuMemcpyHtoD from pageable memory waits for the NULL stream,
//    stages the bytes and returns before they reach the device; cuMemcpyDtoH
//    returns once the bytes have arrived. FAKE_CUDA_DELAY_MS slows every
//    copy and memset down (so a missing synchronize shows).
//  - cuLaunchHostFunc and cuStreamAddCallback run the function on the
//    stream's worker, holding up that stream (and what depends on it).
//  - Violations, as compute-sanitizer or a corrupted result would show them:
//    work that starts while conflicting work (same bytes, one of them a
//    write) queued on another stream has not completed and is not ordered
//    with it; work that reaches memory no longer mapped (it also makes the
//    context's sticky error CUDA_ERROR_ILLEGAL_ADDRESS, which every later
//    synchronize, copy and memset of that context returns). Unmapping or
//    freeing memory with work pending is checked in fake_memory.cc.
#include <chrono>
#include <cstdio>
#include <cstring>

#include "tests/fake_cuda/fake_state.h"

namespace fakecuda {
namespace {

bool Ready(const Op& op) {
  for (const auto& [st, seq] : op.deps) {
    if (st->completed < seq) return false;
  }
  return true;
}

std::string Range(uint64_t p, uint64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "[0x%llx, +%llu)", static_cast<unsigned long long>(p),
                static_cast<unsigned long long>(n));
  return buf;
}

// Work `x` of stream `st` starts: conflicting work on other streams that has
// not completed, and is not ordered after `x`, is a hazard.
void CheckHazards(State& s, CUstream_st* st, const Op& x) {
  if (x.n == 0) return;
  for (CUstream_st* other : s.streams) {
    if (other == st || other->ordinal != st->ordinal) continue;
    bool ordered_after = false;
    for (const Op& y : other->queue) {
      for (const auto& [dep, seq] : y.deps) {
        if (dep == st && seq >= x.seq) ordered_after = true;
      }
      if (ordered_after) break;
      if (y.n == 0 || y.dptr >= x.dptr + x.n || x.dptr >= y.dptr + y.n) continue;
      if (!x.writes && !y.writes) continue;
      Violation(s, std::string("stream-order hazard: ") + x.what + " on stream " +
                       std::to_string(st->id) + " " + (x.writes ? "writes " : "reads ") +
                       Range(x.dptr, x.n) + " while " + y.what + " queued on stream " +
                       std::to_string(other->id) + " still " +
                       (y.writes ? "writes " : "reads ") + Range(y.dptr, y.n) +
                       ": memory reused or shared before the work queued on it completed");
      return;
    }
  }
}

// A device access is about to run: FAKE_CUDA_DELAY_MS first (the lock
// dropped), then the hazards it would hit.
void BeginAccess(State& s, CUstream_st* st, const Op& op, std::unique_lock<std::mutex>& lock) {
  if (s.delay_ms > 0) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(s.delay_ms));
    lock.lock();
  }
  CheckHazards(s, st, op);
}

void Run(State& s, CUstream_st* st, Op& op, std::unique_lock<std::mutex>& lock) {
  switch (op.kind) {
    case Op::kWrite:
    case Op::kRead: {
      BeginAccess(s, st, op, lock);
      CUresult r = DeviceIo(s, op.dptr, op.n, op.writes, op.memset ? nullptr : op.data.data(),
                            op.host_dst, op.memset ? op.value : -1, st->ordinal);
      if (r != CUDA_SUCCESS) {
        Violation(s, std::string("illegal address: ") + op.what + " queued on stream " +
                         std::to_string(st->id) + " reached " + Range(op.dptr, op.n) +
                         ", which is not (any more) mapped device memory of this process");
        s.contexts[st->ordinal].sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      }
      break;
    }
    case Op::kCopy: {
      BeginAccess(s, st, op, lock);
      std::vector<char> bytes(op.n);
      CUresult r = DeviceIo(s, op.src_dptr, op.n, false, nullptr, bytes.data(), -1, st->ordinal);
      if (r == CUDA_SUCCESS) {
        r = DeviceIo(s, op.dptr, op.n, true, bytes.data(), nullptr, -1, st->ordinal);
      }
      if (r != CUDA_SUCCESS) {
        Violation(s, std::string("illegal address: ") + op.what + " queued on stream " +
                         std::to_string(st->id) + " reached " + Range(op.src_dptr, op.n) +
                         " or " + Range(op.dptr, op.n) +
                         ", which is not (any more) device memory its device may access");
        s.contexts[st->ordinal].sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
      }
      break;
    }
    case Op::kHostFn:
      lock.unlock();
      op.fn(op.arg);
      lock.lock();
      break;
    case Op::kCallback:
      lock.unlock();
      op.callback(st->legacy ? nullptr : st, CUDA_SUCCESS, op.arg);
      lock.lock();
      break;
    case Op::kMarker:
    case Op::kRecord:
      break;
  }
}

void WorkerLoop(CUstream_st* st) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.cv.wait(lock, [&] {
      return (st->destroyed && st->queue.empty()) ||
             (!st->queue.empty() && Ready(st->queue.front()));
    });
    if (st->queue.empty()) break;  // destroyed and drained
    st->running = true;
    Run(s, st, st->queue.front(), lock);
    st->queue.pop_front();
    ++st->completed;
    st->running = false;
    s.cv.notify_all();
  }
  // Destroyed: no longer a stream of this process (the struct stays, kept
  // in `retired_streams`: a dependency of queued work may still name it).
  for (size_t i = 0; i < s.streams.size(); ++i) {
    if (s.streams[i] == st) {
      s.streams.erase(s.streams.begin() + static_cast<long>(i));
      break;
    }
  }
  s.retired_streams.push_back(st);
  s.cv.notify_all();
}

CUstream_st* NewStream(State& s, int ordinal, bool nonblocking, bool legacy) {
  auto* st = new CUstream_st;
  st->ordinal = ordinal;
  st->nonblocking = nonblocking;
  st->legacy = legacy;
  st->id = legacy ? 0 : s.next_stream_id++;
  s.streams.push_back(st);
  st->worker = std::thread(WorkerLoop, st);
  return st;
}

CUresult Sticky(State& s, int ordinal) { return s.contexts[ordinal].sticky; }

bool ValidEvent(State& s, CUevent ev) { return ev != nullptr && s.events.count(ev) > 0; }

}  // namespace

CUstream_st* LegacyStream(State& s, int ordinal) {
  CUctx_st& c = s.contexts[ordinal];
  if (c.legacy == nullptr) c.legacy = NewStream(s, ordinal, false, true);
  return c.legacy;
}

CUstream_st* StreamArg(State& s, CUstream stream, int ordinal) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    return LegacyStream(s, ordinal);
  }
  for (CUstream_st* st : s.streams) {
    if (st == stream && !st->destroyed) return st->ordinal == ordinal ? st : nullptr;
  }
  return nullptr;
}

uint64_t Enqueue(State& s, CUstream_st* st, Op op) {
  // A capturing stream records the work in its graph instead (dropped once
  // the capture is invalidated: its graph is discarded).
  if (st->capture != nullptr) {
    if (!st->capture->invalidated) {
      op.deps.clear();
      st->capture->graph->ops.push_back(std::move(op));
    }
    return st->enqueued;
  }
  op.seq = ++st->enqueued;
  if (st->legacy) {
    for (CUstream_st* other : s.streams) {
      if (other->ordinal == st->ordinal && !other->legacy && !other->nonblocking &&
          other->enqueued > other->completed) {
        op.deps.push_back({other, other->enqueued});
      }
    }
  } else if (!st->nonblocking) {
    CUstream_st* legacy = s.contexts[st->ordinal].legacy;
    if (legacy != nullptr && legacy->enqueued > legacy->completed) {
      op.deps.push_back({legacy, legacy->enqueued});
    }
  }
  st->queue.push_back(std::move(op));
  s.cv.notify_all();
  return st->enqueued;
}

void WaitFor(State& s, std::unique_lock<std::mutex>& lock, CUstream_st* st, uint64_t seq) {
  s.cv.wait(lock, [&] { return st->completed >= seq; });
}

void WaitContext(State& s, std::unique_lock<std::mutex>& lock, int ordinal) {
  std::vector<std::pair<CUstream_st*, uint64_t>> until;
  for (CUstream_st* st : s.streams) {
    if (st->ordinal == ordinal) until.push_back({st, st->enqueued});
  }
  for (auto& [st, seq] : until) WaitFor(s, lock, st, seq);
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the entry points below are the C API

namespace {

// A copy or memset of [dptr, +n) queued on `st` (validated now: the range
// must be accessible device memory of this process).
CUresult QueueAccess(State& s, CUstream_st* st, Op op) {
  if (!Accessible(s, op.dptr, op.n, op.writes, st->ordinal)) return CUDA_ERROR_INVALID_VALUE;
  if (op.kind == Op::kCopy && !Accessible(s, op.src_dptr, op.n, false, st->ordinal)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult sticky = s.contexts[st->ordinal].sticky; sticky != CUDA_SUCCESS) return sticky;
  if (st->capture != nullptr && st->capture->invalidated) {
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  Enqueue(s, st, std::move(op));
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  FAKE_ENTER("cuStreamCreate", false);
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(ordinal);
  *stream = NewStream(s, ordinal, (flags & CU_STREAM_NON_BLOCKING) != 0, false);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  FAKE_ENTER("cuStreamDestroy_v2", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Returns at once; the stream's queued work still runs.
  st->destroyed = true;
  st->worker.detach();
  s.cv.notify_all();
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
  FAKE_ENTER("cuStreamSynchronize", true);
  FAKE_NEED_CONTEXT(ordinal);
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (st->capture != nullptr) {  // its own capture: never, in any mode
    st->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (CUresult c = CaptureCheck(s, "cuStreamSynchronize"); c != CUDA_SUCCESS) return c;
  uint64_t seq = st->enqueued;
  // The NULL stream: a marker after everything it is ordered after.
  if (st->legacy) {
    Op marker;
    marker.what = "cuStreamSynchronize";
    seq = Enqueue(s, st, std::move(marker));
  }
  WaitFor(s, lock, st, seq);
  return Sticky(s, ordinal);
}

CUresult cuStreamQuery(CUstream stream) {
  FAKE_ENTER("cuStreamQuery", false);
  FAKE_NEED_CONTEXT(ordinal);
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (st->capture != nullptr) {
    st->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (CUresult c = CaptureCheck(s, "cuStreamQuery"); c != CUDA_SUCCESS) return c;
  if (CUresult sticky = Sticky(s, ordinal); sticky != CUDA_SUCCESS) return sticky;
  return st->completed == st->enqueued ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  FAKE_ENTER("cuStreamWaitEvent", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (flags != 0 || !ValidEvent(s, event)) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (event->stream == nullptr) return CUDA_SUCCESS;  // never recorded: nothing to wait for
  Op op;
  op.what = "cuStreamWaitEvent";
  op.deps.push_back({event->stream, event->seq});
  Enqueue(s, st, std::move(op));
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user_data) {
  FAKE_ENTER("cuLaunchHostFunc", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Op op;
  op.kind = Op::kHostFn;
  op.what = "cuLaunchHostFunc";
  op.fn = fn;
  op.arg = user_data;
  Enqueue(s, st, std::move(op));
  return CUDA_SUCCESS;
}

CUresult cuStreamAddCallback(CUstream stream, CUstreamCallback callback, void* user_data,
                             unsigned int flags) {
  FAKE_ENTER("cuStreamAddCallback", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Op op;
  op.kind = Op::kCallback;
  op.what = "cuStreamAddCallback";
  op.callback = callback;
  op.arg = user_data;
  Enqueue(s, st, std::move(op));
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  FAKE_ENTER("cuEventCreate", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (flags & ~known) return CUDA_ERROR_INVALID_VALUE;
  auto* ev = new CUevent_st;
  ev->ordinal = ordinal;
  s.events.insert(ev);
  *event = ev;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent event) {
  FAKE_ENTER("cuEventDestroy_v2", false);
  if (!ValidEvent(s, event)) return CUDA_ERROR_INVALID_HANDLE;
  s.events.erase(event);
  delete event;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  FAKE_ENTER("cuEventRecord", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (!ValidEvent(s, event)) return CUDA_ERROR_INVALID_HANDLE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  // The event and the stream must belong to the same (current) context.
  if (st == nullptr || event->ordinal != st->ordinal) return CUDA_ERROR_INVALID_HANDLE;
  Op op;
  op.kind = Op::kRecord;
  op.what = "cuEventRecord";
  event->seq = Enqueue(s, st, std::move(op));
  event->stream = st;
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent event) {
  FAKE_ENTER("cuEventQuery", false);
  if (!ValidEvent(s, event)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult c = CaptureCheck(s, "cuEventQuery"); c != CUDA_SUCCESS) return c;
  if (event->stream == nullptr) return CUDA_SUCCESS;
  if (CUresult sticky = Sticky(s, event->ordinal); sticky != CUDA_SUCCESS) return sticky;
  return event->stream->completed >= event->seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent event) {
  FAKE_ENTER("cuEventSynchronize", true);
  if (!ValidEvent(s, event)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult c = CaptureCheck(s, "cuEventSynchronize"); c != CUDA_SUCCESS) return c;
  if (event->stream == nullptr) return CUDA_SUCCESS;
  const int ordinal = event->ordinal;
  WaitFor(s, lock, event->stream, event->seq);
  return Sticky(s, ordinal);
}

CUresult cuCtxSynchronize() {
  FAKE_ENTER("cuCtxSynchronize", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (CUresult c = CaptureCheck(s, "cuCtxSynchronize", ordinal); c != CUDA_SUCCESS) return c;
  WaitContext(s, lock, ordinal);
  return Sticky(s, ordinal);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  FAKE_ENTER("cuMemsetD8Async", true);
  FAKE_NEED_CONTEXT(ordinal);
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Op op;
  op.kind = Op::kWrite;
  op.what = "cuMemsetD8Async";
  op.dptr = dst;
  op.n = n;
  op.writes = true;
  op.memset = true;
  op.value = value;
  return QueueAccess(s, st, std::move(op));
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  FAKE_ENTER("cuMemcpyHtoDAsync_v2", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Op op;
  op.kind = Op::kWrite;
  op.what = "cuMemcpyHtoDAsync";
  op.dptr = dst;
  op.n = n;
  op.writes = true;
  op.data.assign(static_cast<const char*>(src), static_cast<const char*>(src) + n);
  return QueueAccess(s, st, std::move(op));
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  FAKE_ENTER("cuMemcpyDtoHAsync_v2", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Op op;
  op.kind = Op::kRead;
  op.what = "cuMemcpyDtoHAsync";
  op.dptr = src;
  op.n = n;
  op.host_dst = dst;
  return QueueAccess(s, st, std::move(op));
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  FAKE_ENTER("cuMemsetD8_v2", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (CUresult c = CaptureCheck(s, "cuMemsetD8_v2"); c != CUDA_SUCCESS) return c;
  Op op;
  op.kind = Op::kWrite;
  op.what = "cuMemsetD8";
  op.dptr = dst;
  op.n = n;
  op.writes = true;
  op.memset = true;
  op.value = value;
  // Asynchronous with respect to the host: it lands later.
  return QueueAccess(s, LegacyStream(s, ordinal), std::move(op));
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  FAKE_ENTER("cuMemcpyHtoD_v2", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (CUresult c = CaptureCheck(s, "cuMemcpyHtoD_v2"); c != CUDA_SUCCESS) return c;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* legacy = LegacyStream(s, ordinal);
  // From pageable memory: a stream sync first, then the bytes are staged
  // and the call returns; the DMA to the device completes later.
  Op marker;
  marker.what = "cuMemcpyHtoD";
  WaitFor(s, lock, legacy, Enqueue(s, legacy, std::move(marker)));
  Op op;
  op.kind = Op::kWrite;
  op.what = "cuMemcpyHtoD (pageable; staged)";
  op.dptr = dst;
  op.n = n;
  op.writes = true;
  op.data.assign(static_cast<const char*>(src), static_cast<const char*>(src) + n);
  return QueueAccess(s, legacy, std::move(op));
}

// Device to device (a peer's memory too, where this device was given access
// to it): queued on the NULL stream and waited for, as the driver's
// synchronous copy behaves.
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  FAKE_ENTER("cuMemcpyDtoD_v2", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (CUresult c = CaptureCheck(s, "cuMemcpyDtoD_v2"); c != CUDA_SUCCESS) return c;
  CUstream_st* legacy = LegacyStream(s, ordinal);
  Op op;
  op.kind = Op::kCopy;
  op.what = "cuMemcpyDtoD";
  op.dptr = dst;
  op.src_dptr = src;
  op.n = n;
  op.writes = true;
  if (CUresult r = QueueAccess(s, legacy, std::move(op)); r != CUDA_SUCCESS) return r;
  WaitFor(s, lock, legacy, legacy->enqueued);
  return s.contexts[ordinal].sticky;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  FAKE_ENTER("cuMemcpyDtoH_v2", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (CUresult c = CaptureCheck(s, "cuMemcpyDtoH_v2"); c != CUDA_SUCCESS) return c;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* legacy = LegacyStream(s, ordinal);
  Op op;
  op.kind = Op::kRead;
  op.what = "cuMemcpyDtoH";
  op.dptr = src;
  op.n = n;
  op.host_dst = dst;
  if (CUresult r = QueueAccess(s, legacy, std::move(op)); r != CUDA_SUCCESS) return r;
  // Returns once the bytes are in host memory.
  WaitFor(s, lock, legacy, legacy->enqueued);
  return Sticky(s, ordinal);
}

}  // extern "C"
