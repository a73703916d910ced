// The backends' promises (server/backend/backend.h): sim slabs are real
// shared memory with enforced capacity; the topology flag parses strictly;
// the cuda backend, without a driver, fails with a line a person can act on.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "server/backend/cuda_backend.h"
#include "server/backend/sim_backend.h"
#include "server/backend/sim_topology.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(SimBackendTest, DevicesHaveStableDistinctUuids) {
  SimBackend a({64 * kMiB, 64 * kMiB}), b({64 * kMiB, 64 * kMiB});
  ASSERT_EQ(a.devices().size(), 2u);
  EXPECT_EQ(a.devices()[0].uuid, b.devices()[0].uuid);
  EXPECT_NE(a.devices()[0].uuid, a.devices()[1].uuid);
  EXPECT_EQ(a.devices()[1].index, 1u);
  EXPECT_EQ(a.devices()[0].uuid.rfind("GPU-", 0), 0u);
  EXPECT_EQ(a.devices()[0].uuid.size(), 40u);
}

TEST(SimBackendTest, SlabsAreZeroedSharedMemoryAndCapacityIsEnforced) {
  SimBackend backend({16 * kMiB});
  auto slab = backend.CreateSlab(0, 12 * kMiB);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ(backend.SlabBytes(0), 12 * kMiB);
  auto too_big = backend.CreateSlab(0, 8 * kMiB);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);

  auto fd1 = (*slab)->ExportFd();
  auto fd2 = (*slab)->ExportFd();
  ASSERT_TRUE(fd1.ok() && fd2.ok());
  EXPECT_NE(*fd1, *fd2);
  char* a = static_cast<char*>(mmap(nullptr, 12 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, *fd1, 0));
  char* b = static_cast<char*>(mmap(nullptr, 12 * kMiB, PROT_READ, MAP_SHARED, *fd2, 0));
  ASSERT_NE(a, MAP_FAILED);
  ASSERT_NE(b, MAP_FAILED);
  EXPECT_EQ(b[5 * kMiB], 0);
  a[5 * kMiB] = 42;
  EXPECT_EQ(b[5 * kMiB], 42);
  ASSERT_TRUE((*slab)->Scrub(4 * kMiB, 2 * kMiB).ok());
  EXPECT_EQ(b[5 * kMiB], 0);
  EXPECT_FALSE((*slab)->Scrub(11 * kMiB, 2 * kMiB).ok());
  munmap(a, 12 * kMiB);
  munmap(b, 12 * kMiB);
  close(*fd1);
  close(*fd2);

  slab->reset();
  EXPECT_EQ(backend.SlabBytes(0), 0u);
  EXPECT_TRUE(backend.CreateSlab(0, 16 * kMiB).ok());
  EXPECT_EQ(backend.CreateSlab(1, kMiB).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimTopologyTest, GroupsAreCliquesAndTheRestGoesThroughTheHost) {
  auto m = ParseSimTopology("nvlink:0-1,2-3-4", 6);
  ASSERT_TRUE(m.ok()) << m.status();
  SimBackend backend(std::vector<uint64_t>(6, kMiB * 64), *m);
  EXPECT_EQ(backend.Peer(0, 0), PeerLink::kSelf);
  EXPECT_EQ(backend.Peer(0, 1), PeerLink::kNvLink);
  EXPECT_EQ(backend.Peer(1, 0), PeerLink::kNvLink);
  EXPECT_EQ(backend.Peer(2, 4), PeerLink::kNvLink);
  EXPECT_EQ(backend.Peer(1, 2), PeerLink::kHost);
  EXPECT_EQ(backend.Peer(5, 0), PeerLink::kHost);
  auto mixed = ParseSimTopology("nvlink:0-1; pcie:0-1-2", 4);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  SimBackend pcie(std::vector<uint64_t>(4, kMiB * 64), *mixed);
  EXPECT_EQ(pcie.Peer(0, 1), PeerLink::kNvLink);  // NVLink wins
  EXPECT_EQ(pcie.Peer(0, 2), PeerLink::kPcie);
  EXPECT_EQ(pcie.Peer(2, 1), PeerLink::kPcie);
  EXPECT_EQ(pcie.Peer(3, 0), PeerLink::kHost);
  auto none = ParseSimTopology("", 2);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)[1], PeerLink::kHost);
}

TEST(SimTopologyTest, RejectsWhatIsNotThere) {
  for (const char* bad : {"nvlink:0-4", "nvlink:0", "pci:0-1", "nvlink:0-x", "nvlink:", "0-1",
                          "nvlink:0-1;", "nvlink:0-1;pcie:3"}) {
    auto m = ParseSimTopology(bad, 4);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CudaBackendTest, WithoutADriverCreateSaysSoInOneActionableLine) {
  auto backend = CudaBackend::Create("libgpumemd-test-no-such-driver.so.1");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(backend.status().message());
  EXPECT_NE(msg.find("no NVIDIA driver"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--backend=sim"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// A record's integer becomes a kind in one place, and only a kind's own.
TEST(HandleKindRecord, RoundTripsEveryKindAndRefusesOthers) {
  for (HandleKind k : {HandleKind::kMemfd, HandleKind::kCudaVmmFd, HandleKind::kCudaIpc}) {
    EXPECT_EQ(HandleKindFromRecord(HandleKindToRecord(k)), k) << HandleKindName(k);
  }
  EXPECT_EQ(HandleKindFromRecord(3), std::nullopt);
  EXPECT_EQ(HandleKindFromRecord(255), std::nullopt);
}

}  // namespace
}  // namespace gpumem
