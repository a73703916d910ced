// A fake CUDA driver (libcuda.so.1): the judge of the CUDA path on machines
// without a GPU, as strict as the driver where our code could go wrong.
//
// It implements the driver API calls gpumemd, its client library and the
// tests make, so the daemon's cuda backend, the client's CUDA mappers and
// several real processes sharing slabs run the code paths they run on a GPU,
// and it enforces what the driver enforces (files: fake_state.cc
// configuration, contexts and address space; fake_memory.cc memory;
// fake_streams.cc streams, events, copies; fake_graphs.cc stream capture,
// graphs, user objects):
//  - Device memory the host cannot touch: device pointers are addresses in
//    the fake's own PROT_NONE address space, so a host load or store through
//    one faults (SIGSEGV) as on a GPU. Bytes are reached only through the
//    copy and memset calls. Address reservations are not host mappings: the
//    address space hands a freed range out again at once, and no host mmap
//    can claim a device address.
//  - Asynchronous streams: copies, memsets, host functions and event records
//    run later on the fake's own threads, in the driver's order (see
//    fake_streams.cc, including the legacy NULL stream's rules, asynchronous
//    cuMemsetD8 and the early return of a pageable cuMemcpyHtoD). Unmapping,
//    freeing or reusing memory while work queued on it is pending is a
//    violation, and so is work that reaches memory no longer mapped (which
//    also sets the context's sticky CUDA_ERROR_ILLEGAL_ADDRESS).
//  - A current context per thread (a stack: cuCtxSetCurrent,
//    cuCtxPushCurrent/PopCurrent, cuCtxGetCurrent); every call that works on
//    device memory needs one (CUDA_ERROR_INVALID_CONTEXT otherwise).
//  - fork() after cuInit: the child cannot use CUDA; every call, cuInit too,
//    answers CUDA_ERROR_NOT_INITIALIZED there.
//  - Memory: each process's primary context on a device costs
//    FAKE_CUDA_CONTEXT_BYTES of it; cuMemGetInfo counts every fake
//    allocation and context held by any process of the same test (memfds
//    found under /proc, so a killed process gives its memory back) plus
//    FAKE_CUDA_OTHER_USED, and allocations beyond what is free fail with
//    CUDA_ERROR_OUT_OF_MEMORY although cuDeviceTotalMem is larger.
//  - Compute modes (CU_DEVICE_ATTRIBUTE_COMPUTE_MODE): PROHIBITED refuses
//    every context (CUDA_ERROR_UNKNOWN, as documented for the primary
//    context); EXCLUSIVE_PROCESS admits one process's context at a time
//    (CUDA_ERROR_DEVICE_UNAVAILABLE for the others).
//  - Device numbering: a container's subset of devices (FAKE_CUDA_SUBSET),
//    CUDA_DEVICE_ORDER (FASTEST_FIRST by FAKE_CUDA_FASTEST, or PCI_BUS_ID),
//    then CUDA_VISIBLE_DEVICES (indices, GPU- prefixes, MIG- UUIDs). MIG
//    devices (a "MIG-" entry in FAKE_CUDA_UUIDS): cuDeviceGetUuid_v2 gives
//    the instance's UUID and the first cuDeviceGetUuid the GPU's.
//  - Stream capture (fake_graphs.cc): work queued on a capturing stream goes
//    into a graph that executables replay; a potentially unsafe call
//    (synchronize, query, memory change) from a thread the capture
//    prohibits, by its cuThreadExchangeStreamCaptureMode mode, fails with
//    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture;
//    user objects die with the last graph or executable holding them.
//  - Access per device: mapped memory is reached only by work of devices
//    cuMemSetAccess named (cuMemGetAccess reads it back); cuMemAlloc memory
//    by its device and its peers (FAKE_CUDA_PEERS); cuMemcpyDtoD copies
//    between them.
//  - Legacy IPC: a handle opens only while its exporter holds the memory and
//    where the exporter's pid is visible (not across PID namespaces), and an
//    opened handle's memory dies with its exporter (accesses fail after).
//  - Misuse fails with the CUresult the driver documents: sizes, addresses
//    or offsets off the granularity, mappings outside a reservation or over
//    another, released handles, copies through memory not mapped or not
//    accessible (CUDA_ERROR_INVALID_VALUE), bad ordinals, access for a device
//    that cannot reach the memory (CUDA_ERROR_INVALID_DEVICE), an event
//    recorded on another context's stream (CUDA_ERROR_INVALID_HANDLE).
// Tests read violations with fakeCudaViolations() (dlsym) or from the file
// FAKE_CUDA_VIOLATIONS names (one line each, every process); each is also
// printed to stderr.
//
// Environment (read at cuInit):
//   FAKE_CUDA_DEVICES        "2x1GiB" (default), "1GiB,512MiB"
//   FAKE_CUDA_UUIDS          comma list of GPU-/MIG- UUIDs, one per device
//   FAKE_CUDA_PEERS          groups of devices with peer access, "0-1,2-3";
//                            a "pcie:" group is over PCIe (no native atomics
//                            in cuDeviceGetP2PAttribute), "0-1,pcie:2-3"
//   FAKE_CUDA_GRANULARITY    allocation granularity in bytes (default 2 MiB)
//   FAKE_CUDA_CONTEXT_BYTES  device memory each process's context costs (4MiB;
//                            cuCtxCreate contexts too)
//   FAKE_CUDA_RDMA           "1": GPUDirect RDMA with VMM supported (else
//                            cuMemCreate refuses gpuDirectRDMACapable)
//   FAKE_CUDA_NO_DMA_BUF     "1": no dma-buf export (cuMemGetHandleForAddressRange)
//   FAKE_CUDA_NO_UUID_V1     "1": the first cuDeviceGetUuid answers NOT_SUPPORTED
//                            (MIG then shows only in the name, "... MIG 1g.10gb")
//   FAKE_CUDA_OTHER_USED     "0=100MiB": held by processes the fake cannot see
//   FAKE_CUDA_COMPUTE_MODE   "0=exclusive_process,1=prohibited"
//   FAKE_CUDA_SUBSET         the devices this process's container has ("1,2")
//   FAKE_CUDA_FASTEST        the default (FASTEST_FIRST) order, "2,0,1"
//   FAKE_CUDA_DELAY_MS       every copy and memset takes this long to run
//   FAKE_CUDA_VIOLATIONS     append violations to this file
//   FAKE_CUDA_NO_POSIX_FD    "1": POSIX fd handles are not supported
//   FAKE_CUDA_DIRTY          "1": new memory reads 0xA5, not zeros (the real
//                            driver does not zero what it hands out)
//   FAKE_CUDA_FAIL           injected failures, comma separated:
//                            "cuMemCreate@3=CUDA_ERROR_OUT_OF_MEMORY" (3rd call),
//                            "cuMemsetD8_v2@2+=46" (2nd call on), "cuMemMap=1"
//   FAKE_CUDA_LOST_FILE      while this file exists, every call that touches a
//                            device fails with CUDA_ERROR_DEVICE_UNAVAILABLE
//   FAKE_CUDA_STATE_DIR      where compute-mode locks live (default $TEST_TMPDIR
//                            or /tmp); processes sharing it are one machine
//   FAKE_CUDA_MACHINE        overrides that machine name
//   FAKE_CUDA_VA_SIZE        the device address space (default 64GiB)
//   CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER   as the driver reads them
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "tests/fake_cuda/fake_state.h"

using namespace fakecuda;  // NOLINT: the entry points below are the C API

namespace {

void OnForkChild() { g_forked.store(true); }

// Makes device `ordinal`'s primary context active in this process: its
// compute mode allows it, and its own memory fits.
CUresult ActivatePrimary(State& s, CUctx_st& c) {
  const FakeDevice& d = DeviceOf(s, c.ordinal);
  if (d.compute_mode == CU_COMPUTEMODE_PROHIBITED) return CUDA_ERROR_UNKNOWN;
  if (d.compute_mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS) {
    std::string path = s.state_dir + "/fakecuda-" + s.machine + "-" + d.uuid_hex + ".exclusive";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return CUDA_ERROR_UNKNOWN;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      return CUDA_ERROR_DEVICE_UNAVAILABLE;  // another process's context is there
    }
    c.exclusive_fd = fd;
  }
  if (s.context_bytes > 0) {
    CUresult err = CUDA_SUCCESS;
    std::shared_ptr<Memfd> mem = NewPhysical(s, c.ordinal, s.context_bytes, "context", &err);
    if (mem == nullptr) {
      if (c.exclusive_fd >= 0) close(c.exclusive_fd);
      c.exclusive_fd = -1;
      return err;
    }
    c.overhead_fd = dup(mem->fd);
  }
  return CUDA_SUCCESS;
}

void DeactivatePrimary(CUctx_st& c) {
  if (c.overhead_fd >= 0) close(c.overhead_fd);
  if (c.exclusive_fd >= 0) close(c.exclusive_fd);
  c.overhead_fd = c.exclusive_fd = -1;
}

bool IsContext(State& s, CUcontext ctx) {
  for (CUctx_st& c : s.contexts) {
    if (&c == ctx) return true;
  }
  for (const std::unique_ptr<CUctx_st>& c : s.created) {
    if (c.get() == ctx) return true;
  }
  return false;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int flags) {
  if (g_forked.load()) return CUDA_ERROR_NOT_INITIALIZED;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.initialized) return CUDA_SUCCESS;
  if (CUresult inj = Injected(s, "cuInit"); inj != CUDA_SUCCESS) return inj;
  if (!Configure(s)) return CUDA_ERROR_INVALID_VALUE;
  if (s.visible.empty()) return CUDA_ERROR_NO_DEVICE;
  pthread_atfork(nullptr, nullptr, OnForkChild);
  s.initialized = true;
  s.init_pid = getpid();
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = CodeText(error);
  return *str != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = CodeName(error);
  return *str != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount", false);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(s.visible.size());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet", false);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetName", false);
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", DeviceOf(s, dev).name.c_str());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid_v2", false);
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, DeviceOf(s, dev).uuid, 16);
  return CUDA_SUCCESS;
}

// The first cuDeviceGetUuid (cuda.h now maps the name to _v2): for a MIG
// device it gives the GPU's UUID, not the instance's.
#undef cuDeviceGetUuid
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid", false);
  if (s.no_uuid_v1) return CUDA_ERROR_NOT_SUPPORTED;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, DeviceOf(s, dev).parent, 16);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKE_ENTER("cuDeviceTotalMem_v2", false);
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = DeviceOf(s, dev).total;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetPCIBusId", false);
  if (bus == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(bus, static_cast<size_t>(len), "0000:%02x:00.0",
                0x10 + DeviceOf(s, dev).global_index);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute", false);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  const FakeDevice& d = DeviceOf(s, dev);
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = s.no_posix_fd ? 0 : 1;
      break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
      *value = s.rdma ? 1 : 0;
      break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
      *value = s.no_dma_buf ? 0 : 1;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
      *value = d.compute_mode;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = 0x10 + d.global_index;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  FAKE_ENTER("cuDeviceCanAccessPeer", false);
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev) || !ValidOrdinal(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer && CanAccess(s, dev, peer) ? 1 : 0;
  return CUDA_SUCCESS;
}

// As the driver: for two distinct devices, what their link supports (0 for
// everything where there is no peer access); INVALID_DEVICE for a device
// with itself or a bad ordinal, INVALID_VALUE for an unknown attribute.
CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice src,
                                 CUdevice dst) {
  FAKE_ENTER("cuDeviceGetP2PAttribute", false);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, src) || !ValidOrdinal(s, dst) || src == dst) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  const bool peer = CanAccess(s, src, dst);
  const bool pcie = s.pcie_peers.count({s.visible[src], s.visible[dst]}) > 0;
  switch (attrib) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
      *value = !peer ? 0 : pcie ? 1 : 0;
      break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
      *value = peer ? 1 : 0;
      break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
      *value = peer && !pcie ? 1 : 0;
      break;
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
      *value = peer ? 1 : 0;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain", true);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st& c = s.contexts[dev];
  if (c.retains == 0) {
    if (CUresult r = ActivatePrimary(s, c); r != CUDA_SUCCESS) return r;
  }
  ++c.retains;
  *ctx = &c;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease_v2", false);
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st& c = s.contexts[dev];
  if (c.retains <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c.retains == 0) {
    WaitContext(s, lock, dev);  // the context's work finishes first
    DeactivatePrimary(c);
  }
  return CUDA_SUCCESS;
}

// A context of its own: active at once (its memory taken), current to the
// calling thread (pushed), as the driver's cuCtxCreate does. The parameters
// must be NULL or name neither affinity nor CIG (this fake has neither).
CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                        CUdevice dev) {
  FAKE_ENTER("cuCtxCreate_v4", true);
  (void)flags;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && (params->execAffinityParams != nullptr ||
                            params->numExecAffinityParams != 0 || params->cigParams != nullptr)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto c = std::make_unique<CUctx_st>();
  c->ordinal = dev;
  if (CUresult r = ActivatePrimary(s, *c); r != CUDA_SUCCESS) return r;
  c->retains = 1;
  *pctx = c.get();
  ContextStack().push_back(c.get());
  s.created.push_back(std::move(c));
  return CUDA_SUCCESS;
}

// Only a context cuCtxCreate made; popped from the calling thread's stack
// when current there.
CUresult cuCtxDestroy_v2(CUcontext ctx) {
  FAKE_ENTER("cuCtxDestroy_v2", false);
  for (auto it = s.created.begin(); it != s.created.end(); ++it) {
    if (it->get() != ctx) continue;
    std::vector<CUctx_st*>& stack = ContextStack();
    if (!stack.empty() && stack.back() == ctx) stack.pop_back();
    DeactivatePrimary(**it);
    s.created.erase(it);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_ENTER("cuCtxSetCurrent", false);
  std::vector<CUctx_st*>& stack = ContextStack();
  if (ctx == nullptr) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!IsContext(s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) {
    stack.push_back(ctx);
  } else {
    stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  FAKE_ENTER("cuCtxGetCurrent", false);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = Current();
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKE_ENTER("cuCtxPushCurrent_v2", false);
  if (ctx == nullptr || !IsContext(s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  ContextStack().push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  FAKE_ENTER("cuCtxPopCurrent_v2", false);
  std::vector<CUctx_st*>& stack = ContextStack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx != nullptr) *ctx = stack.back();
  stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  FAKE_ENTER("cuCtxGetDevice", false);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(ordinal);
  *device = ordinal;
  return CUDA_SUCCESS;
}

// Test hooks (not driver API): the violations this process has seen, joined
// by newlines into `buf` (truncated to `len`); returns how many.
int fakeCudaViolations(char* buf, size_t len) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  std::string all;
  for (const std::string& v : s.violations) all += v + "\n";
  if (buf != nullptr && len > 0) std::snprintf(buf, len, "%s", all.c_str());
  return static_cast<int>(s.violations.size());
}

void fakeCudaClearViolations() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.violations.clear();
}

// How many driver calls this process has made since cuInit.
long fakeCudaCalls() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.calls;
}

}  // extern "C"
