// The library's environment variables and placement text: values parse, and
// every malformed one is INVALID_ARGUMENT naming the variable or flag.
#include "client/lib/env_config.h"

#include <stdlib.h>

#include <string>

#include "gtest/gtest.h"

namespace gpumem {
using client::PoolOptions;
using client::PoolOptionsFromEnv;
using client::ParsePlacementText;
using client::PlacementFromEnv;
namespace {

class EnvConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"GPUMEM_LEASE_SIZE", "GPUMEM_CACHE_MAX", "GPUMEM_IDLE_RELEASE_MS",
                          "GPUMEM_RECONNECT_MS", "GPUMEM_PLACEMENT", "GPUMEMD_SOCKET"}) {
      unsetenv(v);
    }
  }
};

TEST_F(EnvConfigTest, DefaultsAndValues) {
  absl::StatusOr<PoolOptions> o = PoolOptionsFromEnv("");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->lease_bytes, 64u << 20);
  EXPECT_EQ(o->socket_path, "/run/gpumemd/gpumemd.sock");
  setenv("GPUMEMD_SOCKET", "/tmp/x.sock", 1);
  setenv("GPUMEM_LEASE_SIZE", "16MiB", 1);
  setenv("GPUMEM_CACHE_MAX", "1MiB", 1);
  setenv("GPUMEM_IDLE_RELEASE_MS", "250", 1);
  o = PoolOptionsFromEnv("");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->socket_path, "/tmp/x.sock");
  EXPECT_EQ(o->lease_bytes, 16u << 20);
  EXPECT_EQ(o->cache_max_request, 1u << 20);
  EXPECT_EQ(o->idle_release_ms, 250);
  EXPECT_EQ(PoolOptionsFromEnv("/tmp/y.sock")->socket_path, "/tmp/y.sock");
}

TEST_F(EnvConfigTest, BadValuesNameTheVariable) {
  setenv("GPUMEM_LEASE_SIZE", "lots", 1);
  absl::StatusOr<PoolOptions> o = PoolOptionsFromEnv("");
  ASSERT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("GPUMEM_LEASE_SIZE"), std::string::npos);
  unsetenv("GPUMEM_LEASE_SIZE");
  setenv("GPUMEM_RECONNECT_MS", "-5", 1);
  o = PoolOptionsFromEnv("");
  ASSERT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("GPUMEM_RECONNECT_MS"), std::string::npos);
  unsetenv("GPUMEM_RECONNECT_MS");
  setenv("GPUMEM_PLACEMENT", "--gpus=0,,1", 1);
  absl::StatusOr<v1::PlacementRequest> p = PlacementFromEnv();
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("GPUMEM_PLACEMENT"), std::string::npos);
}

TEST_F(EnvConfigTest, PlacementText) {
  absl::StatusOr<v1::PlacementRequest> p =
      ParsePlacementText("--gpus=0,GPU-ab12 exclude=2  --fallback=3 --fallback=all --policy=near:1");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->devices_size(), 2);
  EXPECT_EQ(p->devices(1), "GPU-ab12");
  ASSERT_EQ(p->exclude_size(), 1);
  ASSERT_EQ(p->fallback_size(), 2);
  EXPECT_EQ(p->fallback(1).devices(0), "all");
  EXPECT_EQ(p->policy(), v1::PlacementRequest::POLICY_NEAR);
  EXPECT_EQ(p->near(), "1");
  EXPECT_TRUE(ParsePlacementText("").ok());
  for (const char* bad : {"--gpus", "--colour=red", "--policy=sideways", "--gpus=0,x"}) {
    EXPECT_EQ(ParsePlacementText(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace gpumem
