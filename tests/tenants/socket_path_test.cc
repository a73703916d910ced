// Socket tenants' socket paths and names, by their text alone
// (server/tenants/socket_path.h): what resolves where (a directory of the
// tenant's own), every way out of tenant_socket_dir and every shared
// directory refused with INVALID_ARGUMENT, and the directories' modes.
#include "server/tenants/socket_path.h"

#include <string>

#include <gtest/gtest.h>

namespace gpumem {
namespace tenants {
namespace {

constexpr char kDir[] = "/run/gpumemd/tenants";

std::string Resolved(const std::string& requested, const std::string& name = "team") {
  absl::StatusOr<std::string> p = ResolveSocketPath(requested, kDir, name);
  return p.ok() ? *p : "ERROR " + std::string(p.status().message());
}

void ExpectRefused(const std::string& requested, const std::string& words) {
  absl::StatusOr<std::string> p = ResolveSocketPath(requested, kDir, "team");
  ASSERT_FALSE(p.ok()) << requested << " resolved to " << *p;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find(words), std::string::npos) << p.status();
}

TEST(SocketPathTest, EmptyBareAndInsideResolveToOneAbsolutePath) {
  // In a directory of the tenant's own; the main socket's file name by default.
  EXPECT_EQ(Resolved(""), "/run/gpumemd/tenants/team/gpumemd.sock");
  EXPECT_EQ(Resolved("team.sock"), "/run/gpumemd/tenants/team/team.sock");
  // The DRA plugin's form: a file inside a directory it made there.
  EXPECT_EQ(Resolved("/run/gpumemd/tenants/claim-5f0c/gpumemd.sock"),
            "/run/gpumemd/tenants/claim-5f0c/gpumemd.sock");
  EXPECT_EQ(Resolved("/run/gpumemd/tenants/a/b/c.sock"), "/run/gpumemd/tenants/a/b/c.sock");
}

TEST(SocketPathTest, EveryWayOutIsRefused) {
  ExpectRefused("/run/gpumemd/gpumemd.sock", "outside");
  ExpectRefused("/tmp/x.sock", "outside");
  // A sibling whose name starts like the directory is not inside it.
  ExpectRefused("/run/gpumemd/tenants-evil/x.sock", "outside");
  ExpectRefused("/run/gpumemd/tenants", "outside");
  ExpectRefused("/run/gpumemd/tenants/", "outside");
  ExpectRefused("/run/gpumemd/tenants/../gpumemd.sock", "\"..\"");
  ExpectRefused("/run/gpumemd/tenants/a/../../x.sock", "\"..\"");
  ExpectRefused("/run/gpumemd/tenants/./x.sock", "\".\"");
  ExpectRefused("/run/gpumemd/tenants//x.sock", "empty component");
  ExpectRefused("/run/gpumemd/tenants/a/", "empty component");
  ExpectRefused("..", "\"..\"");
  ExpectRefused(".", "\".\"");
  ExpectRefused("claim-1/gpumemd.sock", "relative");
  ExpectRefused("../x.sock", "relative");
  ExpectRefused(std::string("a\0b.sock", 8), "control byte");
  ExpectRefused("/run/gpumemd/tenants/a\nb/x.sock", "control byte");
  ExpectRefused("/run/gpumemd/tenants/d/" + std::string(100, 'x'), "at most 107");
  // 107 bytes exactly fit.
  const std::string fits = "/run/gpumemd/tenants/d/" + std::string(107 - 23, 'y');
  EXPECT_EQ(Resolved(fits), fits);
  ExpectRefused(std::string(100, 'x'), "at most 107");
}

TEST(SocketPathTest, EachSocketHasADirectoryOfItsOwn) {
  ExpectRefused("/run/gpumemd/tenants/x.sock", "directly in tenant_socket_dir");
  ExpectRefused("/run/gpumemd/tenants/x.sock", "/run/gpumemd/tenants/team/x.sock");
  // The tenant's name becomes a directory: it must be one.
  for (const char* name : {"..", ".", "a/b", "a\nb"}) {
    absl::StatusOr<std::string> p = ResolveSocketPath("", kDir, name);
    ASSERT_FALSE(p.ok()) << name << " resolved to " << *p;
    EXPECT_NE(p.status().message().find("cannot name its socket's directory"), std::string::npos)
        << p.status();
  }
  EXPECT_EQ(*ResolveSocketPath("/run/gpumemd/tenants/a/b", kDir, ".."), "/run/gpumemd/tenants/a/b");

  EXPECT_EQ(SocketDirOf("/run/t/a/s"), "/run/t/a");
  EXPECT_TRUE(SocketDirsOverlap("/run/t/a/s", "/run/t/a/t"));     // one directory
  EXPECT_TRUE(SocketDirsOverlap("/run/t/a/s", "/run/t/a/b/t"));   // one inside the other
  EXPECT_TRUE(SocketDirsOverlap("/run/t/a/b/t", "/run/t/a/s"));
  EXPECT_FALSE(SocketDirsOverlap("/run/t/a/s", "/run/t/ab/s"));   // a name's prefix only
  EXPECT_FALSE(SocketDirsOverlap("/run/t/a/s", "/run/t/b/s"));
  EXPECT_FALSE(SocketDirsOverlap("/run/t/x/a/s", "/run/t/x/b/s"));  // siblings
}

// Only those the socket lets connect may pass through its directory.
TEST(SocketPathTest, SocketDirModes) {
  EXPECT_EQ(SocketDirMode(SocketAccess{0, 0, 0600}, true), 0700u);
  EXPECT_EQ(SocketDirMode(SocketAccess{4242, 0, 0600}, false), 0100u);
  EXPECT_EQ(SocketDirMode(SocketAccess{0, 50, 0660}, true), 0710u);
  EXPECT_EQ(SocketDirMode(SocketAccess{7, 50, 0660}, false), 0110u);
  EXPECT_EQ(SocketDirMode(SocketAccess{0, 0, 0666}, true), 0711u);
  EXPECT_EQ(SocketDirMode(SocketAccess{0, 0, 0606}, true), 0701u);
}

TEST(SocketPathTest, SocketDirMustBeNormalized) {
  EXPECT_TRUE(CheckSocketDir("/run/gpumemd/tenants").ok());
  for (const char* bad : {"", "/", "run/x", "/run/x/", "/run//x", "/run/./x", "/run/../x"}) {
    EXPECT_EQ(CheckSocketDir(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SocketPathTest, TenantNames) {
  for (const char* good : {"claim-5f0c1d2e-0000-4000-8000-000000000001", "a", "A.b_c-9"}) {
    EXPECT_TRUE(CheckSocketTenantName(good).ok()) << good;
  }
  EXPECT_TRUE(CheckSocketTenantName(std::string(63, 'n')).ok());
  for (const std::string& bad :
       {std::string(), std::string(64, 'n'), std::string("a/b"), std::string("a b"),
        std::string(".hidden"), std::string("uid-0"), std::string("uid-1000"),
        std::string("caf\xc3\xa9"), std::string("a\0b", 3)}) {
    const absl::Status s = CheckSocketTenantName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(CheckSocketTenantName("uid-7").message().find("uid tenant"), std::string::npos);
}

TEST(SocketPathTest, SocketModes) {
  for (uint32_t ok : {0600u, 0660u, 0606u, 0666u}) {
    EXPECT_TRUE(CheckSocketMode(ok, "socket_mode").ok()) << ok;
  }
  for (uint32_t bad : {0u, 0400u, 0640u, 0700u, 0644u, 0777u, 04600u, 01666u, 0620u}) {
    absl::Status s = CheckSocketMode(bad, "socket_mode");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("socket_mode"), std::string::npos) << s;
  }
  EXPECT_EQ(*ParseSocketMode("0660", "m"), 0660u);
  EXPECT_EQ(*ParseSocketMode("666", "m"), 0666u);
  EXPECT_FALSE(ParseSocketMode("0668", "m").ok());
  EXPECT_FALSE(ParseSocketMode("", "m").ok());
  EXPECT_FALSE(ParseSocketMode("0x1b6", "m").ok());
}

TEST(SocketPathTest, DefaultSocketAccess) {
  EXPECT_EQ(DefaultSocketAccess({}, {}, std::nullopt, std::nullopt), (SocketAccess{0, 0, 0600}));
  EXPECT_EQ(DefaultSocketAccess({1000, 1001}, {}, std::nullopt, std::nullopt),
            (SocketAccess{1000, 0, 0600}));
  EXPECT_EQ(DefaultSocketAccess({1000}, {50, 51}, std::nullopt, std::nullopt),
            (SocketAccess{0, 50, 0660}));
  EXPECT_EQ(DefaultSocketAccess({1000}, {}, 7u, 9u), (SocketAccess{7, 9, 0660}));
  EXPECT_EQ(DefaultSocketAccess({}, {50}, 7u, std::nullopt), (SocketAccess{7, 50, 0660}));
}

}  // namespace
}  // namespace tenants
}  // namespace gpumem
