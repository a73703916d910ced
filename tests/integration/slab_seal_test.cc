// Sim slabs are sealed against shrinking and growing, tried from a client
// process that holds a slab's fd (soak_client --mode=attack): ftruncate to 0,
// to 1 TiB and to one page more, fallocate past the end and a seal of its
// own all fail with EPERM; the slab keeps its size; the daemon and another
// client of the same tenant go on using it.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_client_test.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::ChildProcess;
using testing::DaemonClientTest;
using testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20;

class SlabSealTest : public DaemonClientTest {
 protected:
  SlabSealTest() : DaemonClientTest({"--sim_devices=1x64MiB", "--slab_size=16MiB", "--min_slab_size=16MiB"}) {}
};

TEST_F(SlabSealTest, AClientHoldingTheFdCannotShrinkOrGrowTheSlab) {
  ChildProcess attacker({RunfilePath("tests/soak/soak_client"), "--socket=" + daemon_->socket(),
                         "--mode=attack", absl::StrCat("--size=", kMiB)});
  const std::string result = attacker.ReadLine(60000);
  EXPECT_EQ(result, absl::StrCat("attack shrink=EPERM grow=EPERM grow1=EPERM fallocate=EPERM "
                                 "seal=EPERM size=", 16 * kMiB));
  const std::string next = attacker.ReadLine(60000);
  EXPECT_EQ(next, "ready") << "the attacker found a way: " << next;
  // The tenant's other blocks in that slab still work, whole.
  absl::StatusOr<client::Buffer> b = client_->Allocate(8 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<char> bytes(8 * kMiB, 0x5a), back(8 * kMiB);
  ASSERT_TRUE(b->Write(0, bytes.data(), bytes.size()).ok());
  ASSERT_TRUE(b->Read(0, back.data(), back.size()).ok());
  EXPECT_EQ(bytes, back);
  EXPECT_TRUE(b->Free().ok());
}

}  // namespace
}  // namespace gpumem
