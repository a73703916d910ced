// The client library (C ABI and PyTorch entry points) in this process,
// over a cuda gpumemd, both on the strict fake driver (tests/fake_cuda): the
// rules a real GPU holds the library to.
//  - Frees are stream-ordered: memory freed while work queued on it is
//    pending is reused only after that work completed (gpumem_torch_free:
//    the work queued on its stream before the free; gpumem_free: all work
//    queued on the device before it). The fake records any reuse, unmap or
//    release with work pending as a violation.
//  - A torch ordinal is this process's own CUDA device: the machine has
//    three GPUs, the daemon numbers them in the driver's default order, this
//    process (a container with two of them, CUDA_DEVICE_ORDER=PCI_BUS_ID)
//    numbers them otherwise.
//  - Every entry point leaves the calling thread's current context as it
//    found it.
//  - A fork() child of a process that initialised CUDA is told why it
//    cannot use the GPU.
//  - Addresses of memory lost at a daemon restart are never handed out
//    again (the driver's address reservation is kept).
#include <dlfcn.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/lib/cpp/client.h"
#include "client/lib/include/gpumem.h"
#include "client/lib/slabs/slab_mapper.h"
#include "common/cuda_driver.h"
#include "common/fd_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::DaemonProcess;
using testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20;
// PCI order: global devices 0, 1, 2. The driver's default order (and so the
// daemon's numbering) is 2, 0, 1; this process sees 0 and 1, in PCI order.
constexpr char kUuids[] =
    "GPU-00000000-0000-4000-8000-000000000000,"
    "GPU-11111111-1111-4111-8111-111111111111,"
    "GPU-22222222-2222-4222-8222-222222222222";
// Placement text for daemon device 1 (global 0, this process's ordinal 0).
constexpr char kOnOrdinal0[] = "--gpus=1";

std::string FakeDriverPath() { return RunfilePath("tests/fake_cuda/libcuda.so.1"); }
std::string violations_file;  // FAKE_CUDA_VIOLATIONS

const CudaDriver& Driver() {
  static const CudaDriver* d = [] {
    absl::StatusOr<const CudaDriver*> loaded = LoadCudaDriver(FakeDriverPath().c_str());
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
      std::abort();
    }
    return *loaded;
  }();
  return *d;
}

void ClearViolations() {
  reinterpret_cast<void (*)()>(dlsym(Driver().lib, "fakeCudaClearViolations"))();
}

CUcontext Primary(int ordinal) {
  CUcontext ctx = nullptr;
  EXPECT_EQ(Driver().cuDevicePrimaryCtxRetain(&ctx, ordinal), CUDA_SUCCESS);
  return ctx;
}

CUcontext CurrentContext() {
  CUcontext ctx = nullptr;
  EXPECT_EQ(Driver().cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  return ctx;
}

// Blocks its stream until *gate is set.
void WaitGate(void* gate) {
  auto* g = static_cast<std::atomic<bool>*>(gate);
  while (!g->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The daemon's device figures (strings in protobuf's JSON), by index.
std::vector<long long> DaemonUsed(gpumem_client* c) {
  char* j = nullptr;
  EXPECT_EQ(gpumem_stats_json(c, &j), GPUMEM_OK) << gpumem_last_error_message();
  std::string json = j != nullptr ? j : "";
  gpumem_string_free(j);
  std::vector<long long> out;
  size_t at = json.find("\"devices\":", json.find("\"daemon\":"));
  const size_t end = json.find("\"sessions\":", at);
  while ((at = json.find("\"index\":", at)) < end) {
    const size_t next = json.find("\"index\":", at + 1);
    const size_t used = json.find("\"used_bytes\":\"", at);
    out.push_back(used < next ? std::atoll(json.c_str() + used + 14) : 0);
    at += 8;
  }
  return out;
}

class CudaClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess({"--backend=cuda", "--slab_size=16MiB",
                                 "--empty_slab_release_seconds=0"});
    ASSERT_TRUE(StartDaemon()) << daemon_->Log();
    setenv("GPUMEMD_SOCKET", daemon_->socket().c_str(), 1);
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
  // The daemon sees the whole machine in the driver's default order.
  static bool StartDaemon() {
    unsetenv("FAKE_CUDA_SUBSET");
    unsetenv("CUDA_DEVICE_ORDER");
    const bool ok = daemon_->Start();
    setenv("FAKE_CUDA_SUBSET", "0,1", 1);
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
    return ok;
  }
  // Violations of this process and the daemon (both write the file).
  // Earlier tests' torch blocks go back now (their pending frees, then their
  // idle leases), not by the library's idle timer while this test reads the
  // daemon's figures.
  void SetUp() override {
    ClearViolations();
    std::ofstream(violations_file, std::ios::trunc).flush();
    ASSERT_EQ(gpumem_torch_empty_cache(), GPUMEM_OK) << gpumem_last_error_message();
  }
  void TearDown() override {
    std::ifstream in(violations_file);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), "");
  }
  gpumem_client* Connect() {
    gpumem_client* c = gpumem_connect(daemon_->socket().c_str());
    EXPECT_NE(c, nullptr) << gpumem_last_error_message();
    return c;
  }
  static DaemonProcess* daemon_;
};
DaemonProcess* CudaClientTest::daemon_ = nullptr;

TEST_F(CudaClientTest, TorchOrdinalsAreThisProcesssOwnCudaDevices) {
  gpumem_client* c = Connect();
  const std::vector<long long> before = DaemonUsed(c);
  ASSERT_EQ(before.size(), 3u);
  void* p = gpumem_torch_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr) << gpumem_last_error_message();
  // Ordinal 0 here is global device 0: the daemon's device 1.
  const std::vector<long long> after = DaemonUsed(c);
  EXPECT_GT(after[1], before[1]);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[2], before[2]);
  gpumem_torch_free(p, 4096, 0, nullptr);
  EXPECT_EQ(gpumem_last_error(), GPUMEM_OK) << gpumem_last_error_message();
  // This process has two devices, whatever the daemon has.
  EXPECT_EQ(gpumem_torch_malloc(4096, 2, nullptr), nullptr);
  EXPECT_TRUE(absl::StrContains(gpumem_last_error_message(), "device 2"))
      << gpumem_last_error_message();
  gpumem_close(c);
}

// This process sees two of the daemon's three devices (global 0 and 1: the
// daemon's 1 and 2). With no placement, every block lands on one of those;
// a placement naming the third is refused by name, and the daemon's figures
// do not move.
TEST_F(CudaClientTest, NoPlacementMeansTheDevicesThisProcessSees) {
  gpumem_client* c = Connect();
  const std::vector<long long> before = DaemonUsed(c);
  ASSERT_EQ(before.size(), 3u);
  std::vector<void*> blocks;
  for (int i = 0; i < 20; ++i) {
    void* p = nullptr;
    // Above the lease size: each block is an Allocate of its own.
    if (gpumem_malloc(c, 3 * kMiB, nullptr, &p) != GPUMEM_OK) {
      ADD_FAILURE() << "malloc " << i << ": " << gpumem_last_error_message();
      continue;
    }
    blocks.push_back(p);
    const int device = gpumem_device_of(c, p);
    EXPECT_TRUE(device == 1 || device == 2) << device << " " << gpumem_last_error_message();
  }
  EXPECT_EQ(blocks.size(), 20u) << "of 20 default mallocs";
  EXPECT_EQ(gpumem_device_count(c), 3);
  EXPECT_EQ(gpumem_visible_device_count(c), 2) << gpumem_last_error_message();
  void* shards[2] = {};
  int devices[2] = {-1, -1};
  ASSERT_EQ(gpumem_malloc_sharded(c, 6 * kMiB, 2, nullptr, shards, nullptr, devices),
            GPUMEM_OK)
      << gpumem_last_error_message();
  EXPECT_NE(devices[0], 0);
  EXPECT_NE(devices[1], 0);
  const std::vector<long long> during = DaemonUsed(c);
  EXPECT_EQ(during[0], before[0]) << "a block on the device this process cannot see";
  EXPECT_GE(during[1] + during[2], before[1] + before[2] + 66 * static_cast<long long>(kMiB));

  void* p = nullptr;
  EXPECT_EQ(gpumem_malloc_str(c, 4096, "--gpus=0", &p), GPUMEM_E_FAILED_PRECONDITION);
  const std::string why = gpumem_last_error_message();
  EXPECT_TRUE(absl::StrContains(why, "\"0\" is device 0 (GPU-22222222-2222-4222-8222-"
                                     "222222222222), which the calling process cannot see"))
      << why;
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(DaemonUsed(c), during);

  for (void* b : blocks) EXPECT_EQ(gpumem_free(c, b), GPUMEM_OK) << gpumem_last_error_message();
  for (void* b : shards) EXPECT_EQ(gpumem_free(c, b), GPUMEM_OK) << gpumem_last_error_message();
  gpumem_close(c);
}

// The two devices this process sees are peers (FAKE_CUDA_PEERS): a block on
// one is mapped for the other too, so the shards of a sharded allocation
// read each other with the other device's work (cuMemcpyDtoD in its
// context), which cuCtxEnablePeerAccess alone would not allow for VMM memory.
TEST_F(CudaClientTest, ShardsOnPeerDevicesReadEachOther) {
  const CudaDriver& d = Driver();
  gpumem_client* c = Connect();
  void* shards[2] = {};
  ASSERT_EQ(gpumem_malloc_sharded(c, 2 * kMiB, 2, nullptr, shards, nullptr, nullptr), GPUMEM_OK)
      << gpumem_last_error_message();
  int ordinal[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(gpumem_device_ordinal(c, shards[i], &ordinal[i]), GPUMEM_OK)
        << gpumem_last_error_message();
  }
  ASSERT_NE(ordinal[0], ordinal[1]);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      CUmemLocation where = {};
      where.type = CU_MEM_LOCATION_TYPE_DEVICE;
      where.id = ordinal[j];
      unsigned long long flags = 0;
      ASSERT_EQ(d.cuMemGetAccess(&flags, &where, reinterpret_cast<CUdeviceptr>(shards[i])),
                CUDA_SUCCESS);
      EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
          << "shard " << i << " from ordinal " << ordinal[j];
    }
  }
  std::vector<unsigned char> mine(kMiB), back(kMiB, 0);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<unsigned char>(i * 7 + 3);
  {
    ScopedCudaContext on(d, Primary(ordinal[0]));
    ASSERT_EQ(d.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(shards[0]), mine.data(), kMiB),
              CUDA_SUCCESS);
    ASSERT_EQ(d.cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  }
  {
    ScopedCudaContext on(d, Primary(ordinal[1]));
    ASSERT_EQ(d.cuMemcpyDtoD_v2(reinterpret_cast<CUdeviceptr>(shards[1]),
                                reinterpret_cast<CUdeviceptr>(shards[0]), kMiB),
              CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemcpyDtoH_v2(back.data(), reinterpret_cast<CUdeviceptr>(shards[1]), kMiB),
              CUDA_SUCCESS);
  }
  EXPECT_EQ(back, mine);
  for (void* b : shards) EXPECT_EQ(gpumem_free(c, b), GPUMEM_OK) << gpumem_last_error_message();
  gpumem_close(c);
}

long FakeCalls() {
  return reinterpret_cast<long (*)()>(dlsym(Driver().lib, "fakeCudaCalls"))();
}

// PyTorch's same-stream reuse: a block freed on stream S is the next
// malloc's on S at once, with no driver call (S runs the new owner's work
// after the old's), while a malloc on another stream does not get it until
// the work queued on S before the free has run.
TEST_F(CudaClientTest, ABlockFreedOnAStreamIsReusedOnItAtOnce) {
  const CudaDriver& d = Driver();
  ASSERT_EQ(d.cuCtxPushCurrent_v2(Primary(0)), CUDA_SUCCESS);
  CUstream s = nullptr, t = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(d.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  std::atomic<bool> gate{false};
  void* a = gpumem_torch_malloc(64 << 10, 0, s);
  ASSERT_NE(a, nullptr) << gpumem_last_error_message();
  ASSERT_EQ(d.cuLaunchHostFunc(s, WaitGate, &gate), CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a), 0x5A, 64 << 10, s), CUDA_SUCCESS);
  gpumem_torch_free(a, 64 << 10, 0, s);
  void* on_t = gpumem_torch_malloc(64 << 10, 0, t);
  EXPECT_NE(on_t, a) << "another stream got a block whose work has not run";
  const long before = FakeCalls();
  void* again = gpumem_torch_malloc(64 << 10, 0, s);
  gpumem_torch_free(again, 64 << 10, 0, s);
  void* third = gpumem_torch_malloc(64 << 10, 0, s);
  EXPECT_EQ(again, a);
  EXPECT_EQ(third, a);
  EXPECT_LE(FakeCalls() - before, 1) << "a same-stream pair made driver calls";
  gate.store(true);
  ASSERT_EQ(d.cuStreamSynchronize(s), CUDA_SUCCESS);
  gpumem_torch_free(third, 64 << 10, 0, s);
  gpumem_torch_free(on_t, 64 << 10, 0, t);
  ASSERT_EQ(d.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  ASSERT_EQ(d.cuStreamDestroy_v2(t), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  ASSERT_EQ(d.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
}

// Tensor.record_stream (gpumem_torch_record_stream): a block allocated on
// stream s and read by queued work on stream t is not handed back on s when
// it is freed there: its free waits for the device's work, t's included.
// Without the record, s would get it again at once (the test above).
TEST_F(CudaClientTest, ARecordedStreamKeepsTheBlockUntilItsWorkRan) {
  const CudaDriver& d = Driver();
  ScopedCudaContext app(d, Primary(0));
  ASSERT_EQ(app.result(), CUDA_SUCCESS);
  CUstream s = nullptr, t = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(d.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (size_t size : {size_t{64} << 10, size_t{6} << 20}) {
    SCOPED_TRACE(size);
    std::atomic<bool> gate{false};
    void* a = gpumem_torch_malloc(static_cast<ssize_t>(size), 0, s);
    ASSERT_NE(a, nullptr) << gpumem_last_error_message();
    // Work on the side stream writes the block, held up behind the gate.
    ASSERT_EQ(d.cuLaunchHostFunc(t, WaitGate, &gate), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a), 0x77, size, t), CUDA_SUCCESS);
    ASSERT_EQ(gpumem_torch_record_stream(a, t), GPUMEM_OK) << gpumem_last_error_message();
    gpumem_torch_free(a, static_cast<ssize_t>(size), 0, s);
    ASSERT_EQ(gpumem_last_error(), GPUMEM_OK) << gpumem_last_error_message();
    void* b = gpumem_torch_malloc(static_cast<ssize_t>(size), 0, s);
    ASSERT_NE(b, nullptr) << gpumem_last_error_message();
    EXPECT_NE(b, a) << "the block went back to its stream while the side stream's work was queued";
    std::vector<unsigned char> mine(size, 0x33), back(size);
    ASSERT_EQ(d.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(b), mine.data(), size),
              CUDA_SUCCESS);
    gate.store(true);
    ASSERT_EQ(d.cuStreamSynchronize(t), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemcpyDtoH_v2(back.data(), reinterpret_cast<CUdeviceptr>(b), size),
              CUDA_SUCCESS);
    EXPECT_EQ(back, mine) << "the next owner's bytes were overwritten";
    gpumem_torch_free(b, static_cast<ssize_t>(size), 0, s);
  }
  // Not a live block's start: refused by name; the record is per block.
  void* c = gpumem_torch_malloc(64 << 10, 0, s);  // a block in a shared lease
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(gpumem_torch_record_stream(static_cast<char*>(c) + 4096, t), GPUMEM_E_DOUBLE_FREE);
  int local = 0;
  EXPECT_EQ(gpumem_torch_record_stream(&local, t), GPUMEM_E_FOREIGN_POINTER);
  gpumem_torch_free(c, 64 << 10, 0, s);
  ASSERT_EQ(d.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  ASSERT_EQ(d.cuStreamDestroy_v2(t), CUDA_SUCCESS);
}

// gpumem_torch_memory_stats' graph_held_bytes (over every device).
uint64_t GraphHeldBytes() {
  gpumem_torch_stats st = {};
  EXPECT_EQ(gpumem_torch_memory_stats(0, &st), GPUMEM_OK) << gpumem_last_error_message();
  return st.graph_held_bytes;
}

// vLLM captures CUDA graphs (torch.cuda.graph: global mode, PyTorch's
// default). The application's thread captures with its own context pushed
// (not a ScopedCudaContext: that would make it RELAXED). During the capture
// the library maps a new block, polls its fences and trims from another
// thread, and the capture stays valid; blocks freed inside it are used by
// every replay, so nobody gets them while the graph lives.
TEST_F(CudaClientTest, GraphCaptureStaysValidAndItsBlocksWaitForTheGraph) {
  const CudaDriver& d = Driver();
  ASSERT_EQ(d.cuCtxPushCurrent_v2(Primary(0)), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  constexpr size_t kSmall = kMiB, kBig = 12 * kMiB;  // a lease's block; a whole block
  void* warm = gpumem_torch_malloc(kSmall, 0, s);
  ASSERT_NE(warm, nullptr) << gpumem_last_error_message();
  gpumem_torch_free(warm, kSmall, 0, s);
  const uint64_t held_before = GraphHeldBytes();

  ASSERT_EQ(d.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  void* a = gpumem_torch_malloc(kSmall, 0, s);
  ASSERT_NE(a, nullptr) << gpumem_last_error_message();
  void* big = gpumem_torch_malloc(kBig, 0, s);  // mapped during the capture
  ASSERT_NE(big, nullptr) << gpumem_last_error_message();
  ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a), 0x11, kSmall, s), CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(big), 0x22, kBig, s), CUDA_SUCCESS);
  gpumem_torch_free(a, kSmall, 0, s);
  EXPECT_EQ(gpumem_last_error(), GPUMEM_OK) << gpumem_last_error_message();
  gpumem_torch_free(big, kBig, 0, s);
  void* again = gpumem_torch_malloc(kSmall, 0, s);  // not `a`: the graph uses it
  EXPECT_NE(again, a);
  std::thread other([] { EXPECT_EQ(gpumem_torch_empty_cache(), GPUMEM_OK) << gpumem_last_error_message(); });
  other.join();
  CUgraph graph = nullptr;
  ASSERT_EQ(d.cuStreamEndCapture(s, &graph), CUDA_SUCCESS) << "the library broke the capture";
  EXPECT_GE(GraphHeldBytes(), held_before + kSmall + kBig);

  CUgraphExec exec = nullptr;
  ASSERT_EQ(d.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(d.cuGraphLaunch(exec, s), CUDA_SUCCESS);
  // While the graph lives (and its replays run), its blocks are nobody's.
  std::vector<std::pair<void*, size_t>> others;
  for (int i = 0; i < 8; ++i) {
    for (size_t size : {kSmall, kBig}) {
      void* p = gpumem_torch_malloc(size, 0, s);
      ASSERT_NE(p, nullptr) << gpumem_last_error_message();
      EXPECT_NE(p, a);
      EXPECT_NE(p, big);
      others.push_back({p, size});
    }
  }
  for (auto [p, size] : others) gpumem_torch_free(p, size, 0, s);
  gpumem_torch_free(again, kSmall, 0, s);
  ASSERT_EQ(d.cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_GE(GraphHeldBytes(), held_before + kSmall + kBig);

  // Gone with the graph and its executable: the blocks come back.
  ASSERT_EQ(d.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_GE(GraphHeldBytes(), held_before + kSmall + kBig) << "the graph still holds them";
  ASSERT_EQ(d.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(gpumem_torch_empty_cache(), GPUMEM_OK);
  EXPECT_EQ(GraphHeldBytes(), held_before);
  ASSERT_EQ(d.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  ASSERT_EQ(d.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
}

// A capture the application breaks (a device synchronize in global mode)
// discards its graph: what was freed into it comes back.
TEST_F(CudaClientTest, AnAbandonedCaptureGivesItsBlocksBack) {
  const CudaDriver& d = Driver();
  ASSERT_EQ(d.cuCtxPushCurrent_v2(Primary(0)), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const uint64_t held_before = GraphHeldBytes();
  ASSERT_EQ(d.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  void* a = gpumem_torch_malloc(kMiB, 0, s);
  ASSERT_NE(a, nullptr) << gpumem_last_error_message();
  ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a), 0x11, kMiB, s), CUDA_SUCCESS);
  gpumem_torch_free(a, kMiB, 0, s);
  EXPECT_EQ(GraphHeldBytes(), held_before + kMiB);
  EXPECT_EQ(d.cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  EXPECT_EQ(d.cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(gpumem_torch_empty_cache(), GPUMEM_OK);
  EXPECT_EQ(GraphHeldBytes(), held_before);
  ASSERT_EQ(d.cuStreamDestroy_v2(s), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  ASSERT_EQ(d.cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
}

// A block as a dma-buf for a NIC: the fd covers the block's pages, and the
// offset says where the block starts in it (the fake's dma-buf is a copy of
// the bytes at export: enough to check the range).
TEST_F(CudaClientTest, ABlockIsExportedAsADmaBufWithItsOffset) {
  const CudaDriver& d = Driver();
  gpumem_client* c = Connect();
  void* first = nullptr;
  void* p = nullptr;
  ASSERT_EQ(gpumem_malloc_str(c, 256, kOnOrdinal0, &first), GPUMEM_OK);
  ASSERT_EQ(gpumem_malloc_str(c, 256, kOnOrdinal0, &p), GPUMEM_OK);
  std::vector<unsigned char> mine(256);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<unsigned char>(i ^ 0x5c);
  {
    ScopedCudaContext on(d, Primary(0));
    ASSERT_EQ(d.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(p), mine.data(), mine.size()),
              CUDA_SUCCESS);
    ASSERT_EQ(d.cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  }
  int fd = -1;
  size_t offset = 0;
  ASSERT_EQ(gpumem_export_dmabuf(c, p, mine.size(), &fd, &offset), GPUMEM_OK)
      << gpumem_last_error_message();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(offset, reinterpret_cast<uintptr_t>(p) % page);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size) % page, 0u);
  EXPECT_GE(static_cast<size_t>(st.st_size), offset + mine.size());
  std::vector<unsigned char> back(mine.size());
  ASSERT_EQ(pread(fd, back.data(), back.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back, mine);
  close(fd);
  // Bad input, by code.
  EXPECT_EQ(gpumem_export_dmabuf(c, p, 0, &fd, &offset), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_EQ(gpumem_export_dmabuf(c, p, size_t{1} << 40, &fd, &offset), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_EQ(gpumem_export_dmabuf(c, mine.data(), 16, &fd, &offset), GPUMEM_E_FOREIGN_POINTER);
  EXPECT_EQ(gpumem_export_dmabuf(c, p, 16, nullptr, &offset), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, first), GPUMEM_OK);
  gpumem_close(c);
}

TEST_F(CudaClientTest, EveryEntryPointLeavesTheCallersContextAsFound) {
  const CudaDriver& d = Driver();
  // The application's own context: its device 1 (the library works on 0).
  for (CUcontext app : {Primary(1), static_cast<CUcontext>(nullptr)}) {
    ASSERT_EQ(d.cuCtxSetCurrent(app), CUDA_SUCCESS);
    auto same = [&](const char* call) {
      EXPECT_EQ(CurrentContext(), app) << call << " changed the current context";
    };
    gpumem_client* c = Connect();
    same("gpumem_connect");
    void* small = nullptr;
    void* large = nullptr;
    ASSERT_EQ(gpumem_malloc_str(c, 4096, kOnOrdinal0, &small), GPUMEM_OK)
        << gpumem_last_error_message();
    same("gpumem_malloc_str (a new lease)");
    ASSERT_EQ(gpumem_malloc_str(c, 12 * kMiB, kOnOrdinal0, &large), GPUMEM_OK)
        << gpumem_last_error_message();
    same("gpumem_malloc_str (a large block)");
    void* shards[2];
    gpumem_placement visible = {};
    visible.gpus = "1,2";  // the daemon's devices this process can see
    ASSERT_EQ(gpumem_malloc_sharded(c, 2 * kMiB, 2, &visible, shards, nullptr, nullptr),
              GPUMEM_OK) << gpumem_last_error_message();
    same("gpumem_malloc_sharded");
    EXPECT_EQ(gpumem_device_of(c, small), 1);
    same("gpumem_device_of");
    EXPECT_EQ(gpumem_free(c, small), GPUMEM_OK);
    EXPECT_EQ(gpumem_free(c, large), GPUMEM_OK);
    EXPECT_EQ(gpumem_free(c, shards[0]), GPUMEM_OK);
    EXPECT_EQ(gpumem_free(c, shards[1]), GPUMEM_OK);
    same("gpumem_free");
    void* t = gpumem_torch_malloc(8192, 0, nullptr);
    ASSERT_NE(t, nullptr) << gpumem_last_error_message();
    same("gpumem_torch_malloc");
    gpumem_torch_free(t, 8192, 0, nullptr);
    same("gpumem_torch_free");
    size_t released = 0;
    EXPECT_EQ(gpumem_trim(c, &released), GPUMEM_OK) << gpumem_last_error_message();
    same("gpumem_trim");
    char* json = nullptr;
    EXPECT_EQ(gpumem_stats_json(c, &json), GPUMEM_OK);
    gpumem_string_free(json);
    same("gpumem_stats_json");
    EXPECT_EQ(gpumem_close(c), GPUMEM_OK);
    same("gpumem_close");
    // The C++ client: a new Client maps its slab anew, copies, frees.
    {
      auto cc = client::Client::Connect(daemon_->socket());
      ASSERT_TRUE(cc.ok()) << cc.status();
      v1::PlacementRequest where;
      where.add_devices("1");
      auto b = (*cc)->Allocate(kMiB, where);
      ASSERT_TRUE(b.ok()) << b.status();
      same("Client::Allocate");
      std::vector<char> bytes(4096, 7);
      EXPECT_TRUE(b->Write(0, bytes.data(), bytes.size()).ok());
      EXPECT_TRUE(b->Read(0, bytes.data(), bytes.size()).ok());
      same("Buffer::Write/Read");
      EXPECT_TRUE(b->Free().ok());
      same("Buffer::Free");
    }
    same("~Client");
  }
  ASSERT_EQ(d.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

// The work queued on `stream` before the free keeps a block from reuse,
// for a block served from a lease and for a large block (a daemon
// allocation of its own, unmapped when freed).
TEST_F(CudaClientTest, TorchFreeWaitsForWorkQueuedOnItsStream) {
  const CudaDriver& d = Driver();
  ScopedCudaContext app(d, Primary(0));  // as PyTorch: device 0's primary context
  ASSERT_EQ(app.result(), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (size_t size : {size_t{1} << 20, size_t{6} << 20}) {
    SCOPED_TRACE(size);
    std::atomic<bool> gate{false};
    void* p = gpumem_torch_malloc(static_cast<ssize_t>(size), 0, stream);
    ASSERT_NE(p, nullptr) << gpumem_last_error_message();
    // A kernel that writes the block, held up behind the gate.
    ASSERT_EQ(d.cuLaunchHostFunc(stream, WaitGate, &gate), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0xAB, size, stream),
              CUDA_SUCCESS);
    // PyTorch frees the tensor while the kernel is still queued.
    gpumem_torch_free(p, static_cast<ssize_t>(size), 0, stream);
    ASSERT_EQ(gpumem_last_error(), GPUMEM_OK) << gpumem_last_error_message();
    // The next owner (another stream) gets memory the kernel does not write.
    void* q = gpumem_torch_malloc(static_cast<ssize_t>(size), 0, nullptr);
    ASSERT_NE(q, nullptr) << gpumem_last_error_message();
    EXPECT_NE(q, p);
    std::vector<unsigned char> mine(size, 0x11), back(size);
    ASSERT_EQ(d.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(q), mine.data(), size),
              CUDA_SUCCESS);
    ASSERT_EQ(d.cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    gate.store(true);
    ASSERT_EQ(d.cuStreamSynchronize(stream), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemcpyDtoH_v2(back.data(), reinterpret_cast<CUdeviceptr>(q), size),
              CUDA_SUCCESS);
    EXPECT_EQ(back, mine) << "the next owner's bytes were overwritten";
    gpumem_torch_free(q, static_cast<ssize_t>(size), 0, nullptr);
  }
  ASSERT_EQ(d.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// Buffer::Free (and ~Buffer) keep gpumem_free's rule: the call returns at
// once, and the block is unmapped and given back to the daemon only after
// the work this process queued on its device before the free has run (on a
// non-blocking stream here), so the next Buffer does not get it meanwhile.
TEST_F(CudaClientTest, ABufferFreeWaitsForTheDevicesQueuedWork) {
  const CudaDriver& d = Driver();
  gpumem_client* c = Connect();  // for the daemon's figures
  auto cc = client::Client::Connect(daemon_->socket());
  ASSERT_TRUE(cc.ok()) << cc.status();
  ScopedCudaContext app(d, Primary(0));
  CUstream stream = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  v1::PlacementRequest where;
  where.add_devices("1");  // this process's ordinal 0
  const long long base = DaemonUsed(c)[1];
  for (uint64_t size : {uint64_t{1} << 20, uint64_t{6} << 20}) {
    SCOPED_TRACE(size);
    std::atomic<bool> gate{false};
    auto b = (*cc)->Allocate(size, where);
    ASSERT_TRUE(b.ok()) << b.status();
    const CUdeviceptr old = reinterpret_cast<CUdeviceptr>(b->data());
    ASSERT_EQ(d.cuLaunchHostFunc(stream, WaitGate, &gate), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemsetD8Async(old, 0xEE, size, stream), CUDA_SUCCESS);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(b->Free().ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1))
        << "Buffer::Free waited for the queued work";
    EXPECT_FALSE(b->valid());
    // The daemon still lends it: the next Buffer is other memory.
    EXPECT_GE(DaemonUsed(c)[1], base + static_cast<long long>(size));
    auto next = (*cc)->Allocate(size, where);
    ASSERT_TRUE(next.ok()) << next.status();
    std::vector<unsigned char> mine(size, 0x44), back(size);
    ASSERT_TRUE(next->Write(0, mine.data(), size).ok());
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      gate.store(true);
    });
    (*cc)->FlushFrees();  // returns once the queued work ran and the block went back
    opener.join();
    ASSERT_TRUE(gate.load());
    EXPECT_EQ(DaemonUsed(c)[1], base + static_cast<long long>(next->size()));
    ASSERT_TRUE(next->Read(0, back.data(), size).ok());
    EXPECT_EQ(back, mine) << "the next Buffer's bytes were overwritten";
  }
  ASSERT_EQ(d.cuStreamSynchronize(stream), CUDA_SUCCESS);
  ASSERT_EQ(d.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
  // ~Client gives back what is still waiting (nothing queued now).
  {
    std::atomic<bool> gate{false};
    auto b = (*cc)->Allocate(kMiB, where);
    ASSERT_TRUE(b.ok()) << b.status();
    CUstream s2 = nullptr;
    ASSERT_EQ(d.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(d.cuLaunchHostFunc(s2, WaitGate, &gate), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(b->data()), 1, kMiB, s2),
              CUDA_SUCCESS);
    *b = client::Buffer();  // ~Buffer: deferred as Free is
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      gate.store(true);
    });
    cc->reset();  // waits for the work, then frees
    opener.join();
    ASSERT_EQ(d.cuStreamDestroy_v2(s2), CUDA_SUCCESS);
  }
  EXPECT_EQ(DaemonUsed(c)[1], base);
  gpumem_close(c);
}

// gpumem_free's rule: a block is reused only after all the work this
// process queued on its device before the free has completed.
TEST_F(CudaClientTest, GpumemFreeWaitsForTheDevicesQueuedWork) {
  const CudaDriver& d = Driver();
  gpumem_client* c = Connect();
  ScopedCudaContext app(d, Primary(0));
  CUstream stream = nullptr;
  ASSERT_EQ(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (size_t size : {size_t{64} << 10, size_t{6} << 20}) {
    SCOPED_TRACE(size);
    std::atomic<bool> gate{false};
    void* p = nullptr;
    ASSERT_EQ(gpumem_malloc_str(c, size, kOnOrdinal0, &p), GPUMEM_OK)
        << gpumem_last_error_message();
    ASSERT_EQ(d.cuLaunchHostFunc(stream, WaitGate, &gate), CUDA_SUCCESS);
    ASSERT_EQ(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0xCD, size, stream),
              CUDA_SUCCESS);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(gpumem_free(c, p), GPUMEM_OK) << gpumem_last_error_message();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1))
        << "gpumem_free waited for the queued work";
    void* q = nullptr;
    ASSERT_EQ(gpumem_malloc_str(c, size, kOnOrdinal0, &q), GPUMEM_OK);
    EXPECT_NE(q, p);
    std::vector<unsigned char> mine(size, 0x22), back(size);
    ASSERT_EQ(d.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(q), mine.data(), size),
              CUDA_SUCCESS);
    ASSERT_EQ(d.cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    // Trim gives everything free back to the daemon: it has to wait for the
    // queued work, which the gate releases a little later.
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      gate.store(true);
    });
    EXPECT_EQ(gpumem_free(c, q), GPUMEM_OK);
    EXPECT_EQ(gpumem_trim(c, nullptr), GPUMEM_OK) << gpumem_last_error_message();
    opener.join();
    ASSERT_EQ(d.cuStreamSynchronize(stream), CUDA_SUCCESS);
    // Nothing is held back any more: it all went back to the daemon.
    char* json = nullptr;
    ASSERT_EQ(gpumem_stats_json(c, &json), GPUMEM_OK);
    EXPECT_TRUE(absl::StrContains(json, "\"deferred_blocks\":0,")) << json;
    EXPECT_TRUE(absl::StrContains(json, "\"leases\":0,")) << json;
    gpumem_string_free(json);
  }
  ASSERT_EQ(d.cuStreamDestroy_v2(stream), CUDA_SUCCESS);
  gpumem_close(c);
}

TEST_F(CudaClientTest, AForkChildIsToldItCannotUseCuda) {
  gpumem_client* c = Connect();
  void* p = nullptr;
  ASSERT_EQ(gpumem_malloc_str(c, 4096, kOnOrdinal0, &p), GPUMEM_OK)
      << gpumem_last_error_message();  // CUDA is initialised and used here now
  // What the child needs to open a slab by hand: the allocation and its fd.
  auto client = client::Client::Connect(daemon_->socket());
  ASSERT_TRUE(client.ok()) << client.status();
  v1::AllocateRequest req;
  req.set_size_bytes(kMiB);
  req.mutable_placement()->add_devices("1");
  auto raw = (*client)->AllocateRaw(req);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const v1::Allocation a = raw->allocations(0);
  auto channel = ConnectFdChannel(daemon_->socket());
  ASSERT_TRUE(channel.ok());
  auto slab = RequestSlabFd(*channel, a.slab_id());
  ASSERT_TRUE(slab.ok()) << slab.status();
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    // The library's mapper, as a new client in the child would use it.
    std::string verdict;
    auto mapper = client::NewSlabMapper(v1::HANDLE_KIND_CUDA_VMM_FD);
    absl::Status s = mapper.status();
    if (mapper.ok()) {
      auto opened = (*mapper)->Open(a, [&]() -> absl::StatusOr<SlabFd> {
        return SlabFd{dup(slab->fd), slab->size};
      });
      s = opened.status();
    }
    verdict = absl::StrCat(static_cast<int>(s.code()), " ", s.message());
    // PyTorch's entry points in the child (this process used them before).
    if (gpumem_torch_malloc(4096, 0, nullptr) != nullptr ||
        gpumem_last_error() != GPUMEM_E_FAILED_PRECONDITION ||
        !absl::StrContains(gpumem_last_error_message(), "fork()")) {
      verdict += absl::StrCat(" | torch: ", gpumem_last_error(), " ",
                              gpumem_last_error_message());
    }
    (void)!write(pipefd[1], verdict.data(), verdict.size());
    _exit(0);  // the child shares the test's violations file: it records none
  }
  close(pipefd[1]);
  std::string verdict;
  char buf[1024];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) verdict.append(buf, n);
  close(pipefd[0]);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(verdict.substr(0, 2), absl::StrCat(static_cast<int>(absl::StatusCode::kFailedPrecondition), " "))
      << verdict;
  EXPECT_TRUE(absl::StrContains(verdict, "fork")) << verdict;
  EXPECT_FALSE(absl::StrContains(verdict, "unavailable")) << verdict;
  EXPECT_FALSE(absl::StrContains(verdict, "torch:")) << verdict;
  close(slab->fd);
  close(*channel);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_OK);
  gpumem_close(c);
}

TEST_F(CudaClientTest, AddressesLostAtADaemonRestartAreNeverHandedOutAgain) {
  setenv("GPUMEM_RECONNECT_MS", "10000", 1);
  gpumem_client* c = Connect();
  void* p = nullptr;
  ASSERT_EQ(gpumem_malloc_str(c, kMiB, kOnOrdinal0, &p), GPUMEM_OK)
      << gpumem_last_error_message();
  ASSERT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  ASSERT_TRUE(StartDaemon()) << daemon_->Log();
  // The block is lost; freeing it says so, and its addresses stay taken.
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_E_LOST) << gpumem_last_error_message();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  const uintptr_t hi = lo + 8 * kMiB;  // the lost lease
  std::vector<void*> fresh;
  for (int i = 0; i < 4; ++i) {
    void* q = nullptr;
    ASSERT_EQ(gpumem_malloc_str(c, kMiB, kOnOrdinal0, &q), GPUMEM_OK)
        << gpumem_last_error_message();
    const uintptr_t at = reinterpret_cast<uintptr_t>(q);
    EXPECT_TRUE(at + kMiB <= lo || at >= hi) << "a lost address came back: " << q;
    fresh.push_back(q);
  }
  EXPECT_EQ(gpumem_device_of(c, p), -1);
  EXPECT_EQ(gpumem_last_error(), GPUMEM_E_LOST);
  for (void* q : fresh) EXPECT_EQ(gpumem_free(c, q), GPUMEM_OK);
  gpumem_close(c);
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  setenv("FAKE_CUDA_DEVICES", "3x256MiB", 1);
  setenv("FAKE_CUDA_UUIDS", gpumem::kUuids, 1);
  setenv("FAKE_CUDA_FASTEST", "2,0,1", 1);
  setenv("FAKE_CUDA_CONTEXT_BYTES", "4MiB", 1);
  setenv("FAKE_CUDA_SUBSET", "0,1", 1);
  setenv("FAKE_CUDA_PEERS", "0-1", 1);
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("GPUMEM_PLACEMENT");
  setenv("GPUMEM_LEASE_SIZE", "8MiB", 1);  // blocks up to 2 MiB come from leases
  setenv("GPUMEM_IDLE_RELEASE_MS", "60000", 1);
  char dir[] = "/tmp/gpumemd-cudaclient-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 2;
  gpumem::violations_file = std::string(dir) + "/violations";
  setenv("FAKE_CUDA_VIOLATIONS", gpumem::violations_file.c_str(), 1);
  // The daemon, a child, finds the fake by LD_LIBRARY_PATH; this process
  // loads it by path first, so the library's dlopen("libcuda.so.1") gets it.
  std::string lib = gpumem::FakeDriverPath();
  setenv("LD_LIBRARY_PATH", lib.substr(0, lib.rfind('/')).c_str(), 1);
  (void)gpumem::Driver();
  int rc = RUN_ALL_TESTS();
  unlink(gpumem::violations_file.c_str());
  rmdir(dir);
  return rc;
}
