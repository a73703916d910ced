// NodeStorage: the owner hands out slots in order and writes each one; with
// a PagePopulator working on the same arrays in the background (and
// without one), every slot it handed out stays writable and keeps what was
// written, through growth in place and through remaps past the
// reservation; the populator does the faulting-in; Check holds throughout;
// a storage dropped with work still queued is skipped, not touched.
#include "common/alloc/node_storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "common/alloc/page_populator.h"

namespace gpumem {
namespace {

constexpr size_t kNodeBytes = 32;

uint64_t Pattern(uint32_t slot) { return 0x9E3779B97F4A7C15ull * (slot + 1); }

// Hands out slots [0, slots) the way OffsetAllocator does and writes a
// pattern into each (node and flag byte); checks all of them at the end.
void HandOut(NodeStorage* s, uint32_t slots) {
  uint32_t check = 0;
  for (uint32_t n = 0; n < slots; ++n) {
    if (n >= check) {
      check = s->Prepare(n);
      ASSERT_GT(check, n);
      ASSERT_TRUE(s->Check(n + 1).ok()) << s->Check(n + 1);
    }
    char* node = static_cast<char*>(s->nodes()) + uint64_t{n} * kNodeBytes;
    const uint64_t p = Pattern(n);
    std::memcpy(node, &p, sizeof(p));
    std::memcpy(node + 24, &p, sizeof(p));
    static_cast<uint8_t*>(s->flags())[n] = static_cast<uint8_t>(p);
  }
  for (uint32_t n = 0; n < slots; ++n) {
    const char* node = static_cast<const char*>(s->nodes()) + uint64_t{n} * kNodeBytes;
    uint64_t a, b;
    std::memcpy(&a, node, sizeof(a));
    std::memcpy(&b, node + 24, sizeof(b));
    ASSERT_EQ(a, Pattern(n)) << "slot " << n;
    ASSERT_EQ(b, Pattern(n)) << "slot " << n;
    ASSERT_EQ(static_cast<const uint8_t*>(s->flags())[n], static_cast<uint8_t>(Pattern(n)));
  }
}

// Pages of [addr, addr + bytes) resident now (mincore); addr page-aligned.
size_t ResidentPages(const void* addr, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(addr), bytes, in.data()) != 0) {
    ADD_FAILURE() << "mincore: " << errno;
    return 0;
  }
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

PagePopulator* TestPopulator() {
  static PagePopulator* const p = new PagePopulator();
  return p;
}

TEST(NodeStorage, WithoutPopulatorTheOwnerPopulatesInBatches) {
  auto s = NodeStorage::Create(kNodeBytes, 1, 1 << 20, nullptr);
  HandOut(s.get(), 100000);
  const NodeStorage::Counts c = s->counts();
  EXPECT_EQ(c.requests, 0u);
  EXPECT_EQ(c.background_batches, 0u);
  EXPECT_EQ(c.remaps, 0u);
  // Batches reach kBatchBytes after a few; then one per kBatchBytes.
  EXPECT_LE(c.populate_batches, 100000 * kNodeBytes / NodeStorage::kBatchBytes + 16);
  EXPECT_GE(c.pages_populated, 100000 * kNodeBytes / 4096);
  EXPECT_TRUE(s->Check(100000).ok()) << s->Check(100000);
  EXPECT_GE(s->ResidentBytes(100000), 100000 * (kNodeBytes + 1));
}

TEST(NodeStorage, PopulatorFaultsInAheadAndContentsSurvive) {
  constexpr uint32_t kSlots = 300000;
  auto s = NodeStorage::Create(kNodeBytes, 1, 1 << 20, TestPopulator());
  // Residency page by page (no transparent huge page makes a neighbour
  // resident), so what mincore shows below is what someone faulted in.
  ASSERT_EQ(madvise(s->nodes(), (size_t{1} << 20) * kNodeBytes, MADV_NOHUGEPAGE), 0);
  HandOut(s.get(), kSlots);
  s->WaitForBackground();
  const NodeStorage::Counts c = s->counts();
  EXPECT_GT(c.requests, 0u);
  EXPECT_GT(c.background_batches, 0u);
  EXPECT_GE(c.background_pages, kSlots * kNodeBytes / 4096 / 2);
  // The owner never faults pages in itself while a populator is there
  // (faulting-in is counted by the thread that does it).
  EXPECT_EQ(c.populate_batches, 0u);
  EXPECT_EQ(c.pages_populated, 0u);
  // Ahead of the owner: the stretch past the last slot it wrote (a quarter
  // of what it handed out, at most 1 MiB of nodes) is resident although
  // nobody wrote it; the owner did not fault it in (above), the populator
  // did.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t first = (uint64_t{kSlots} * kNodeBytes + page - 1) / page * page;
  const size_t ahead = (size_t{1} << 20) - page;
  EXPECT_EQ(ResidentPages(static_cast<char*>(s->nodes()) + first, ahead), ahead / page)
      << "the stretch ahead of the owner was not faulted in";
  EXPECT_EQ(c.remaps, 0u);
  // Far fewer requests than batches: the populator is asked once per
  // stretch of a quarter of what is handed out.
  EXPECT_LT(c.requests, 100u);
  EXPECT_TRUE(s->Check(kSlots).ok()) << s->Check(kSlots);
  // Ahead of the owner by at most 2 MiB of nodes (and its flags), each of
  // the two arrays rounded up to a whole page.
  EXPECT_LE(s->ResidentBytes(kSlots),
            kSlots * (kNodeBytes + 1) + (2u << 20) + (64u << 10) + 2 * 4096);
}

TEST(NodeStorage, RemapsPastTheReservationWhileThePopulatorWorks) {
  // 256 slots reserved: the populator works below them, the owner doubles
  // the arrays by mremap past them (waiting for the populator first).
  for (int round = 0; round < 20; ++round) {
    auto s = NodeStorage::Create(kNodeBytes, 1, 256, TestPopulator());
    HandOut(s.get(), 20000);
    EXPECT_GT(s->counts().remaps, 0u);
    s->WaitForBackground();
    EXPECT_TRUE(s->Check(20000).ok()) << s->Check(20000);
  }
}

TEST(NodeStorage, DroppedWithWorkQueuedIsSkipped) {
  PagePopulator* p = TestPopulator();
  const uint64_t before = p->tasks_done();
  uint64_t posted = 0;
  for (int i = 0; i < 50; ++i) {
    auto s = NodeStorage::Create(kNodeBytes, 1, 1 << 20, p);
    HandOut(s.get(), 5000);
    posted += s->counts().requests;
  }  // each storage is gone, perhaps before its tasks ran
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (p->tasks_done() < before + posted && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(p->tasks_done(), before + posted);
}

}  // namespace
}  // namespace gpumem
