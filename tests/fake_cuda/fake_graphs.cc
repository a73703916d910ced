// Stream capture, graphs and user objects, as the driver documents them
// (CUDA Driver API: "Stream Management" capture calls, "Graph Management",
// cuThreadExchangeStreamCaptureMode, cuUserObjectCreate).
//
// The rules kept:
//  - cuStreamBeginCapture on a stream (never the NULL stream) makes the work
//    queued on it go into a graph instead of running; cuStreamEndCapture on
//    the same thread (unless RELAXED) hands the graph over.
//  - While a capture runs, a potentially unsafe call (a synchronize, a
//    query, a change of memory: CaptureCheck's callers) from a thread the
//    capture prohibits fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
//    invalidates the capture: its EndCapture fails with
//    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and its graph is discarded. A
//    device synchronize is refused while any capture runs on the device.
//  - A graph executable replays the captured work on the stream it is
//    launched on; the work is copied at instantiation.
//  - A user object's destructor runs once every reference is gone: the
//    creator's, and those a graph or an executable holds (an executable
//    takes its own at instantiation). Destroying a graph or executable
//    releases its references. Destructors run after the fake's lock is
//    dropped and must make no CUDA call (CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
//    is the only flag).
#include <algorithm>
#include <thread>

#include "tests/fake_cuda/fake_state.h"

namespace fakecuda {
namespace {

thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool ValidMode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

// Does `c` prohibit potentially unsafe calls of this thread?
bool Prohibits(const Capture& c) {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  const bool mine = c.thread == std::this_thread::get_id();
  if (mine && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED) return true;
  return !mine && t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
         c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

void Release(State& s, std::vector<std::pair<CUuserObject_st*, unsigned>>& objects,
             std::vector<std::pair<CUhostFn, void*>>* due) {
  for (auto& [obj, count] : objects) ReleaseUserObject(s, obj, count, due);
  objects.clear();
}

void RunDestructors(std::unique_lock<std::mutex>& lock,
                    std::vector<std::pair<CUhostFn, void*>>& due) {
  if (due.empty()) return;
  lock.unlock();
  for (auto& [fn, ptr] : due) fn(ptr);
  lock.lock();
}

// A capture ends (ended, or its stream discarded it): the graph is the
// caller's (`keep`) or destroyed.
CUgraph_st* EndOf(State& s, CUstream_st* st, bool keep,
                  std::vector<std::pair<CUhostFn, void*>>* due) {
  CUgraph_st* g = st->capture->graph;
  st->capture.reset();
  if (keep) return g;
  Release(s, g->objects, due);
  s.graphs.erase(g);
  delete g;
  return nullptr;
}

}  // namespace

CUresult CaptureCheck(State& s, const char* what, int device_sync) {
  (void)what;
  CUresult r = CUDA_SUCCESS;
  for (CUstream_st* st : s.streams) {
    if (st->capture == nullptr || st->capture->invalidated) continue;
    const bool sync_here = device_sync >= 0 && st->ordinal == device_sync;
    if (Prohibits(*st->capture)) {
      st->capture->invalidated = true;
      r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (sync_here) {
      r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  return r;
}

void ReleaseUserObject(State& s, CUuserObject_st* obj, unsigned count,
                       std::vector<std::pair<CUhostFn, void*>>* due) {
  if (s.user_objects.count(obj) == 0) return;
  obj->refs -= std::min(obj->refs, count);
  if (obj->refs > 0) return;
  due->push_back({obj->destroy, obj->ptr});
  s.user_objects.erase(obj);
  delete obj;
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the entry points below are the C API

extern "C" {

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKE_ENTER("cuThreadExchangeStreamCaptureMode", false);
  if (mode == nullptr || !ValidMode(*mode)) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  FAKE_ENTER("cuStreamBeginCapture_v2", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (!ValidMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (st->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the NULL stream
  if (st->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  st->capture = std::make_unique<Capture>();
  st->capture->mode = mode;
  st->capture->thread = std::this_thread::get_id();
  st->capture->id = s.next_capture_id++;
  st->capture->graph = new CUgraph_st;
  st->capture->graph->ordinal = st->ordinal;
  s.graphs.insert(st->capture->graph);
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  FAKE_ENTER("cuStreamEndCapture", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (st->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (st->capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      st->capture->thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  std::vector<std::pair<CUhostFn, void*>> due;
  const bool valid = !st->capture->invalidated;
  *graph = EndOf(s, st, valid, &due);
  RunDestructors(lock, due);
  return valid ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  FAKE_ENTER("cuStreamIsCapturing", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *status = st->capture == nullptr       ? CU_STREAM_CAPTURE_STATUS_NONE
            : st->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                       : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status,
                                   cuuint64_t* id, CUgraph* graph,
                                   const CUgraphNode** dependencies,
                                   const CUgraphEdgeData** edges, size_t* num_dependencies) {
  FAKE_ENTER("cuStreamGetCaptureInfo_v3", false);
  FAKE_NEED_CONTEXT(ordinal);
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const bool active = st->capture != nullptr && !st->capture->invalidated;
  *status = st->capture == nullptr ? CU_STREAM_CAPTURE_STATUS_NONE
            : active               ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                   : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  if (active) {
    if (id != nullptr) *id = st->capture->id;
    if (graph != nullptr) *graph = st->capture->graph;
    if (dependencies != nullptr) *dependencies = nullptr;  // no nodes in this fake
    if (edges != nullptr) *edges = nullptr;
    if (num_dependencies != nullptr) *num_dependencies = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuUserObjectCreate(CUuserObject* object, void* ptr, CUhostFn destroy,
                            unsigned int initial_refcount, unsigned int flags) {
  FAKE_ENTER("cuUserObjectCreate", false);
  if (object == nullptr || destroy == nullptr || initial_refcount == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* obj = new CUuserObject_st;
  obj->ptr = ptr;
  obj->destroy = destroy;
  obj->refs = initial_refcount;
  s.user_objects.insert(obj);
  *object = obj;
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  FAKE_ENTER("cuUserObjectRelease", false);
  if (s.user_objects.count(object) == 0 || count == 0 || count > object->refs) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<std::pair<CUhostFn, void*>> due;
  ReleaseUserObject(s, object, count, &due);
  RunDestructors(lock, due);
  return CUDA_SUCCESS;
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                 unsigned int flags) {
  FAKE_ENTER("cuGraphRetainUserObject", false);
  if (s.graphs.count(graph) == 0 || s.user_objects.count(object) == 0 || count == 0 ||
      (flags != 0 && flags != CU_GRAPH_USER_OBJECT_MOVE)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (flags == CU_GRAPH_USER_OBJECT_MOVE) {
    if (count > object->refs) return CUDA_ERROR_INVALID_VALUE;  // the caller's to move
  } else {
    object->refs += count;
  }
  graph->objects.push_back({object, count});
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                     unsigned long long flags) {
  FAKE_ENTER("cuGraphInstantiateWithFlags", false);
  if (exec == nullptr || s.graphs.count(graph) == 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* e = new CUgraphExec_st;
  e->ops = graph->ops;
  for (auto& [obj, count] : graph->objects) {
    obj->refs += count;
    e->objects.push_back({obj, count});
  }
  s.execs.insert(e);
  *exec = e;
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  FAKE_ENTER("cuGraphLaunch", true);
  FAKE_NEED_CONTEXT(ordinal);
  if (s.execs.count(exec) == 0) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* st = StreamArg(s, stream, ordinal);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  for (const Op& op : exec->ops) {
    Op copy = op;
    copy.deps.clear();
    copy.what = "cuGraphLaunch (replayed work)";
    Enqueue(s, st, std::move(copy));
  }
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  FAKE_ENTER("cuGraphExecDestroy", false);
  if (s.execs.count(exec) == 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<CUhostFn, void*>> due;
  Release(s, exec->objects, &due);
  s.execs.erase(exec);
  delete exec;
  RunDestructors(lock, due);
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
  FAKE_ENTER("cuGraphDestroy", false);
  if (s.graphs.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
  for (CUstream_st* st : s.streams) {
    if (st->capture != nullptr && st->capture->graph == graph) return CUDA_ERROR_ILLEGAL_STATE;
  }
  std::vector<std::pair<CUhostFn, void*>> due;
  Release(s, graph->objects, &due);
  s.graphs.erase(graph);
  delete graph;
  RunDestructors(lock, due);
  return CUDA_SUCCESS;
}

}  // extern "C"
