// TenantDirectory: resolution rules and the config checks that name a line.
#include "server/tenants/tenant_directory.h"

#include <gtest/gtest.h>

namespace gpumem {
namespace tenants {
namespace {

std::vector<placement::DeviceView> Devices() {
  std::vector<placement::DeviceView> d(2);
  d[0].index = 0;
  d[0].uuid = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
  d[1].index = 1;
  d[1].uuid = "GPU-bbbbbbbb-0000-0000-0000-000000000001";
  return d;
}

absl::StatusOr<TenantDirectory> FromText(const std::string& text) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::ParseInfoTree tree;
  absl::Status parsed = ParseConfigText(text, "t.textproto", &config, &tree);
  if (!parsed.ok()) return parsed;
  return TenantDirectory::Build(config, &tree, "t.textproto", Devices());
}

TEST(TenantDirectoryTest, NoTenantsMeansOneTenantPerUid) {
  TenantDirectory dir;
  absl::StatusOr<TenantRef> t = dir.Resolve(1234, 100);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->id, 1234u);
  EXPECT_EQ(t->name, "uid-1234");
  EXPECT_FALSE(dir.configured());
}

TEST(TenantDirectoryTest, UidThenGidThenDefault) {
  absl::StatusOr<TenantDirectory> dir = FromText(R"(
    tenant { name: "ml" uids: 1000 uids: 1001 priority: 5
             quota { total_bytes: "8GiB" device { device: "1" bytes: "2GiB" }
                     device { device: "GPU-AAAAAAAA-0000-0000-0000-000000000000" bytes: "1GiB" }
                     max_allocations: 10 } }
    tenant { name: "batch" gids: 500 }
    tenant { name: "guests" }
    default_tenant: "guests"
  )");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(dir->Resolve(1000, 500)->name, "ml");  // uid wins over gid
  EXPECT_EQ(dir->Resolve(1000, 500)->priority, 5);
  EXPECT_EQ(dir->Resolve(2000, 500)->name, "batch");
  EXPECT_EQ(dir->Resolve(2000, 7)->name, "guests");
  const Tenant* ml = dir->Find("ml");
  ASSERT_NE(ml, nullptr);
  EXPECT_EQ(*ml->quota.total_bytes, uint64_t{8} << 30);
  EXPECT_EQ(*ml->quota.device_limit(0), uint64_t{1} << 30);
  EXPECT_EQ(*ml->quota.device_limit(1), uint64_t{2} << 30);
  EXPECT_EQ(*ml->quota.max_allocations, 10u);
  EXPECT_TRUE(dir->Find("batch")->quota.unlimited());
  EXPECT_EQ(dir->NameOf(ml->id), "ml");
}

TEST(TenantDirectoryTest, UnknownUidWithoutDefaultIsDeniedByUid) {
  absl::StatusOr<TenantDirectory> dir = FromText(R"(tenant { name: "ml" uids: 1000 })");
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<TenantRef> t = dir->Resolve(4242, 4242);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(t.status().message().find("uid 4242"), std::string::npos) << t.status();
}

void ExpectError(const std::string& text, const std::string& where, const std::string& words) {
  absl::StatusOr<TenantDirectory> dir = FromText(text);
  ASSERT_FALSE(dir.ok()) << text;
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dir.status().message().find(where), std::string::npos) << dir.status();
  EXPECT_NE(dir.status().message().find(words), std::string::npos) << dir.status();
}

TEST(TenantDirectoryTest, ConfigErrorsNameTheLine) {
  ExpectError("tenant { name: \"a\" uids: 7 }\n"
              "tenant {\n"
              "  name: \"b\"\n"
              "  uids: 7\n"
              "}\n",
              "t.textproto:4:", "uid 7 is listed by tenant \"a\" and by tenant \"b\"");
  ExpectError("tenant {\n name: \"a\"\n quota {\n  device { device: \"9\" bytes: \"1GiB\" }\n }\n}\n",
              "t.textproto:4:", "no device \"9\"");
  ExpectError("tenant {\n name: \"a\"\n quota {\n  total_bytes: \"-5GiB\"\n }\n}\n",
              "t.textproto:4:", "total_bytes");
  ExpectError("tenant {\n name: \"a\"\n quota {\n  max_allocations: -1\n }\n}\n",
              "t.textproto:4:", "max_allocations must be >= 0");
  ExpectError("tenant { name: \"a\" }\ndefault_tenant: \"zz\"\n", "t.textproto:2:",
              "names no tenant");
  ExpectError("tenant { name: \"a\" gids: 3 }\ntenant { name: \"b\"\n gids: 3 }\n",
              "t.textproto:3:", "gid 3");
  ExpectError("tenant { name: \"a\" }\ntenant {\n name: \"a\" }\n", "t.textproto:3:",
              "defined twice");
}

}  // namespace
}  // namespace tenants
}  // namespace gpumem
