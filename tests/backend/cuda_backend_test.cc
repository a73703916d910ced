// The cuda backend and the fake driver (tests/fake_cuda) in one process.
//
// Two things are checked together: the fake rejects misuse with the CUresult
// the driver documents (so our bugs fail tests), and the cuda backend keeps
// its promises over it: UUIDs, peers and granularity from the driver, sizes
// refused off granularity, new slabs zeroed although the driver hands out
// dirty memory, legacy IPC slabs, driver figures, and driver errors that
// name the device and the call with the right status code.
//
// The fake reads its environment at cuInit, so main() sets it before any
// test runs; every test shares one driver instance.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "common/cuda_driver.h"
#include "gtest/gtest.h"
#include "server/backend/cuda_backend.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kCtx = 4 * kMiB;  // FAKE_CUDA_CONTEXT_BYTES, set in main()
constexpr char kUuid0[] = "GPU-00112233-4455-6677-8899-aabbccddeeff";
std::string lost_file;  // FAKE_CUDA_LOST_FILE

std::string FakeDriver() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "gpumemd") +
         "/tests/fake_cuda/libcuda.so.1";
}

const CudaDriver& Driver() {
  static const CudaDriver* d = [] {
    absl::StatusOr<const CudaDriver*> loaded = LoadCudaDriver(FakeDriver().c_str());
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *loaded : nullptr;
  }();
  return *d;
}

// No headroom unless asked: the cases below read the driver's figures exactly.
std::unique_ptr<Backend> NewBackend(std::optional<uint64_t> headroom = 0) {
  absl::StatusOr<std::unique_ptr<Backend>> b =
      CudaBackend::Create(FakeDriver().c_str(), headroom);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Makes device `ordinal`'s primary context current on this thread.
void Use(int ordinal) {
  const CudaDriver& d = Driver();
  CUcontext ctx = nullptr;
  ASSERT_EQ(d.cuDevicePrimaryCtxRetain(&ctx, ordinal), CUDA_SUCCESS);
  ASSERT_EQ(d.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

CUmemAllocationProp Prop(int ordinal) {
  CUmemAllocationProp p = {};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = ordinal;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// --- the fake driver rejects misuse as documented --------------------------

TEST(FakeCudaTest, VmmMisuseFailsWithDocumentedErrors) {
  const CudaDriver& d = Driver();
  Use(0);
  CUmemAllocationProp prop = Prop(0);
  CUmemGenericAllocationHandle h = 0;
  // Size not a multiple of the granularity.
  EXPECT_EQ(d.cuMemCreate(&h, 3 * kMiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d.cuMemCreate(&h, 4 * kMiB, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  EXPECT_EQ(d.cuMemAddressReserve(&va, 3 * kMiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d.cuMemAddressReserve(&va, 4 * kMiB, 0, 0, 0), CUDA_SUCCESS);
  // Past the end of the reservation; past the end of the allocation.
  EXPECT_EQ(d.cuMemMap(va + 2 * kMiB, 4 * kMiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d.cuMemMap(va, 4 * kMiB, 2 * kMiB, h, 0), CUDA_ERROR_INVALID_VALUE);
  // Misaligned address.
  EXPECT_EQ(d.cuMemMap(va + 4096, 2 * kMiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d.cuMemMap(va, 4 * kMiB, 0, h, 0), CUDA_SUCCESS);
  // Over an existing mapping.
  EXPECT_EQ(d.cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  // Mapped but no access set yet: copies fail.
  char buf[16] = "abc";
  EXPECT_EQ(d.cuMemcpyHtoD_v2(va, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 1;  // device 1 cannot reach device 0 (no peers)
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_EQ(d.cuMemSetAccess(va, 4 * kMiB, &access, 1), CUDA_ERROR_INVALID_DEVICE);
  access.location.id = 0;
  ASSERT_EQ(d.cuMemSetAccess(va, 4 * kMiB, &access, 1), CUDA_SUCCESS);
  EXPECT_EQ(d.cuMemcpyHtoD_v2(va, buf, sizeof(buf)), CUDA_SUCCESS);
  // A copy running past the mapping.
  EXPECT_EQ(d.cuMemcpyHtoD_v2(va + 4 * kMiB - 8, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
  // Freeing a reservation that is still mapped.
  EXPECT_EQ(d.cuMemAddressFree(va, 4 * kMiB), CUDA_ERROR_INVALID_VALUE);
  // Released handle: the mapping still works, the handle does not.
  ASSERT_EQ(d.cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(d.cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  EXPECT_EQ(d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
  char back[16] = {};
  EXPECT_EQ(d.cuMemcpyDtoH_v2(back, va, sizeof(back)), CUDA_SUCCESS);
  EXPECT_STREQ(back, "abc");
  // Unmap only whole mappings; after unmap, copies fail again.
  EXPECT_EQ(d.cuMemUnmap(va, 2 * kMiB), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d.cuMemUnmap(va, 4 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(d.cuMemcpyDtoH_v2(back, va, sizeof(back)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d.cuMemAddressFree(va, 4 * kMiB), CUDA_SUCCESS);
  // Not an fd this driver exported.
  CUmemGenericAllocationHandle imported = 0;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  EXPECT_EQ(d.cuMemImportFromShareableHandle(
                &imported, reinterpret_cast<void*>(static_cast<intptr_t>(pipefd[0])),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST(FakeCudaTest, LegacyIpcMisuse) {
  const CudaDriver& d = Driver();
  Use(0);
  CUdeviceptr p = 0;
  ASSERT_EQ(d.cuMemAlloc_v2(&p, 2 * kMiB), CUDA_SUCCESS);
  CUipcMemHandle h;
  // Only the base of an allocation has a handle.
  EXPECT_EQ(d.cuIpcGetMemHandle(&h, p + 4096), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d.cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
  // A process cannot open its own handle.
  CUdeviceptr opened = 0;
  EXPECT_EQ(d.cuIpcOpenMemHandle_v2(&opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(d.cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(d.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle junk = {};
  EXPECT_EQ(d.cuIpcOpenMemHandle_v2(&opened, junk, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST(FakeCudaTest, OutsideMemoryShowsInMemGetInfo) {
  const CudaDriver& d = Driver();
  Use(1);
  size_t free0 = 0, total = 0;
  ASSERT_EQ(d.cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 64 * kMiB);
  CUdeviceptr p = 0;
  ASSERT_EQ(d.cuMemAlloc_v2(&p, 8 * kMiB), CUDA_SUCCESS);
  size_t free1 = 0;
  ASSERT_EQ(d.cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
  EXPECT_EQ(free0 - free1, 8 * kMiB);
  CUdeviceptr too_big = 0;
  EXPECT_EQ(d.cuMemAlloc_v2(&too_big, free1 + kMiB), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(d.cuMemFree_v2(p), CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
  EXPECT_EQ(free1, free0);
}

// --- the cuda backend over the fake ----------------------------------------

TEST(CudaBackendTest, DevicesComeFromTheDriver) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->devices().size(), 3u);
  EXPECT_EQ(b->devices()[0].uuid, kUuid0);
  EXPECT_EQ(b->devices()[2].total_bytes, 32 * kMiB);
  // 1-2: peer access with native atomics (NVLink); 0-2: without (PCIe).
  EXPECT_EQ(b->Peer(1, 2), PeerLink::kNvLink);
  EXPECT_EQ(b->Peer(2, 0), PeerLink::kPcie);
  EXPECT_EQ(b->Peer(0, 2), PeerLink::kPcie);
  EXPECT_EQ(b->Peer(0, 1), PeerLink::kHost);
  EXPECT_EQ(b->Peer(1, 1), PeerLink::kSelf);
  EXPECT_EQ(b->Granularity(0), 2 * kMiB);
  ASSERT_EQ(b->handle_kinds().size(), 2u);
  EXPECT_EQ(b->handle_kinds()[0], HandleKind::kCudaVmmFd);
  EXPECT_EQ(b->handle_kinds()[1], HandleKind::kCudaIpc);
}

TEST(CudaBackendTest, SizesOffGranularityAreRefused) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  auto slab = b->CreateSlab(0, 3 * kMiB);
  EXPECT_EQ(slab.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(slab.status().message(), "granularity")) << slab.status();
  EXPECT_EQ(b->SlabBytes(0), 0u);
}

TEST(CudaBackendTest, NewSlabsReadAsZerosThoughTheDriverGivesDirtyMemory) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  auto slab = b->CreateSlab(0, 4 * kMiB, HandleKind::kCudaVmmFd);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ((*slab)->handle_kind(), HandleKind::kCudaVmmFd);
  absl::StatusOr<int> fd = (*slab)->ExportFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  // The fake's exported fd is its memfd: the test may look at the bytes.
  auto* p = static_cast<unsigned char*>(
      mmap(nullptr, 4 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  for (uint64_t i = 0; i < 4 * kMiB; i += 4096) ASSERT_EQ(p[i], 0) << i;
  std::memset(p + kMiB, 7, kMiB);
  ASSERT_TRUE((*slab)->Scrub(kMiB, kMiB / 2).ok());
  EXPECT_EQ(p[kMiB], 0);
  EXPECT_EQ(p[kMiB + kMiB / 2 - 1], 0);
  EXPECT_EQ(p[kMiB + kMiB / 2], 7);
  EXPECT_EQ((*slab)->IpcHandle().status().code(), absl::StatusCode::kFailedPrecondition);
  munmap(p, 4 * kMiB);
  close(*fd);
}

// Auto: what one more context costs (the fake's 4 MiB, measured with a
// context created and destroyed) and 64 MiB (more than 1/64 of 64 MiB),
// which leaves nothing of a 64 MiB device for slabs.
TEST(CudaBackendTest, AutoHeadroomIsAMeasuredContextAndRoomForLibraries) {
  std::unique_ptr<Backend> b = NewBackend(std::nullopt);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->Headroom(0), kCtx + 64 * kMiB);
  EXPECT_EQ(b->HeadroomOrigin(0),
            "auto: a context measured at 4.00 MiB + 64.00 MiB for libraries");
  absl::StatusOr<DriverMemInfo> m = b->DriverMemory(0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->free_bytes, 64 * kMiB - kCtx);  // the measuring context was destroyed
  EXPECT_EQ(b->NewSlabRoom(0), 0u);
  EXPECT_EQ(b->HeadroomShortfall(0), b->Headroom(0) - m->free_bytes);
  auto slab = b->CreateSlab(0, 2 * kMiB);
  EXPECT_EQ(slab.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(slab.status().message(),
                                "68.00 MiB of it kept for other processes' CUDA contexts and "
                                "libraries (--device_headroom)"))
      << slab.status();
}

TEST(CudaBackendTest, AGivenHeadroomIsLeftOutOfTheRoomForSlabs) {
  std::unique_ptr<Backend> b = NewBackend(10 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->Headroom(1), 10 * kMiB);
  EXPECT_EQ(b->HeadroomOrigin(1), "--device_headroom");
  absl::StatusOr<DriverMemInfo> m = b->DriverMemory(1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(b->NewSlabRoom(1), m->free_bytes - 10 * kMiB);
  EXPECT_EQ(b->HeadroomShortfall(1), 0u);
  auto fits = b->CreateSlab(1, b->NewSlabRoom(1));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(b->NewSlabRoom(1), 0u);
  EXPECT_EQ(b->CreateSlab(1, 2 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
}

// FAKE_CUDA_RDMA=1 (main): the devices support GPUDirect RDMA with VMM
// memory, so the backend's slabs are made RDMA-capable, as an importer sees.
TEST(CudaBackendTest, SlabsAreGpuDirectRdmaCapableWhereTheDeviceSupportsIt) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  auto slab = b->CreateSlab(0, 2 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  absl::StatusOr<int> fd = (*slab)->ExportFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  const CudaDriver& d = Driver();
  Use(0);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(d.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(*fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  CUmemAllocationProp prop = {};
  ASSERT_EQ(d.cuMemGetAllocationPropertiesFromHandle(&prop, h), CUDA_SUCCESS);
  EXPECT_EQ(prop.allocFlags.gpuDirectRDMACapable, 1);
  EXPECT_EQ(d.cuMemRelease(h), CUDA_SUCCESS);
  close(*fd);
}

TEST(CudaBackendTest, LegacyIpcSlabsHave64HandleBytesAndNoFd) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  auto slab = b->CreateSlab(1, 2 * kMiB, HandleKind::kCudaIpc);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ((*slab)->handle_kind(), HandleKind::kCudaIpc);
  absl::StatusOr<std::string> h = (*slab)->IpcHandle();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->size(), 64u);
  EXPECT_EQ((*slab)->ExportFd().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*slab)->Scrub(0, 2 * kMiB).ok());
  EXPECT_EQ(b->SlabBytes(1), 2 * kMiB);
  slab->reset();
  EXPECT_EQ(b->SlabBytes(1), 0u);
}

TEST(CudaBackendTest, MemoryTheDriverHasNotFreeIsRefusedNamingTheDevice) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  // Memory held outside the backend, straight from the driver.
  Use(2);
  const CudaDriver& d = Driver();
  CUdeviceptr outside = 0;
  ASSERT_EQ(d.cuMemAlloc_v2(&outside, 24 * kMiB), CUDA_SUCCESS);
  absl::StatusOr<DriverMemInfo> info = b->DriverMemory(2);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->total_bytes, 32 * kMiB);
  EXPECT_EQ(info->free_bytes, 8 * kMiB - kCtx);  // this process's context costs too
  // The backend's own count (32 MiB total) allows it, what the driver has
  // free does not: refused before any driver allocation is tried, naming
  // the figures.
  EXPECT_EQ(b->NewSlabRoom(2), 8 * kMiB - kCtx);
  auto slab = b->CreateSlab(2, 16 * kMiB);
  ASSERT_EQ(slab.status().code(), absl::StatusCode::kResourceExhausted) << slab.status();
  const std::string msg(slab.status().message());
  EXPECT_TRUE(absl::StrContains(msg, "device 2 (GPU-")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "the driver has 4.00 MiB free of 32.00 MiB")) << msg;
  EXPECT_FALSE(absl::StrContains(msg, "cuMemCreate")) << msg;
  EXPECT_EQ(b->SlabBytes(2), 0u);  // nothing counted for the failed slab
  ASSERT_EQ(d.cuMemFree_v2(outside), CUDA_SUCCESS);
  EXPECT_TRUE(b->CreateSlab(2, 16 * kMiB).ok());
}

TEST(CudaBackendTest, LostDeviceIsUnavailableNamingTheCall) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  { std::ofstream(lost_file) << "lost\n"; }
  auto slab = b->CreateSlab(0, 2 * kMiB);
  unlink(lost_file.c_str());
  ASSERT_EQ(slab.status().code(), absl::StatusCode::kUnavailable) << slab.status();
  EXPECT_TRUE(absl::StrContains(slab.status().message(), "CUDA_ERROR_DEVICE_UNAVAILABLE"));
  EXPECT_TRUE(absl::StrContains(slab.status().message(), "device 0 (" + std::string(kUuid0)));
  EXPECT_EQ(b->SlabBytes(0), 0u);
  EXPECT_TRUE(b->CreateSlab(0, 2 * kMiB).ok());  // back once the device is
}

// Every backend call that needs a context pushes the device's own and pops
// it: from a thread that has none (the slab channel's listener exports), or
// one that has another current (it is left as found).
TEST(CudaBackendTest, CallsBringTheirOwnContextAndLeaveTheCallersAlone) {
  std::unique_ptr<Backend> b = NewBackend();
  ASSERT_NE(b, nullptr);
  auto slab = b->CreateSlab(0, 2 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  absl::StatusOr<int> fd = absl::UnknownError("not run");
  std::thread([&] { fd = (*slab)->ExportFd(); }).join();
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  const CudaDriver& d = Driver();
  CUcontext mine = nullptr, now = nullptr;
  ASSERT_EQ(d.cuDevicePrimaryCtxRetain(&mine, 1), CUDA_SUCCESS);
  ASSERT_EQ(d.cuCtxSetCurrent(mine), CUDA_SUCCESS);
  auto slab2 = b->CreateSlab(0, 2 * kMiB, HandleKind::kCudaVmmFd);
  ASSERT_TRUE(slab2.ok()) << slab2.status();
  ASSERT_EQ(d.cuCtxGetCurrent(&now), CUDA_SUCCESS);
  EXPECT_EQ(now, mine) << "CreateSlab";
  EXPECT_TRUE((*slab2)->Scrub(0, kMiB).ok());
  fd = (*slab2)->ExportFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_TRUE(b->DriverMemory(0).ok());
  auto ipc = b->CreateSlab(0, 2 * kMiB, HandleKind::kCudaIpc);
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  slab2->reset();
  ipc->reset();
  ASSERT_EQ(d.cuCtxGetCurrent(&now), CUDA_SUCCESS);
  EXPECT_EQ(now, mine) << "Scrub, ExportFd, DriverMemory or a slab's release";
  ASSERT_EQ(d.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

TEST(CudaBackendTest, MissingDriverIsOneClearLine) {
  auto b = CudaBackend::Create("libcuda-not-here.so.1");
  ASSERT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(b.status().message(), "no NVIDIA driver"));
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  char dir[] = "/tmp/gpumemd-fakecuda-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 2;
  gpumem::lost_file = std::string(dir) + "/lost";
  setenv("FAKE_CUDA_DEVICES", "64MiB,64MiB,32MiB", 1);
  setenv("FAKE_CUDA_UUIDS", "GPU-00112233-4455-6677-8899-aabbccddeeff", 1);
  setenv("FAKE_CUDA_PEERS", "1-2,pcie:0-2", 1);
  setenv("FAKE_CUDA_RDMA", "1", 1);
  setenv("FAKE_CUDA_DIRTY", "1", 1);
  setenv("FAKE_CUDA_CONTEXT_BYTES", "4MiB", 1);
  setenv("FAKE_CUDA_LOST_FILE", gpumem::lost_file.c_str(), 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  rmdir(dir);
  return rc;
}
