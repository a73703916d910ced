// The state file: written whole (never a torn file), read back the same,
// and a file that is not a state file is refused with its name rather than
// taken for an empty state.
#include "client/dra/plugin_state.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "client/dra/atomic_file.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace dra {
namespace {

class PluginStateTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = gpumem::testing::MakeTempDir(); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

PreparedClaim Claim(const std::string& uid) {
  PreparedClaim c;
  c.phase = PreparedClaim::Phase::kPrepared;
  c.ns = "ns";
  c.name = "n-" + uid;
  c.uid = uid;
  c.tenant = "claim-" + uid;
  c.socket_dir = "/run/gpumemd/tenants/claim-" + uid;
  c.socket = c.socket_dir + "/gpumemd.sock";
  c.cdi_spec = "/var/run/cdi/x.json";
  c.cdi_device = "gpumemd.io/claim=" + uid;
  c.devices = {{"mem", "node", "gpu-0", "GPU-0", uint64_t{1} << 33}, {"b", "node", "gpu-1", "GPU-1", 5}};
  return c;
}

TEST_F(PluginStateTest, RoundTripsAndKeepsTheGeneration) {
  const std::string path = dir_ + "/state.json";
  {
    auto s = PluginState::Load(path);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE((*s)->All().empty());
    ASSERT_TRUE((*s)->Put(Claim("a")).ok());
    ASSERT_TRUE((*s)->Put(Claim("b")).ok());
    ASSERT_TRUE((*s)->Remove("a").ok());
    ASSERT_TRUE((*s)->Remove("never").ok());
    ASSERT_TRUE((*s)->SetSliceGeneration(7).ok());
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto s = PluginState::Load(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->slice_generation(), 7);
  ASSERT_EQ((*s)->All().size(), 1u);
  std::optional<PreparedClaim> b = (*s)->Find("b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->socket, Claim("b").socket);
  ASSERT_EQ(b->devices.size(), 2u);
  EXPECT_EQ(b->devices[0].bytes, uint64_t{1} << 33);
  EXPECT_EQ(b->devices[1].uuid, "GPU-1");
  EXPECT_FALSE((*s)->Find("a").has_value());
}

TEST_F(PluginStateTest, RefusesWhatIsNotAStateFile) {
  const std::string path = dir_ + "/state.json";
  for (const char* text : {"", "{", "[]", "{\"version\": 2, \"sliceGeneration\": 0, \"claims\": {}}",
                           "{\"version\": 1, \"claims\": {}}",
                           "{\"version\": 1, \"sliceGeneration\": 0, \"claims\": {\"x\": {\"phase\": \"odd\"}}}"}) {
    std::ofstream(path) << text;
    auto s = PluginState::Load(path);
    EXPECT_FALSE(s.ok()) << text;
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.status().message().find(path), absl::string_view::npos);
    }
  }
}

TEST_F(PluginStateTest, AFailedWriteChangesNothing) {
  const std::string sub = dir_ + "/gone";
  ASSERT_EQ(mkdir(sub.c_str(), 0755), 0);
  auto s = PluginState::Load(sub + "/state.json");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Put(Claim("a")).ok());
  std::filesystem::remove_all(sub);
  EXPECT_FALSE((*s)->Put(Claim("b")).ok());
  EXPECT_FALSE((*s)->Find("b").has_value());
  EXPECT_FALSE((*s)->Remove("a").ok());
  EXPECT_TRUE((*s)->Find("a").has_value());
}

}  // namespace
}  // namespace dra
}  // namespace gpumem
