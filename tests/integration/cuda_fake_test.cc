// The daemon's cuda backend end to end, in CI, over the fake driver
// (tests/fake_cuda on LD_LIBRARY_PATH of every process the test starts):
// two real processes share a slab through the CUDA VMM import and through
// legacy IPC handles, a client under a reordering CUDA_VISIBLE_DEVICES finds
// the right device, SIGKILL gives the memory back (down to the driver's own
// free figure), and driver failures reach the caller with the right code and
// words: out of memory (injected, or memory held outside gpumemd), a lost
// device, a handle kind the daemon does not offer. And what a real GPU holds
// the daemon to: a write is on the device when it returns (a
// reader in another process at once sees it), MIG instances are named
// "MIG-...", slabs are admitted against what the driver has free (other
// processes' memory and every context's cost), and a device in
// EXCLUSIVE_PROCESS compute mode stops the start, saying why. The test process itself
// only makes raw RPCs; processes that open slabs are cuda_share_client.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "client/lib/cpp/client.h"
#include "common/cuda_driver.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
using client::Client;
using client::PlacementRefusalOf;
namespace {

using testing::ChildProcess;
using testing::DaemonProcess;
using testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20;
// What each process's context costs on a device it uses (the fake's
// FAKE_CUDA_CONTEXT_BYTES, set below): the daemon has one on every device,
// each client process one on each device it maps memory of.
constexpr uint64_t kCtx = 4 * kMiB;

std::string FakeDriverPath() { return RunfilePath("tests/fake_cuda/libcuda.so.1"); }

// Polls `done` for up to 10 s (a loaded machine; the daemon's own promise is
// under a second, checked by daemon_test).
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// Every process the test starts finds the fake as libcuda.so.1.
void UseFakeDriver() {
  std::string dir = FakeDriverPath();
  dir = dir.substr(0, dir.rfind('/'));
  setenv("LD_LIBRARY_PATH", dir.c_str(), 1);
  setenv("FAKE_CUDA_DEVICES", "2x256MiB", 1);
  setenv("FAKE_CUDA_CONTEXT_BYTES", "4MiB", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
}

class CudaFakeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { UseFakeDriver(); }

  // A cuda daemon with `args`, and `env` (NAME=VALUE) set for it only.
  void StartDaemon(std::vector<std::string> args,
                   std::vector<std::pair<std::string, std::string>> env = {}) {
    args.insert(args.begin(), "--backend=cuda");
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    daemon_ = std::make_unique<DaemonProcess>(args);
    bool started = daemon_->Start();
    for (auto& [k, v] : env) unsetenv(k.c_str());
    ASSERT_TRUE(started) << daemon_->Log();
    auto c = Client::Connect(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  }

  absl::StatusOr<v1::AllocateResponse> Alloc(uint64_t size, const std::string& device,
                                             v1::HandleKind kind = v1::HANDLE_KIND_UNSPECIFIED) {
    v1::AllocateRequest req;
    req.set_size_bytes(size);
    req.mutable_placement()->add_devices(device);
    req.set_handle_kind(kind);
    return client_->AllocateRaw(req);
  }

  v1::DeviceStats Device(uint32_t index, bool slabs = false) {
    auto stats = client_->GetStats(slabs);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok() || stats->devices_size() <= static_cast<int>(index)) return {};
    return stats->devices(index);
  }

  // Starts a writer; returns it once it printed "ready", with its allocation.
  std::unique_ptr<ChildProcess> StartWriter(const std::string& device, const std::string& kind,
                                            uint64_t size, std::string* alloc_hex) {
    auto child = std::make_unique<ChildProcess>(std::vector<std::string>{
        RunfilePath("tests/integration/cuda_share_client"), "write",
        "--socket=" + daemon_->socket(), "--device=" + device, "--kind=" + kind,
        "--size=" + std::to_string(size), "--seed=5"});
    std::string line = child->ReadLine();
    EXPECT_EQ(line.rfind("alloc ", 0), 0u) << line << "\n" << daemon_->Log();
    if (line.size() > 6) *alloc_hex = line.substr(6);
    EXPECT_EQ(child->ReadLine(), "ready");
    return child;
  }

  // Runs a reader (optionally under `env_prefix`, e.g. CUDA_VISIBLE_DEVICES=1,0)
  // and returns its one line.
  std::string Read(const std::string& alloc_hex, const std::string& env_assignment = "") {
    std::vector<std::string> argv;
    if (!env_assignment.empty()) argv = {"/usr/bin/env", env_assignment};
    argv.insert(argv.end(), {RunfilePath("tests/integration/cuda_share_client"), "read",
                             "--socket=" + daemon_->socket(), "--alloc=" + alloc_hex,
                             "--seed=5"});
    ChildProcess reader(argv);
    std::string line = reader.ReadLine();
    reader.Wait();
    return line;
  }

  // 16 MiB allocations on device 0 until one is refused (*refused), at most
  // 32: the ids of those served.
  std::vector<uint64_t> FillDevice0(absl::Status* refused) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < 32; ++i) {
      auto a = Alloc(16 * kMiB, "0");
      if (!a.ok()) {
        *refused = a.status();
        break;
      }
      ids.push_back(a->allocations(0).id());
    }
    return ids;
  }

  // This process's own context on device 0, retained and pushed current: a
  // CUDA process of its own beside the daemon's clients.
  static const CudaDriver* EnterDevice0() {
    absl::StatusOr<const CudaDriver*> d = LoadCudaDriver(FakeDriverPath().c_str());
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    CUcontext ctx = nullptr;
    EXPECT_EQ((*d)->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    EXPECT_EQ((*d)->cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
    return *d;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(CudaFakeTest, TwoProcessesShareAVmmSlabAndKillGivesMemoryBack) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB", "--empty_slab_release_seconds=0"});
  const v1::DeviceStats before = Device(1);
  EXPECT_EQ(before.driver_total_bytes(), 256 * kMiB);
  EXPECT_EQ(before.driver_free_bytes(), 256 * kMiB - kCtx);  // the daemon's context
  std::string hex;
  auto writer = StartWriter("1", "vmm", 3 * kMiB, &hex);
  EXPECT_EQ(Read(hex), "read ok");
  v1::DeviceStats held = Device(1);
  EXPECT_EQ(held.used_bytes(), 3 * kMiB);
  // One slab, counted once although two processes map it, and the writer's
  // context.
  EXPECT_EQ(held.driver_free_bytes(), 256 * kMiB - 16 * kMiB - 2 * kCtx);
  writer->Kill(SIGKILL);
  EXPECT_EQ(writer->Wait(), -SIGKILL);
  EXPECT_TRUE(Eventually([&] { return Device(1).used_bytes() == 0; }));
  // The empty slab goes back to the driver, whose free figure is whole again.
  EXPECT_TRUE(Eventually([&] { return Device(1).driver_free_bytes() == 256 * kMiB - kCtx; }))
      << Device(1).DebugString();
}

TEST_F(CudaFakeTest, TwoProcessesShareALegacyIpcSlabAndKillGivesItBack) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB", "--empty_slab_release_seconds=0"});
  std::string hex;
  auto writer = StartWriter("0", "ipc", 2 * kMiB, &hex);
  v1::Allocation a;
  ASSERT_TRUE(a.ParseFromString(absl::HexStringToBytes(hex)));
  EXPECT_EQ(a.handle_kind(), v1::HANDLE_KIND_CUDA_IPC);
  EXPECT_EQ(a.ipc_handle().size(), 64u);
  EXPECT_EQ(Read(hex), "read ok");
  // A second block in the same slab: the reader opens the slab at its offset.
  auto second = StartWriter("0", "ipc", kMiB, &hex);
  ASSERT_TRUE(a.ParseFromString(absl::HexStringToBytes(hex)));
  EXPECT_GT(a.offset(), 0u);
  EXPECT_EQ(Read(hex), "read ok");
  EXPECT_EQ(Device(0).driver_free_bytes(), 256 * kMiB - 16 * kMiB - 3 * kCtx);
  // The writers were given the handle bytes: the slab goes back only once
  // both are gone.
  writer->Kill(SIGKILL);
  writer->Wait();
  EXPECT_TRUE(Eventually([&] { return Device(0).used_bytes() == kMiB; }));
  EXPECT_TRUE(Eventually(
      [&] { return Device(0).driver_free_bytes() == 256 * kMiB - 16 * kMiB - 2 * kCtx; }));
  second->Kill(SIGKILL);
  second->Wait();
  EXPECT_TRUE(Eventually([&] { return Device(0).driver_free_bytes() == 256 * kMiB - kCtx; }))
      << Device(0).DebugString();
}

TEST_F(CudaFakeTest, ReaderFindsTheDeviceByUuidUnderCudaVisibleDevices) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"});
  std::string hex;
  auto writer = StartWriter("1", "vmm", kMiB, &hex);
  // Daemon device 1 is this reader's device 0.
  EXPECT_EQ(Read(hex, "CUDA_VISIBLE_DEVICES=1,0"), "read ok");
  std::string hidden = Read(hex, "CUDA_VISIBLE_DEVICES=0");
  EXPECT_TRUE(absl::StrContains(hidden, "FAILED_PRECONDITION")) << hidden;
  EXPECT_TRUE(absl::StrContains(hidden, "not visible")) << hidden;
  auto ipc = StartWriter("1", "ipc", kMiB, &hex);
  EXPECT_EQ(Read(hex, "CUDA_VISIBLE_DEVICES=1,0"), "read ok");
}

TEST_F(CudaFakeTest, AnImportThatFailsNamesTheCallAndTheNextOneWorks) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"});
  std::string hex;
  auto writer = StartWriter("0", "vmm", kMiB, &hex);
  // The reader's own driver fails its first cuMemMap.
  std::string line = Read(hex, "FAKE_CUDA_FAIL=cuMemMap@1=CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_TRUE(absl::StrContains(line, "RESOURCE_EXHAUSTED")) << line;
  EXPECT_TRUE(absl::StrContains(line, "cuMemMap")) << line;
  EXPECT_TRUE(absl::StrContains(line, "CUDA_ERROR_OUT_OF_MEMORY")) << line;
  line = Read(hex, "FAKE_CUDA_FAIL=cuMemImportFromShareableHandle=CUDA_ERROR_NOT_SUPPORTED");
  EXPECT_TRUE(absl::StrContains(line, "cuMemImportFromShareableHandle")) << line;
  EXPECT_TRUE(absl::StrContains(line, "CUDA_ERROR_NOT_SUPPORTED")) << line;
  EXPECT_EQ(Read(hex), "read ok");
}

TEST_F(CudaFakeTest, InjectedOutOfMemoryIsResourceExhaustedNamingDeviceCallAndDriverError) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"},
              {{"FAKE_CUDA_FAIL", "cuMemCreate@2+=CUDA_ERROR_OUT_OF_MEMORY"}});
  ASSERT_TRUE(Alloc(kMiB, "0").ok());  // the first slab
  auto refused = Alloc(kMiB, "1");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  const std::string msg(refused.status().message());
  EXPECT_TRUE(absl::StrContains(msg, "device 1")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "cuMemCreate")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "CUDA_ERROR_OUT_OF_MEMORY")) << msg;
  // A driver failure is an error naming its cause, never a placement refusal.
  EXPECT_FALSE(PlacementRefusalOf(refused.status()).has_value());
  // Still serving; the existing slab still carves.
  EXPECT_TRUE(Alloc(kMiB, "0").ok());
}

TEST_F(CudaFakeTest, MemoryHeldOutsideGpumemdIsVisibleAndRefusedByTheDriver) {
  // No headroom: the driver's figures exactly (its case is below).
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB", "--device_headroom=0"});
  const CudaDriver* d = EnterDevice0();
  ASSERT_NE(d, nullptr);
  CUdeviceptr outside = 0;
  ASSERT_EQ(d->cuMemAlloc_v2(&outside, 200 * kMiB), CUDA_SUCCESS);
  v1::DeviceStats s = Device(0);
  EXPECT_EQ(s.driver_free_bytes(), 56 * kMiB - 2 * kCtx);  // the daemon's and this process's
  // The daemon's free figure is what the driver has, not its total.
  EXPECT_EQ(s.free_bytes(), s.driver_free_bytes());
  auto refused = Alloc(100 * kMiB, "0");  // a dedicated slab the driver cannot make
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(PlacementRefusalOf(refused.status()).has_value()) << refused.status();
  // Memory given back outside the daemon is found when it is needed.
  ASSERT_EQ(d->cuMemFree_v2(outside), CUDA_SUCCESS);
  EXPECT_TRUE(Alloc(100 * kMiB, "0").ok());
}

TEST_F(CudaFakeTest, LostDeviceIsUnavailableNamingTheCallAndTheDaemonKeepsServing) {
  const std::string lost = testing::MakeTempDir() + "/lost";
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"}, {{"FAKE_CUDA_LOST_FILE", lost}});
  { std::ofstream(lost) << "1\n"; }
  auto refused = Alloc(kMiB, "1");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "cuMemCreate")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "CUDA_ERROR_DEVICE_UNAVAILABLE"));
  EXPECT_TRUE(client_->GetStats().ok());
  unlink(lost.c_str());
  EXPECT_TRUE(Alloc(kMiB, "1").ok());
}

TEST_F(CudaFakeTest, KindNotOfferedIsFailedPreconditionSayingWhichAre) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB", "--handle_kinds=cuda_vmm_fd"});
  auto refused = Alloc(kMiB, "0", v1::HANDLE_KIND_CUDA_IPC);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "HANDLE_KIND_CUDA_VMM_FD"))
      << refused.status();
  auto fine = Alloc(kMiB, "0");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->allocations(0).handle_kind(), v1::HANDLE_KIND_CUDA_VMM_FD);
}

TEST_F(CudaFakeTest, BlocksOfDifferentKindsNeverShareASlab) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"});
  auto vmm = Alloc(kMiB, "0");
  auto ipc = Alloc(kMiB, "0", v1::HANDLE_KIND_CUDA_IPC);
  auto vmm2 = Alloc(kMiB, "0", v1::HANDLE_KIND_CUDA_VMM_FD);
  ASSERT_TRUE(vmm.ok() && ipc.ok() && vmm2.ok());
  EXPECT_EQ(vmm->allocations(0).handle_kind(), v1::HANDLE_KIND_CUDA_VMM_FD);
  EXPECT_TRUE(vmm->allocations(0).ipc_handle().empty());
  EXPECT_EQ(ipc->allocations(0).handle_kind(), v1::HANDLE_KIND_CUDA_IPC);
  EXPECT_NE(ipc->allocations(0).slab_id(), vmm->allocations(0).slab_id());
  EXPECT_EQ(vmm2->allocations(0).slab_id(), vmm->allocations(0).slab_id());
  // Sharded requests carry the kind to every shard.
  v1::AllocateRequest req;
  req.set_size_bytes(2 * kMiB);
  req.set_shard_count(2);
  req.set_handle_kind(v1::HANDLE_KIND_CUDA_IPC);
  auto shards = client_->AllocateRaw(req);
  ASSERT_TRUE(shards.ok()) << shards.status();
  for (const v1::Allocation& a : shards->allocations()) {
    EXPECT_EQ(a.handle_kind(), v1::HANDLE_KIND_CUDA_IPC);
    EXPECT_EQ(a.ipc_handle().size(), 64u);
  }
}

TEST_F(CudaFakeTest, SlabsAreMultiplesOfTheDriversGranularity) {
  StartDaemon({"--slab_size=10MiB", "--min_slab_size=10MiB"}, {{"FAKE_CUDA_GRANULARITY", "4MiB"}});
  ASSERT_TRUE(Alloc(kMiB, "0").ok());
  ASSERT_TRUE(Alloc(13 * kMiB, "0").ok());  // bigger than a slab: dedicated
  v1::DeviceStats s = Device(0, /*slabs=*/true);
  EXPECT_EQ(s.granularity_bytes(), 4 * kMiB);
  ASSERT_EQ(s.slabs_size(), 2);
  EXPECT_EQ(s.slabs(0).size_bytes(), 12 * kMiB);
  EXPECT_EQ(s.slabs(1).size_bytes(), 16 * kMiB);
}

TEST_F(CudaFakeTest, AWriteIsOnTheDeviceWhenItReturns) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"});
  // The writer's copies take a second to land (a pageable cuMemcpyHtoD
  // returns before its DMA completes); the reader reads at once.
  setenv("FAKE_CUDA_DELAY_MS", "1000", 1);
  std::string hex;
  auto writer = StartWriter("0", "vmm", kMiB, &hex);
  unsetenv("FAKE_CUDA_DELAY_MS");
  EXPECT_EQ(Read(hex), "read ok");
}

TEST_F(CudaFakeTest, MigDevicesAreNamedAsNvidiaSmiNamesThem) {
  const std::string mig = "MIG-5c89f3a1-2b4e-5d6f-8a9b-0c1d2e3f4a5b";
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"},
              {{"FAKE_CUDA_UUIDS", "GPU-00112233-4455-6677-8899-aabbccddeeff," + mig}});
  EXPECT_EQ(Device(0).uuid(), "GPU-00112233-4455-6677-8899-aabbccddeeff");
  EXPECT_EQ(Device(1).uuid(), mig);
  // A placement may name it so, and a client that sees only the instance
  // (CUDA_VISIBLE_DEVICES=MIG-...) opens its memory.
  setenv("FAKE_CUDA_UUIDS", ("GPU-00112233-4455-6677-8899-aabbccddeeff," + mig).c_str(), 1);
  std::string hex;
  auto writer = StartWriter(mig, "vmm", kMiB, &hex);
  EXPECT_EQ(Read(hex, "CUDA_VISIBLE_DEVICES=" + mig), "read ok");
  unsetenv("FAKE_CUDA_UUIDS");
}

TEST_F(CudaFakeTest, SlabsAreAdmittedAgainstWhatTheDriverHasFree) {
  // Other processes hold 40 MiB of device 0 and each context costs 24 MiB:
  // 256 - 40 - 24 (the daemon's) = 192 MiB are free, not 256.
  // No headroom: the driver's figures exactly (its case is below).
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB", "--device_headroom=0"},
              {{"FAKE_CUDA_OTHER_USED", "0=40MiB"}, {"FAKE_CUDA_CONTEXT_BYTES", "24MiB"}});
  v1::DeviceStats d = Device(0);
  // (Less if this test process holds a context of its own on device 0.)
  EXPECT_LE(d.driver_free_bytes(), 192 * kMiB);
  EXPECT_GE(d.driver_free_bytes(), 192 * kMiB - kCtx);
  EXPECT_LE(d.free_bytes(), d.driver_free_bytes()) << d.DebugString();
  const int fit = static_cast<int>(d.driver_free_bytes() / (16 * kMiB));
  absl::Status refused;
  const int served = static_cast<int>(FillDevice0(&refused).size());
  EXPECT_EQ(served, fit);  // what is free, in 16 MiB slabs
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  // The daemon knew it would not fit: a placement refusal, not the driver's
  // out of memory from a cuMemCreate that was tried anyway.
  EXPECT_TRUE(PlacementRefusalOf(refused).has_value()) << refused;
  EXPECT_FALSE(absl::StrContains(refused.message(), "cuMemCreate")) << refused;
  d = Device(0);
  EXPECT_LE(d.free_bytes(), d.driver_free_bytes());
  EXPECT_LT(d.free_bytes(), 16 * kMiB);
}

// A tenant fills device 0; a CUDA process that starts after it still gets
// its context and a 64 MiB workspace, because the daemon keeps each
// device's headroom free (by default one context as measured at start, here
// 24 MiB, and 64 MiB). Once the tenant's blocks are freed, its empty slabs
// go back to the driver as soon as that process grows into the headroom,
// not after the 30 s an empty slab is otherwise kept.
TEST_F(CudaFakeTest, ANewProcessFindsRoomForItsContextOnAFullDevice) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB"},
              {{"FAKE_CUDA_CONTEXT_BYTES", "24MiB"}});
  EXPECT_TRUE(absl::StrContains(daemon_->Log(), "headroom 88.00 MiB (auto: a context measured "
                                                "at 24.00 MiB + 64.00 MiB for libraries)"))
      << daemon_->Log();
  // 256 MiB - the daemon's 24 MiB context - 88 MiB of headroom (less this
  // process's context if an earlier case left one), in 16 MiB slabs.
  const uint64_t driver_free = Device(0).driver_free_bytes();
  ASSERT_GE(driver_free, 228 * kMiB);
  absl::Status refused;
  const std::vector<uint64_t> ids = FillDevice0(&refused);
  EXPECT_EQ(ids.size(), (driver_free - 88 * kMiB) / (16 * kMiB));
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "besides 88.00 MiB kept for other processes' CUDA contexts and "
                                "libraries (--device_headroom)"))
      << refused;
  v1::DeviceStats s = Device(0);
  EXPECT_GE(s.driver_free_bytes(), 88 * kMiB);
  EXPECT_LT(s.free_bytes(), 16 * kMiB);

  // A process that starts now (this one, 4 MiB a context: FAKE_CUDA_CONTEXT_BYTES).
  const CudaDriver* d = EnterDevice0();
  ASSERT_NE(d, nullptr);
  CUdeviceptr workspace = 0;
  EXPECT_EQ(d->cuMemAlloc_v2(&workspace, 64 * kMiB), CUDA_SUCCESS);

  // The tenant is done; its nine empty slabs would stay 30 s. This process
  // wants 64 MiB more: the daemon gives slabs back to restore its headroom.
  for (uint64_t id : ids) ASSERT_TRUE(client_->Free(id).ok());
  CUdeviceptr more = 0;
  EXPECT_TRUE(Eventually([&] { return d->cuMemAlloc_v2(&more, 64 * kMiB) == CUDA_SUCCESS; }))
      << Device(0).DebugString();
  EXPECT_TRUE(Eventually([&] { return Device(0).driver_free_bytes() >= 88 * kMiB; }))
      << Device(0).DebugString();
  if (more != 0) EXPECT_EQ(d->cuMemFree_v2(more), CUDA_SUCCESS);
  if (workspace != 0) EXPECT_EQ(d->cuMemFree_v2(workspace), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  EXPECT_EQ(d->cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  EXPECT_EQ(d->cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

TEST_F(CudaFakeTest, AnExplicitHeadroomIsKeptAndZeroKeepsNone) {
  StartDaemon({"--slab_size=16MiB", "--min_slab_size=16MiB", "--device_headroom=100MiB"});
  EXPECT_TRUE(absl::StrContains(daemon_->Log(), "headroom 100.00 MiB (--device_headroom)"))
      << daemon_->Log();
  v1::DeviceStats s = Device(1);
  EXPECT_EQ(s.free_bytes(), s.driver_free_bytes() - 100 * kMiB);
  // What is left outside the headroom, and not a byte more.
  EXPECT_TRUE(Alloc(s.free_bytes(), "1").ok());
  auto refused = Alloc(2 * kMiB, "1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "besides 100.00 MiB kept"))
      << refused.status();
  daemon_->Stop();
  daemon_.reset();
  StartDaemon({"--device_headroom=0"});
  EXPECT_FALSE(absl::StrContains(daemon_->Log(), "headroom")) << daemon_->Log();
  s = Device(1);
  EXPECT_EQ(s.free_bytes(), s.driver_free_bytes());
}

TEST(CudaFakeStartTest, AnExclusiveProcessDeviceStopsTheDaemonSayingWhy) {
  UseFakeDriver();
  setenv("FAKE_CUDA_COMPUTE_MODE", "1=exclusive_process", 1);
  DaemonProcess daemon({"--backend=cuda"});
  const bool started = daemon.Start();
  unsetenv("FAKE_CUDA_COMPUTE_MODE");
  EXPECT_FALSE(started);
  EXPECT_TRUE(absl::StrContains(daemon.Log(), "EXCLUSIVE_PROCESS")) << daemon.Log();
  EXPECT_TRUE(absl::StrContains(daemon.Log(), "device 1")) << daemon.Log();
  if (started) daemon.Stop();
}

TEST(CudaFakeStartTest, AKindTheBackendCannotMakeStopsTheDaemon) {
  UseFakeDriver();
  DaemonProcess daemon({"--backend=cuda", "--handle_kinds=memfd"});
  EXPECT_FALSE(daemon.Start());  // it exits before its socket appears
  EXPECT_TRUE(absl::StrContains(daemon.Log(), "memfd is not one the cuda backend makes"))
      << daemon.Log();
}

TEST(SimKindTest, SimOffersMemfdOnly) {
  DaemonProcess daemon({"--backend=sim", "--sim_devices=1x1GiB"});
  ASSERT_TRUE(daemon.Start());
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  v1::AllocateRequest req;
  req.set_size_bytes(kMiB);
  req.set_handle_kind(v1::HANDLE_KIND_CUDA_VMM_FD);
  auto refused = (*client)->AllocateRaw(req);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "HANDLE_KIND_MEMFD"));
  client->reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace gpumem
