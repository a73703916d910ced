// The fake driver's state, shared by its files (tests/fake_cuda/*.cc).
//
// One State per process, made at cuInit from the environment and never
// destroyed. One mutex (State::mu) guards all of it; stream workers take it
// to run an operation and drop it only to call a host function or to sleep.
// Invariants the files keep together:
//  - Device addresses come from the fake's own address space (VaSpace): a
//    host range mapped PROT_NONE at cuInit and never made accessible, so a
//    host load or store through a device pointer faults, as on a GPU, and
//    nothing the host maps (mmap with or without MAP_FIXED_NOREPLACE) can
//    take a device address. Device bytes live in memfds, reached only with
//    pread/pwrite by the copy and memset operations.
//  - Every piece of device work (copy, memset, host function, event record)
//    is an Op on a stream, run later by that stream's worker thread. Work is
//    pending until its worker has finished it; pending work keeps its device
//    range "in use" for the hazard checks (violations).
//  - Each thread has its own stack of current contexts; only entry points
//    that need a context look at it.
#ifndef GPUMEMD_TESTS_FAKE_CUDA_FAKE_STATE_H_
#define GPUMEMD_TESTS_FAKE_CUDA_FAKE_STATE_H_

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// One primary context per visible device.
struct CUctx_st {
  int ordinal = -1;
  int retains = 0;          // cuDevicePrimaryCtxRetain minus releases
  int overhead_fd = -1;     // the context's own device memory (a memfd)
  int exclusive_fd = -1;    // the EXCLUSIVE_PROCESS lock, while active
  CUstream_st* legacy = nullptr;  // the NULL stream, made on first use
  CUresult sticky = CUDA_SUCCESS;  // an illegal access by queued work
};

namespace fakecuda {

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct FakeDevice {
  std::string uuid_hex;       // 32 hex digits (the MIG instance's for MIG)
  unsigned char uuid[16];
  unsigned char parent[16];   // the GPU's UUID (differs from uuid for MIG)
  bool mig = false;
  std::string name;
  uint64_t total = 0;
  uint64_t other_used = 0;    // held by processes this fake cannot see
  int global_index = 0;       // PCI order
  int compute_mode = CU_COMPUTEMODE_DEFAULT;
};

struct Failure {
  std::string fn;
  long nth = 0;        // 0: every call
  bool onward = false; // nth and every later call
  CUresult code = CUDA_SUCCESS;
  long calls = 0;
};

// Device bytes: a memfd, closed when the last holder lets go.
struct Memfd {
  int fd = -1;
  uint64_t size = 0;
  int ordinal = 0;
  ~Memfd();
};

// Physical memory known to this process: made by cuMemCreate or imported.
struct Physical {
  std::shared_ptr<Memfd> mem;
  bool exportable_fd = false;
  bool rdma = false;  // allocFlags.gpuDirectRDMACapable
  bool released = false;
  int mappings = 0;
};

struct Mapping {
  uint64_t size = 0;
  std::shared_ptr<Memfd> mem;
  uint64_t offset = 0;
  CUmemGenericAllocationHandle handle = 0;
  int ordinal = 0;
  // cuMemSetAccess, by the ordinal of the device whose work may touch it:
  // CU_MEM_ACCESS_FLAGS_PROT_READ or _READWRITE (absent: none).
  std::map<int, CUmemAccess_flags> access;
};

// cuMemAlloc memory, or a legacy IPC import (bytes still the exporter's).
struct Linear {
  std::shared_ptr<Memfd> mem;  // cuMemAlloc
  uint64_t size = 0;
  int ordinal = 0;
  bool ipc_opened = false;
  int32_t ipc_pid = 0;         // the exporter and its memfd's fd and inode
  int32_t ipc_fd = -1;
  uint64_t ipc_inode = 0;
  std::string ipc_key;
  int refs = 0;
};

// The fake's device address space: first fit, lowest address first, so a
// freed range is handed out again at once (as the driver may).
class VaSpace {
 public:
  bool Init(uint64_t bytes);
  // 0 when nothing fits.
  uint64_t Allocate(uint64_t size, uint64_t align);
  void Free(uint64_t start, uint64_t size);
  bool Contains(uint64_t p) const { return p >= base_ && p - base_ < size_; }

 private:
  uint64_t base_ = 0, size_ = 0;
  std::map<uint64_t, uint64_t> free_;  // start -> length
};

// A piece of device work.
struct Op {
  enum Kind { kWrite, kRead, kCopy, kHostFn, kCallback, kMarker, kRecord };
  Kind kind = kMarker;
  uint64_t seq = 0;  // position in its stream, from 1
  // Runs only once each (stream, seq) pair has completed.
  std::vector<std::pair<CUstream_st*, uint64_t>> deps;
  uint64_t dptr = 0, n = 0;  // the device range it touches
  bool writes = false;
  bool memset = false;
  unsigned char value = 0;
  std::vector<char> data;    // kWrite: staged bytes (unless memset)
  void* host_dst = nullptr;  // kRead
  uint64_t src_dptr = 0;     // kCopy: read [src_dptr, +n), write [dptr, +n)
  CUhostFn fn = nullptr;
  CUstreamCallback callback = nullptr;
  void* arg = nullptr;
  const char* what = "";     // the entry point that queued it
};

// A stream capture in progress (cuStreamBeginCapture until
// cuStreamEndCapture): the stream's work goes into `graph` instead of
// running.
struct Capture {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;  // the thread that began it
  uint64_t id = 0;
  CUgraph_st* graph = nullptr;
  bool invalidated = false;  // a prohibited call ended it: EndCapture fails
};

}  // namespace fakecuda

// cuUserObjectCreate: `destroy(ptr)` runs when the last reference goes.
struct CUuserObject_st {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned refs = 0;
};

// A captured graph, and an executable made from one: the captured work, and
// the user objects each holds references to.
struct CUgraph_st {
  int ordinal = 0;
  std::vector<fakecuda::Op> ops;
  std::vector<std::pair<CUuserObject_st*, unsigned>> objects;
};
struct CUgraphExec_st {
  std::vector<fakecuda::Op> ops;
  std::vector<std::pair<CUuserObject_st*, unsigned>> objects;
};

struct CUstream_st {
  int ordinal = 0;
  bool nonblocking = false;
  bool legacy = false;
  int id = 0;  // for messages: 0 is the NULL stream
  std::deque<fakecuda::Op> queue;  // front: running or next
  bool running = false;            // the front is being run
  uint64_t enqueued = 0, completed = 0;
  bool destroyed = false;
  std::thread worker;
  std::unique_ptr<fakecuda::Capture> capture;  // while capturing
};

struct CUevent_st {
  int ordinal = 0;
  CUstream_st* stream = nullptr;  // recorded on, or null
  uint64_t seq = 0;
};

namespace fakecuda {

struct State {
  std::mutex mu;
  std::condition_variable cv;  // any stream made progress, or was destroyed
  bool initialized = false;
  pid_t init_pid = 0;
  std::vector<FakeDevice> all;          // every fake device, PCI order
  std::vector<int> visible;             // ordinal -> index into all
  std::set<std::pair<int, int>> peers;  // global index pairs
  std::set<std::pair<int, int>> pcie_peers;  // those of them over PCIe
  uint64_t granularity = 2 * kMiB;
  uint64_t context_bytes = 0;
  int delay_ms = 0;
  bool no_posix_fd = false;
  bool rdma = false;  // FAKE_CUDA_RDMA=1: GPUDirect RDMA with VMM supported
  bool no_dma_buf = false;  // FAKE_CUDA_NO_DMA_BUF=1: no dma-buf export
  bool no_uuid_v1 = false;  // FAKE_CUDA_NO_UUID_V1=1: only cuDeviceGetUuid_v2 answers
  bool dirty = false;
  std::string lost_file;
  std::string machine;    // tags memfds: processes of one test see each other
  std::string state_dir;  // compute-mode locks
  std::string violations_file;
  std::vector<Failure> failures;
  std::vector<CUctx_st> contexts;  // one per visible device
  // Contexts made by cuCtxCreate, until cuCtxDestroy. They cost device
  // memory as primary ones do; streams and the sticky error are the
  // device's in this fake (its contexts[ordinal]).
  std::deque<std::unique_ptr<CUctx_st>> created;
  std::vector<CUstream_st*> streams;  // live ones, the NULL streams too
  std::vector<CUstream_st*> retired_streams;  // destroyed ones, kept (see WorkerLoop)
  int next_stream_id = 1;
  std::set<CUevent_st*> events;
  long calls = 0;  // driver calls made since cuInit (fakeCudaCalls)
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  std::set<CUuserObject_st*> user_objects;
  uint64_t next_capture_id = 1;
  uint64_t next_handle = 1;
  VaSpace va;
  std::map<CUmemGenericAllocationHandle, Physical> handles;
  std::map<uint64_t, uint64_t> reservations;  // start -> size
  std::map<uint64_t, Mapping> mappings;
  std::map<uint64_t, Linear> linear;
  std::vector<std::string> violations;
};

State& S();
// Set in a fork() child of a process that called cuInit: the child cannot
// use CUDA (every call fails with CUDA_ERROR_NOT_INITIALIZED, as the driver
// answers there).
extern std::atomic<bool> g_forked;

bool Configure(State& s);
CUresult Injected(State& s, const char* fn);
bool Lost(const State& s);
bool ValidOrdinal(const State& s, int ordinal);
const FakeDevice& DeviceOf(const State& s, int ordinal);
bool CanAccess(const State& s, int from_ordinal, int memory_ordinal);
const char* CodeName(CUresult r);
const char* CodeText(CUresult r);
CUresult CodeByName(const std::string& s, bool* ok);
std::string UuidHex(const unsigned char* u);
void Violation(State& s, const std::string& what);

// The calling thread's current context (top of its stack), or null.
CUctx_st* Current();
std::vector<CUctx_st*>& ContextStack();
// CUDA_SUCCESS with *ordinal set, or CUDA_ERROR_INVALID_CONTEXT when no
// context is current (or the current one was released).
CUresult NeedContext(State& s, int* ordinal);

// fake_memory.cc
uint64_t DeviceBytesInUse(const State& s, const FakeDevice& d);
// A new memfd of `bytes` for device `ordinal`, or null with *err set.
std::shared_ptr<Memfd> NewPhysical(const State& s, int ordinal, uint64_t bytes,
                                   const char* kind, CUresult* err);
// Is [ptr, ptr + n) device memory that work of device `from` (an ordinal)
// may access (read, or write)? Mapped memory needs cuMemSetAccess for
// `from`; cuMemAlloc memory and legacy IPC imports their own device or a
// peer of it.
bool Accessible(const State& s, uint64_t ptr, uint64_t n, bool write, int from);
// Reads or writes device bytes for work of device `from` (src/dst host
// memory; a memset when `memset_value` >= 0). CUDA_ERROR_ILLEGAL_ADDRESS if
// the range is not accessible from there (any more) or its legacy IPC
// exporter let it go.
CUresult DeviceIo(State& s, uint64_t ptr, uint64_t n, bool write, const void* src,
                  void* dst, int memset_value, int from);
// Violations for unmapping or freeing [ptr, ptr + n) with work pending.
void CheckNoPendingWork(State& s, uint64_t ptr, uint64_t n, const char* call);

// fake_streams.cc
// The NULL (legacy) stream of context `ordinal`, made on first use.
CUstream_st* LegacyStream(State& s, int ordinal);
// Resolves a CUstream argument (null, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
// or a stream of this context) to a stream; null for a bad handle.
CUstream_st* StreamArg(State& s, CUstream stream, int ordinal);
// Queues `op` on `st` (legacy semantics for the NULL stream and blocking
// streams); returns its seq.
uint64_t Enqueue(State& s, CUstream_st* st, fakecuda::Op op);
// Waits (mu held via `lock`) until `st` has completed `seq`.
void WaitFor(State& s, std::unique_lock<std::mutex>& lock, CUstream_st* st, uint64_t seq);
// Waits until every stream of context `ordinal` has run what it had queued.
void WaitContext(State& s, std::unique_lock<std::mutex>& lock, int ordinal);

// fake_graphs.cc: stream capture. A potentially unsafe call (`what`: one
// that may synchronize, query or change memory) made while a capture
// prohibits it for this thread (by the thread's cuThreadExchangeStreamCaptureMode
// mode, as the driver documents: GLOBAL threads are prohibited by their own
// non-RELAXED capture and by any other thread's GLOBAL one, THREAD_LOCAL
// threads by their own, RELAXED threads never) fails with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those captures.
// `device_sync` >= 0: the call waits for that device's work
// (cuCtxSynchronize), which no capture on it allows, in any mode.
CUresult CaptureCheck(State& s, const char* what, int device_sync = -1);
// Releases `count` references of `obj`; its destructor, when due, is added
// to `due` (run it after the fake's lock is dropped).
void ReleaseUserObject(State& s, CUuserObject_st* obj, unsigned count,
                       std::vector<std::pair<CUhostFn, void*>>* due);

}  // namespace fakecuda

// The common prologue: not a fork child, initialized, injected failure,
// device lost. Holds the state lock as `lock` for the rest of the call.
#define FAKE_ENTER(fn, touches_device)                                    \
  if (::fakecuda::g_forked.load(std::memory_order_relaxed)) {             \
    return CUDA_ERROR_NOT_INITIALIZED;                                    \
  }                                                                       \
  ::fakecuda::State& s = ::fakecuda::S();                                 \
  std::unique_lock<std::mutex> lock(s.mu);                                \
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;                  \
  if (CUresult inj = ::fakecuda::Injected(s, fn); inj != CUDA_SUCCESS) {  \
    return inj;                                                           \
  }                                                                       \
  if ((touches_device) && ::fakecuda::Lost(s)) return CUDA_ERROR_DEVICE_UNAVAILABLE;

#define FAKE_NEED_CONTEXT(ordinal_var)                                    \
  int ordinal_var = -1;                                                   \
  if (CUresult ctx_err = ::fakecuda::NeedContext(s, &ordinal_var);        \
      ctx_err != CUDA_SUCCESS) {                                          \
    return ctx_err;                                                       \
  }

#endif  // GPUMEMD_TESTS_FAKE_CUDA_FAKE_STATE_H_
