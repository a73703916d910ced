// The fake driver enforces what the driver enforces: each test runs in a
// fork()ed child that sets its own environment and then loads the fake
// (the parent never does), so every case gets a fresh driver configured its
// way. A child reports "" (pass) or what went wrong.
//
// Covered: device memory the host cannot touch; address reservations that
// are not host mappings; asynchronous streams (work runs later, in order,
// host functions hold a stream up), the NULL stream's early-returning
// pageable copy and asynchronous memset; violations for unmapping or reusing
// memory with work pending and for work reaching unmapped memory; a context
// stack per thread; fork after cuInit; per-context memory and other
// processes' use in cuMemGetInfo; compute modes; MIG UUIDs, CUDA_DEVICE_ORDER
// and device subsets; legacy IPC memory that dies with its exporter.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_driver.h"
#include "gtest/gtest.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Set in the processes the tests start to play a part (FakeCudaChild.*).
std::string Role() {
  const char* r = std::getenv("FAKE_CUDA_TEST_ROLE");
  return r != nullptr ? r : "";
}

std::string FakeDriver() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "gpumemd") +
         "/tests/fake_cuda/libcuda.so.1";
}

// Runs `body` in a child with `env` set; returns the child's verdict.
std::string InChild(const std::vector<std::pair<std::string, std::string>>& env,
                    const std::function<std::string(const CudaDriver&)>& body) {
  int p[2];
  if (pipe(p) != 0) return "pipe";
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::string verdict;
    absl::StatusOr<const CudaDriver*> d = LoadCudaDriver(FakeDriver().c_str());
    verdict = d.ok() ? body(**d) : std::string(d.status().message());
    (void)!write(p[1], verdict.data(), verdict.size());
    _exit(0);
  }
  close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::StrCat("child died (status ", status, "): ", out);
  }
  return out;
}

#define EXPECT_CU(call, want)                                                    \
  do {                                                                           \
    CUresult r_ = (call);                                                        \
    if (r_ != (want)) {                                                          \
      return absl::StrCat(#call, " returned ", static_cast<int>(r_), " not ",    \
                          static_cast<int>(want), " (line ", __LINE__, ")");     \
    }                                                                            \
  } while (0)
#define CHECK_TRUE(cond)                                                         \
  do {                                                                           \
    if (!(cond)) return absl::StrCat("not true: ", #cond, " (line ", __LINE__, ")"); \
  } while (0)

CUcontext Primary(const CudaDriver& d, int ordinal) {
  CUcontext ctx = nullptr;
  d.cuDevicePrimaryCtxRetain(&ctx, ordinal);
  return ctx;
}

int Violations(const CudaDriver& d, std::string* text = nullptr) {
  auto fn = reinterpret_cast<int (*)(char*, size_t)>(dlsym(d.lib, "fakeCudaViolations"));
  if (fn == nullptr) return -1;
  char buf[8192] = {};
  int n = fn(buf, sizeof(buf));
  if (text != nullptr) *text = buf;
  return n;
}

// A VMM allocation of `bytes` mapped read-write on device `ordinal`.
CUdeviceptr MapNew(const CudaDriver& d, int ordinal, uint64_t bytes,
                   CUmemGenericAllocationHandle* handle = nullptr) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  if (d.cuMemCreate(&h, bytes, &prop, 0) != CUDA_SUCCESS) return 0;
  if (d.cuMemAddressReserve(&va, bytes, 0, 0, 0) != CUDA_SUCCESS) return 0;
  if (d.cuMemMap(va, bytes, 0, h, 0) != CUDA_SUCCESS) return 0;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = ordinal;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (d.cuMemSetAccess(va, bytes, &access, 1) != CUDA_SUCCESS) return 0;
  if (handle != nullptr) *handle = h;
  return va;
}

// A host function that blocks its stream until *gate is set.
void WaitGate(void* gate) {
  auto* g = static_cast<std::atomic<bool>*>(gate);
  while (!g->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(FakeCudaTest, DeviceMemoryFaultsOnHostAccess) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUdeviceptr va = MapNew(d, 0, 2 * kMiB);
    CHECK_TRUE(va != 0);
    CUdeviceptr linear = 0;
    EXPECT_CU(d.cuMemAlloc_v2(&linear, 4096), CUDA_SUCCESS);
    char hello[6] = "hello";
    EXPECT_CU(d.cuMemcpyHtoD_v2(va, hello, 6), CUDA_SUCCESS);
    char back[6] = {};
    EXPECT_CU(d.cuMemcpyDtoH_v2(back, va, 6), CUDA_SUCCESS);
    CHECK_TRUE(std::strcmp(back, "hello") == 0);
    // A host load through either pointer faults (SIGSEGV; the child's own
    // handler says so, since sanitizers turn a bare fault into an abort).
    for (CUdeviceptr p : {va, linear}) {
      pid_t pid = fork();
      if (pid == 0) {
        signal(SIGSEGV, [](int) { _exit(77); });
        volatile char c = *reinterpret_cast<volatile char*>(p);
        (void)c;
        _exit(0);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      CHECK_TRUE((WIFEXITED(status) && WEXITSTATUS(status) == 77) ||
                 (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
    }
    return "";
  }), "");
}

TEST(FakeCudaTest, ReservationsAreNotHostMappingsAndAreReusedAtOnce) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUdeviceptr a = 0;
    EXPECT_CU(d.cuMemAddressReserve(&a, 4 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_CU(d.cuMemAddressFree(a, 4 * kMiB), CUDA_SUCCESS);
    // The host cannot claim the freed device range for itself...
    void* want = reinterpret_cast<void*>(a);
    void* got = mmap(want, 4 * kMiB, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK_TRUE(got != want);
    if (got != MAP_FAILED) munmap(got, 4 * kMiB);
    // ...and the driver hands the same range out again.
    CUdeviceptr b = 0;
    EXPECT_CU(d.cuMemAddressReserve(&b, 4 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_TRUE(b == a);
    return "";
  }), "");
}

TEST(FakeCudaTest, EveryMemoryCallNeedsACurrentContextAndTheStackIsPerThread) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    CUcontext c0 = Primary(d, 0), c1 = Primary(d, 1), cur = nullptr;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0;
    EXPECT_CU(d.cuMemCreate(&h, 2 * kMiB, &prop, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr p = 0;
    EXPECT_CU(d.cuMemAlloc_v2(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_CU(d.cuCtxPopCurrent_v2(&cur), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_CU(d.cuCtxPushCurrent_v2(c0), CUDA_SUCCESS);
    EXPECT_CU(d.cuCtxPushCurrent_v2(c1), CUDA_SUCCESS);
    EXPECT_CU(d.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    CHECK_TRUE(cur == c1);
    EXPECT_CU(d.cuMemCreate(&h, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
    int fd = -1;
    EXPECT_CU(d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    close(fd);
    // Another thread starts with no context.
    CUresult other = CUDA_SUCCESS;
    std::thread([&] {
      other = d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    }).join();
    EXPECT_CU(other, CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_CU(d.cuCtxPopCurrent_v2(&cur), CUDA_SUCCESS);
    CHECK_TRUE(cur == c1);
    EXPECT_CU(d.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    CHECK_TRUE(cur == c0);
    // SetCurrent replaces the top; SetCurrent(NULL) pops it.
    EXPECT_CU(d.cuCtxSetCurrent(c1), CUDA_SUCCESS);
    EXPECT_CU(d.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    CHECK_TRUE(cur == c1);
    EXPECT_CU(d.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    EXPECT_CU(d.cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    CHECK_TRUE(cur == nullptr);
    return "";
  }), "");
}

TEST(FakeCudaTest, StreamWorkRunsLaterInOrderAndHostFunctionsHoldTheStream) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUdeviceptr va = MapNew(d, 0, 2 * kMiB);
    CHECK_TRUE(va != 0);
    CUstream st = nullptr;
    EXPECT_CU(d.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    std::atomic<bool> gate{false};
    EXPECT_CU(d.cuLaunchHostFunc(st, WaitGate, &gate), CUDA_SUCCESS);
    EXPECT_CU(d.cuMemsetD8Async(va, 7, 4096, st), CUDA_SUCCESS);
    CUevent ev = nullptr;
    EXPECT_CU(d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    EXPECT_CU(d.cuEventRecord(ev, st), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_CU(d.cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    EXPECT_CU(d.cuStreamQuery(st), CUDA_ERROR_NOT_READY);
    gate.store(true);
    EXPECT_CU(d.cuEventSynchronize(ev), CUDA_SUCCESS);
    EXPECT_CU(d.cuEventQuery(ev), CUDA_SUCCESS);
    unsigned char b = 0;
    EXPECT_CU(d.cuMemcpyDtoH_v2(&b, va + 4095, 1), CUDA_SUCCESS);
    CHECK_TRUE(b == 7);
    CHECK_TRUE(Violations(d) == 0);
    return "";
  }), "");
}

TEST(FakeCudaTest, PageableCopyAndMemsetReturnBeforeTheBytesLand) {
  // Another process reading the memory (through the exported fd) sees the
  // old bytes until a synchronize.
  EXPECT_EQ(InChild({{"FAKE_CUDA_DELAY_MS", "300"}}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = MapNew(d, 0, 2 * kMiB, &h);
    CHECK_TRUE(va != 0);
    int fd = -1;
    EXPECT_CU(d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    char data[4] = {1, 2, 3, 4}, seen[4] = {};
    EXPECT_CU(d.cuMemcpyHtoD_v2(va, data, 4), CUDA_SUCCESS);
    CHECK_TRUE(pread(fd, seen, 4, 0) == 4 && seen[0] == 0);  // not there yet
    EXPECT_CU(d.cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    CHECK_TRUE(pread(fd, seen, 4, 0) == 4 && seen[3] == 4);
    EXPECT_CU(d.cuMemsetD8_v2(va, 9, 4), CUDA_SUCCESS);
    CHECK_TRUE(pread(fd, seen, 4, 0) == 4 && seen[0] == 1);  // memset: later too
    EXPECT_CU(d.cuCtxSynchronize(), CUDA_SUCCESS);
    CHECK_TRUE(pread(fd, seen, 4, 0) == 4 && seen[0] == 9);
    close(fd);
    return "";
  }), "");
}

TEST(FakeCudaTest, UnmapAndReuseWithWorkPendingAreViolations) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUdeviceptr va = MapNew(d, 0, 2 * kMiB);
    CHECK_TRUE(va != 0);
    CUstream st = nullptr;
    EXPECT_CU(d.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    std::atomic<bool> gate{false};
    EXPECT_CU(d.cuLaunchHostFunc(st, WaitGate, &gate), CUDA_SUCCESS);
    EXPECT_CU(d.cuMemsetD8Async(va, 7, 4096, st), CUDA_SUCCESS);
    // Reuse: the NULL stream writes the bytes the pending memset will write.
    char mine[16] = "the next owner";
    EXPECT_CU(d.cuMemcpyHtoD_v2(va, mine, sizeof(mine)), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string text;
    CHECK_TRUE(Violations(d, &text) == 1);
    CHECK_TRUE(absl::StrContains(text, "stream-order hazard"));
    // Unmap with the memset still queued; it then reaches unmapped memory.
    EXPECT_CU(d.cuMemUnmap(va, 2 * kMiB), CUDA_SUCCESS);
    CHECK_TRUE(Violations(d, &text) == 2);
    CHECK_TRUE(absl::StrContains(text, "cuMemUnmap of"));
    gate.store(true);
    EXPECT_CU(d.cuStreamSynchronize(st), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_TRUE(Violations(d, &text) == 3);
    CHECK_TRUE(absl::StrContains(text, "illegal address"));
    return "";
  }), "");
}

TEST(FakeCudaTest, WorkOrderedByAnEventIsNoHazard) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUdeviceptr va = MapNew(d, 0, 2 * kMiB);
    CUstream a = nullptr, b = nullptr;
    EXPECT_CU(d.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_CU(d.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    std::atomic<bool> gate{false};
    EXPECT_CU(d.cuLaunchHostFunc(a, WaitGate, &gate), CUDA_SUCCESS);
    EXPECT_CU(d.cuMemsetD8Async(va, 1, 4096, a), CUDA_SUCCESS);
    CUevent ev = nullptr;
    EXPECT_CU(d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    EXPECT_CU(d.cuEventRecord(ev, a), CUDA_SUCCESS);
    EXPECT_CU(d.cuStreamWaitEvent(b, ev, 0), CUDA_SUCCESS);
    EXPECT_CU(d.cuMemsetD8Async(va, 2, 4096, b), CUDA_SUCCESS);
    gate.store(true);
    EXPECT_CU(d.cuStreamSynchronize(b), CUDA_SUCCESS);
    unsigned char v = 0;
    EXPECT_CU(d.cuMemcpyDtoH_v2(&v, va, 1), CUDA_SUCCESS);
    CHECK_TRUE(v == 2);
    CHECK_TRUE(Violations(d) == 0);
    // An event of another context's stream is refused.
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 1)), CUDA_SUCCESS);
    EXPECT_CU(d.cuEventRecord(ev, nullptr), CUDA_ERROR_INVALID_HANDLE);
    return "";
  }), "");
}

TEST(FakeCudaTest, AForkChildOfAnInitialisedProcessCannotUseCuda) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    pid_t pid = fork();
    if (pid == 0) {
      int count = 0;
      bool ok = d.cuInit(0) == CUDA_ERROR_NOT_INITIALIZED &&
                d.cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int count = 0;
    EXPECT_CU(d.cuDeviceGetCount(&count), CUDA_SUCCESS);  // the parent still can
    return "";
  }), "");
}

TEST(FakeCudaTest, ContextsCostMemoryAndOtherProcessesShowInMemGetInfo) {
  EXPECT_EQ(InChild({{"FAKE_CUDA_DEVICES", "1x256MiB"},
                     {"FAKE_CUDA_CONTEXT_BYTES", "32MiB"},
                     {"FAKE_CUDA_OTHER_USED", "0=64MiB"}},
                    [](const CudaDriver& d) -> std::string {
    size_t total = 0, free = 0;
    EXPECT_CU(d.cuDeviceTotalMem_v2(&total, 0), CUDA_SUCCESS);
    CHECK_TRUE(total == 256 * kMiB);
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    EXPECT_CU(d.cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
    CHECK_TRUE(free == 256 * kMiB - 32 * kMiB - 64 * kMiB);
    // What is free, not the total, is what the driver gives.
    CUdeviceptr p = 0;
    EXPECT_CU(d.cuMemAlloc_v2(&p, 192 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_CU(d.cuMemAlloc_v2(&p, 160 * kMiB), CUDA_SUCCESS);
    return "";
  }), "");
}

TEST(FakeCudaTest, ComputeModes) {
  EXPECT_EQ(InChild({{"FAKE_CUDA_COMPUTE_MODE", "0=exclusive_process,1=prohibited"}},
                    [](const CudaDriver& d) -> std::string {
    int mode = -1;
    EXPECT_CU(d.cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0), CUDA_SUCCESS);
    CHECK_TRUE(mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS);
    CUcontext ctx = nullptr;
    EXPECT_CU(d.cuDevicePrimaryCtxRetain(&ctx, 1), CUDA_ERROR_UNKNOWN);
    EXPECT_CU(d.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    // A second process gets nothing while this one holds the context.
    pid_t pid = fork();
    if (pid == 0) {
      setenv("FAKE_CUDA_TEST_ROLE", "exclusive", 1);
      execl("/proc/self/exe", "/proc/self/exe", "--gtest_filter=FakeCudaChild.Exclusive",
            nullptr);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return "";
  }), "");
}

// Run by ComputeModes in a new process (same environment): device 0's
// context is held by its parent.
TEST(FakeCudaChild, Exclusive) {
  if (Role() != "exclusive") GTEST_SKIP() << "run by ComputeModes";
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver(FakeDriver().c_str());
  ASSERT_TRUE(d.ok()) << d.status();
  CUcontext ctx = nullptr;
  EXPECT_EQ((*d)->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_DEVICE_UNAVAILABLE);
}

TEST(FakeCudaTest, MigProfileNames) {
  for (const char* yes : {"NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                          "NVIDIA A100-SXM4-80GB MIG 1g.10gb+me", "NVIDIA H200 MIG 7g.141gb"}) {
    EXPECT_TRUE(IsMigProfileName(yes)) << yes;
  }
  for (const char* no : {"NVIDIA H200", "NVIDIA A100-SXM4-40GB", "MIG 1g.5gb", "X MIG g.5gb",
                         "X MIG 1g.gb", "X MIG 1g5gb", "X MIG 1g.5", "X MIGHTY 1g.5gb", ""}) {
    EXPECT_FALSE(IsMigProfileName(no)) << no;
  }
}

TEST(FakeCudaTest, MigOrderAndSubsets) {
  const std::string uuids =
      "GPU-aaaaaaaa-0000-0000-0000-000000000000,"
      "MIG-bbbbbbbb-1111-1111-1111-111111111111,"
      "GPU-cccccccc-2222-2222-2222-222222222222";
  auto uuid_of = [](const CudaDriver& d, int ordinal) {
    CUuuid u;
    d.cuDeviceGetUuid_v2(&u, ordinal);
    return FormatCudaUuid(u).substr(4, 8);
  };
  // Default (FASTEST_FIRST) order: 2, 0, 1; PCI order: 0, 1, 2.
  EXPECT_EQ(InChild({{"FAKE_CUDA_DEVICES", "3x64MiB"}, {"FAKE_CUDA_UUIDS", uuids},
                     {"FAKE_CUDA_FASTEST", "2,0,1"}},
                    [&](const CudaDriver& d) -> std::string {
    CHECK_TRUE(uuid_of(d, 0) == "cccccccc" && uuid_of(d, 1) == "aaaaaaaa");
    // The MIG device's first-version UUID is the GPU's, not the instance's.
    auto v1 = reinterpret_cast<CUresult (*)(CUuuid*, CUdevice)>(dlsym(d.lib, "cuDeviceGetUuid"));
    CHECK_TRUE(v1 != nullptr);
    CUuuid a, b;
    EXPECT_CU(v1(&a, 2), CUDA_SUCCESS);
    EXPECT_CU(d.cuDeviceGetUuid_v2(&b, 2), CUDA_SUCCESS);
    CHECK_TRUE(std::memcmp(a.bytes, b.bytes, 16) != 0);
    EXPECT_CU(v1(&a, 0), CUDA_SUCCESS);
    EXPECT_CU(d.cuDeviceGetUuid_v2(&b, 0), CUDA_SUCCESS);
    CHECK_TRUE(std::memcmp(a.bytes, b.bytes, 16) == 0);
    return "";
  }), "");
  EXPECT_EQ(InChild({{"FAKE_CUDA_DEVICES", "3x64MiB"}, {"FAKE_CUDA_UUIDS", uuids},
                     {"FAKE_CUDA_FASTEST", "2,0,1"}, {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                     {"CUDA_VISIBLE_DEVICES", "2,MIG-bbbbbbbb-1111-1111-1111-111111111111"}},
                    [&](const CudaDriver& d) -> std::string {
    int n = 0;
    EXPECT_CU(d.cuDeviceGetCount(&n), CUDA_SUCCESS);
    CHECK_TRUE(n == 2 && uuid_of(d, 0) == "cccccccc" && uuid_of(d, 1) == "bbbbbbbb");
    return "";
  }), "");
  // The second signal: where the first cuDeviceGetUuid does not answer, the
  // name's MIG profile ("... MIG 1g.10gb") still makes the instance "MIG-".
  EXPECT_EQ(InChild({{"FAKE_CUDA_DEVICES", "3x64MiB"}, {"FAKE_CUDA_UUIDS", uuids},
                     {"FAKE_CUDA_NO_UUID_V1", "1"}, {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"}},
                    [&](const CudaDriver& d) -> std::string {
    CUuuid a;
    CHECK_TRUE(d.cuDeviceGetUuid_v1 != nullptr &&
               d.cuDeviceGetUuid_v1(&a, 1) == CUDA_ERROR_NOT_SUPPORTED);
    absl::StatusOr<std::string> mig = CudaDeviceUuid(d, 1);
    absl::StatusOr<std::string> gpu = CudaDeviceUuid(d, 0);
    CHECK_TRUE(mig.ok() && *mig == "MIG-bbbbbbbb-1111-1111-1111-111111111111");
    CHECK_TRUE(gpu.ok() && *gpu == "GPU-aaaaaaaa-0000-0000-0000-000000000000");
    return "";
  }), "");
  // A container with devices 1 and 2: this process's 0 is the machine's 1.
  EXPECT_EQ(InChild({{"FAKE_CUDA_DEVICES", "3x64MiB"}, {"FAKE_CUDA_UUIDS", uuids},
                     {"FAKE_CUDA_SUBSET", "1,2"}},
                    [&](const CudaDriver& d) -> std::string {
    int n = 0;
    EXPECT_CU(d.cuDeviceGetCount(&n), CUDA_SUCCESS);
    CHECK_TRUE(n == 2 && uuid_of(d, 0) == "bbbbbbbb");
    return "";
  }), "");
}

TEST(FakeCudaTest, LegacyIpcMemoryDiesWithItsExporter) {
  EXPECT_EQ(InChild({}, [](const CudaDriver& d) -> std::string {
    int up[2], down[2];
    CHECK_TRUE(pipe2(up, O_CLOEXEC) == 0 && pipe2(down, O_CLOEXEC) == 0);
    pid_t exporter = fork();
    if (exporter == 0) {
      // A process of its own: exec'd so it initialises its own driver.
      dup2(up[1], 3);
      dup2(down[0], 4);
      setenv("FAKE_CUDA_TEST_ROLE", "ipc_exporter", 1);
      execl("/proc/self/exe", "/proc/self/exe", "--gtest_filter=FakeCudaChild.IpcExporter",
            nullptr);
      _exit(127);
    }
    close(up[1]);
    close(down[0]);
    CUipcMemHandle h;
    CHECK_TRUE(read(up[0], h.reserved, sizeof(h.reserved)) == sizeof(h.reserved));
    EXPECT_CU(d.cuCtxSetCurrent(Primary(d, 0)), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    EXPECT_CU(d.cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    unsigned char b = 0;
    EXPECT_CU(d.cuMemcpyDtoH_v2(&b, p, 1), CUDA_SUCCESS);
    CHECK_TRUE(b == 0x42);
    close(down[1]);  // the exporter exits
    int status = 0;
    waitpid(exporter, &status, 0);
    CHECK_TRUE(d.cuMemcpyDtoH_v2(&b, p, 1) != CUDA_SUCCESS);
    std::string text;
    CHECK_TRUE(Violations(d, &text) >= 1 && absl::StrContains(text, "dies with its exporter"));
    CUdeviceptr again = 0;
    EXPECT_CU(d.cuIpcCloseMemHandle(p), CUDA_SUCCESS);
    EXPECT_CU(d.cuIpcOpenMemHandle_v2(&again, h, 0), CUDA_ERROR_INVALID_VALUE);
    return "";
  }), "");
}

// Run by LegacyIpcMemoryDiesWithItsExporter: exports a cuMemAlloc whose
// first byte is 0x42 on fd 3, then holds it until fd 4 closes.
TEST(FakeCudaChild, IpcExporter) {
  if (Role() != "ipc_exporter") GTEST_SKIP() << "run by the IPC test";
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver(FakeDriver().c_str());
  ASSERT_TRUE(d.ok());
  CUcontext ctx = nullptr;
  ASSERT_EQ((*d)->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  ASSERT_EQ((*d)->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ((*d)->cuMemAlloc_v2(&p, 2 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ((*d)->cuMemsetD8_v2(p, 0x42, 2 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ((*d)->cuCtxSynchronize(), CUDA_SUCCESS);
  CUipcMemHandle h;
  ASSERT_EQ((*d)->cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
  ASSERT_EQ(write(3, h.reserved, sizeof(h.reserved)), static_cast<ssize_t>(sizeof(h.reserved)));
  char c;
  while (read(4, &c, 1) > 0) {
  }
}

}  // namespace
}  // namespace gpumem
