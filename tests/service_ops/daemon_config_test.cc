// The config file's whole-file validation (every error names file:line:col
// and the field), and the refusal reason the metrics label a failed
// Allocate with.
#include "server/config/daemon_config.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace gpumem {
namespace {

void ExpectRejected(const std::string& text, const std::string& where,
                    const std::string& says) {
  absl::StatusOr<v1::DaemonConfig> c = ParseDaemonConfig("f.textproto", text);
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(c.status().message(), where)) << c.status().message();
  EXPECT_TRUE(absl::StrContains(c.status().message(), says)) << c.status().message();
}

TEST(DaemonConfig, EmptyAndFullConfigsAreAccepted) {
  EXPECT_TRUE(ParseDaemonConfig("f", "").ok());
  absl::StatusOr<v1::DaemonConfig> c = ParseDaemonConfig(
      "f", "backend: \"sim\"\nsocket: \"/run/gpumemd/gpumemd.sock\"\n"
           "sim_devices: \"4x16GiB\"\nsim_topology: \"nvlink:0-1,2-3\"\n"
           "pool { slab_size: \"1GiB\" empty_slab_release_seconds: 30 }\n"
           "admin_group: \"root\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool().empty_slab_release_seconds(), 30);
}

TEST(DaemonConfig, SyntaxErrorsNameTheirLine) {
  ExpectRejected("backend: \"sim\"\n\npool {\n  slab_size: = 3\n}\n", "f.textproto:4:",
                 "not a valid gpumem.v1.DaemonConfig");
  ExpectRejected("no_such_field: 1\n", "f.textproto:1:", "no_such_field");
}

TEST(DaemonConfig, BadValuesNameTheirLineAndField) {
  ExpectRejected("\n\nbackend: \"tpu\"\n", "f.textproto:3:1: backend", "sim or cuda");
  ExpectRejected("sim_devices: \"4x\"\n", "f.textproto:1:1: sim_devices", "");
  ExpectRejected("sim_devices: \"2x1GiB\"\nsim_topology: \"nvlink:0-5\"\n",
                 "f.textproto:2:1: sim_topology", "");
  ExpectRejected("pool {\n  slab_size: \"1Gx\"\n}\n", "f.textproto:2:3: pool.slab_size",
                 "1Gx");
  ExpectRejected("pool { slab_size: \"0\" }\n", "f.textproto:1:8: pool.slab_size", "> 0");
  ExpectRejected("pool {\n empty_slab_release_seconds: -1\n}\n",
                 "f.textproto:2:2: pool.empty_slab_release_seconds", ">= 0");
  ExpectRejected("pool { empty_slab_release_seconds: inf }\n",
                 "f.textproto:1:8: pool.empty_slab_release_seconds", ">= 0");
  ExpectRejected(std::string("socket: \"/") + std::string(120, 'a') + "\"\n",
                 "f.textproto:1:1: socket", "107 bytes");
  ExpectRejected("\nadmin_group: \"no-such-group-gpumemd\"\n", "f.textproto:2:1: admin_group",
                 "does not exist");
}

TEST(DaemonConfig, UnreadableFileIsNotFound) {
  absl::StatusOr<v1::DaemonConfig> c = LoadDaemonConfig("/nonexistent/gpumemd.textproto");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(LoadDaemonConfig("").ok());
}

}  // namespace
}  // namespace gpumem
