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

absl::StatusOr<TenantDirectory> FromText(const std::string& text,
                                         const TenantDirectory* previous = nullptr) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::ParseInfoTree tree;
  absl::Status parsed = ParseConfigText(text, "t.textproto", &config, &tree);
  if (!parsed.ok()) return parsed;
  return TenantDirectory::Build(config, &tree, "t.textproto", Devices(), previous);
}

// The id of tenant `name` in `dir` (0: none).
uint32_t Id(const TenantDirectory& dir, const std::string& name) {
  const Tenant* t = dir.Find(name);
  return t == nullptr ? 0 : t->id;
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

void ExpectErrorFrom(const std::string& text, const TenantDirectory* previous,
                     const std::string& where, const std::string& words) {
  absl::StatusOr<TenantDirectory> dir = FromText(text, previous);
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

// Ids across reloads: kept by name, new ones never used before, removed
// ones remembered by name and never given again.
TEST(TenantDirectoryTest, ReloadKeepsIdsByNameAndNeverReusesOne) {
  absl::StatusOr<TenantDirectory> v1 = FromText(R"(
    tenant { name: "a" uids: 1000 }
    tenant { name: "b" uids: 1001 }
  )");
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(Id(*v1, "a"), 1u);
  EXPECT_EQ(Id(*v1, "b"), 2u);
  EXPECT_EQ(v1->next_id(), 3u);

  // Reordered, uid 1001 moved to a, c added before the others: a and b keep
  // their ids, c gets 3.
  absl::StatusOr<TenantDirectory> v2 = FromText(R"(
    tenant { name: "c" uids: 1002 priority: 7 }
    tenant { name: "b" gids: 50 }
    tenant { name: "a" uids: 1000 uids: 1001 }
  )", &*v1);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(Id(*v2, "a"), 1u);
  EXPECT_EQ(Id(*v2, "b"), 2u);
  EXPECT_EQ(Id(*v2, "c"), 3u);
  EXPECT_EQ(v2->Resolve(1001, 0)->id, 1u);
  EXPECT_EQ(v2->Resolve(1002, 0)->priority, 7);
  EXPECT_EQ(v2->FindId(3)->name, "c");
  EXPECT_EQ(v2->NameOf(2), "b");
  EXPECT_TRUE(v2->retired().empty());

  // b removed: its id is retired, still named, not a tenant any more.
  absl::StatusOr<TenantDirectory> v3 = FromText(R"(
    tenant { name: "a" uids: 1000 }
    tenant { name: "c" uids: 1002 }
  )", &*v2);
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->FindId(2), nullptr);
  EXPECT_EQ(v3->Find("b"), nullptr);
  EXPECT_FALSE(v3->IdOf("b").has_value());
  EXPECT_EQ(v3->NameOf(2), "b");
  ASSERT_EQ(v3->retired().size(), 1u);
  EXPECT_EQ(v3->retired().at(2), "b");
  EXPECT_EQ(v3->next_id(), 4u);

  // d is new: 4, not b's 2. b comes back: a new tenant, 5.
  absl::StatusOr<TenantDirectory> v4 = FromText(R"(
    tenant { name: "a" uids: 1000 }
    tenant { name: "d" uids: 1003 }
    tenant { name: "b" uids: 1001 }
    tenant { name: "c" uids: 1002 }
  )", &*v3);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(Id(*v4, "a"), 1u);
  EXPECT_EQ(Id(*v4, "d"), 4u);
  EXPECT_EQ(Id(*v4, "b"), 5u);
  EXPECT_EQ(Id(*v4, "c"), 3u);
  EXPECT_EQ(v4->NameOf(2), "b");  // the old b's live allocations keep the name
  EXPECT_EQ(v4->NameOf(5), "b");
  EXPECT_EQ(v4->retired().count(2), 1u);
  EXPECT_EQ(v4->next_id(), 6u);

  // Everything removed but one, then a fresh tenant: still above all.
  absl::StatusOr<TenantDirectory> v5 = FromText(R"(tenant { name: "e" })", &*v4);
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ(Id(*v5, "e"), 6u);
  EXPECT_EQ(v5->retired().size(), 5u);  // b(2), a, c, d, b(5)
  for (uint32_t id = 1; id <= 5; ++id) EXPECT_NE(v5->NameOf(id), "tenant-" + std::to_string(id));
}

// A refused reload gives nothing away: the next good one numbers from the
// directory in force as if the bad one had never been tried.
TEST(TenantDirectoryTest, RefusedReloadTakesNoIds) {
  absl::StatusOr<TenantDirectory> v1 = FromText(R"(tenant { name: "a" uids: 1 })");
  ASSERT_TRUE(v1.ok());
  absl::StatusOr<TenantDirectory> bad = FromText(
      "tenant { name: \"a\" uids: 1 }\ntenant { name: \"n\" }\ntenant {\n name: \"z\"\n uids: 1\n}\n",
      &*v1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.textproto:5:"), std::string::npos) << bad.status();
  absl::StatusOr<TenantDirectory> good = FromText(R"(
    tenant { name: "a" uids: 1 }
    tenant { name: "n" uids: 2 }
  )", &*v1);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(Id(*good, "n"), 2u);
}

// From no tenants (ids are uids) there is nothing to keep: 1..N as at start.
TEST(TenantDirectoryTest, BuildFromUnconfiguredNumbersFromOne) {
  TenantDirectory none;
  absl::StatusOr<TenantDirectory> dir = FromText(R"(
    tenant { name: "x" }
    tenant { name: "y" }
  )", &none);
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(Id(*dir, "x"), 1u);
  EXPECT_EQ(Id(*dir, "y"), 2u);
  absl::StatusOr<TenantDirectory> back = FromText("", &*dir);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->configured());
  EXPECT_EQ(back->NameOf(1), "uid-1");
}

// ---- Socket tenants ----

TenantDirectory::SocketTenantSpec Spec(const std::string& name, const std::string& socket,
                                       uint64_t total = 0, int32_t priority = 0) {
  TenantDirectory::SocketTenantSpec spec;
  spec.name = name;
  spec.socket = socket;
  spec.priority = priority;
  if (total > 0) spec.quota.total_bytes = total;
  return spec;
}

constexpr char kSockets[] = "tenant_socket_dir: \"/run/t\"\n";

TEST(TenantDirectoryTest, ConfigTenantSocketsResolveInsideTheSocketDir) {
  absl::StatusOr<TenantDirectory> dir = FromText(std::string(kSockets) + R"(
    tenant { name: "a" uids: 1000 socket: "a.sock" }
    tenant { name: "b" socket: "/run/t/b/gpumemd.sock" }
    tenant { name: "c" uids: 1001 }
  )");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(dir->Find("a")->socket, "/run/t/a/a.sock") << "in a directory of its own";
  EXPECT_EQ(dir->Find("b")->socket, "/run/t/b/gpumemd.sock");
  EXPECT_EQ(dir->Find("c")->socket, "");
  // Through a's socket, any uid is a; through the main socket the uid rules.
  const uint32_t a = dir->Find("a")->id, b = dir->Find("b")->id;
  EXPECT_EQ(dir->ResolveCaller(0, 0, a)->name, "a");
  EXPECT_EQ(dir->ResolveCaller(1001, 0, a)->name, "a");
  EXPECT_EQ(dir->ResolveCaller(1001, 0, b)->name, "b");
  EXPECT_EQ(dir->ResolveCaller(1001, 0, 0)->name, "c");
  EXPECT_EQ(dir->ResolveCaller(0, 0, 0).status().code(), absl::StatusCode::kPermissionDenied);
  // A tenant without a socket is no socket's.
  EXPECT_EQ(dir->ResolveCaller(0, 0, dir->Find("c")->id).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(TenantDirectoryTest, ConfigSocketErrorsNameTheLine) {
  ExpectError(std::string(kSockets) + "tenant {\n name: \"a\"\n socket: \"/tmp/a.sock\"\n}\n",
              "t.textproto:4:", "outside");
  ExpectError(std::string(kSockets) + "tenant {\n name: \"a\"\n socket: \"../a.sock\"\n}\n",
              "t.textproto:4:", "relative");
  ExpectError(std::string(kSockets) +
                  "tenant { name: \"a\" socket: \"x.sock\" }\n"
                  "tenant {\n name: \"b\"\n socket: \"/run/t/a/x.sock\"\n}\n",
              "t.textproto:5:", "is tenant \"a\"'s already");
  // Each tenant's socket has a directory of its own: not tenant_socket_dir
  // itself, not another's, not one inside or around another's.
  ExpectError(std::string(kSockets) + "tenant {\n name: \"a\"\n socket: \"/run/t/x.sock\"\n}\n",
              "t.textproto:4:", "directly in tenant_socket_dir /run/t");
  for (const char* other : {"/run/t/a/y.sock", "/run/t/a/sub/y.sock"}) {
    ExpectError(std::string(kSockets) + "tenant { name: \"a\" socket: \"x.sock\" }\n" +
                    "tenant {\n name: \"b\"\n socket: \"" + other + "\"\n}\n",
                "t.textproto:5:", "would share a directory with tenant \"a\"'s socket");
  }
  ExpectError(std::string(kSockets) + "tenant { name: \"b\" socket: \"/run/t/a/sub/y.sock\" }\n" +
                  "tenant {\n name: \"a\"\n socket: \"x.sock\"\n}\n",
              "t.textproto:5:", "would share a directory with tenant \"b\"'s socket");
  // A name that is no file name cannot be its socket's directory.
  ExpectError(std::string(kSockets) + "tenant {\n name: \"..\"\n socket: \"x.sock\"\n}\n",
              "t.textproto:4:", "cannot name its socket's directory");
  ExpectError(std::string(kSockets) + "tenant {\n name: \"a/b\"\n socket: \"x.sock\"\n}\n",
              "t.textproto:4:", "cannot name its socket's directory");
  ExpectError("tenant {\n name: \"a\"\n socket: \"a.sock\"\n}\n", "t.textproto:",
              "tenant_socket_dir is not set");
}

// Who may connect to a config tenant's socket: the defaults by uids/gids,
// each socket_* field winning, and a bad mode or a field without a socket
// refused with the line.
TEST(TenantDirectoryTest, ConfigSocketAccess) {
  absl::StatusOr<TenantDirectory> dir = FromText(std::string(kSockets) + R"(
    tenant { name: "u" uids: [1000, 1001] socket: "u.sock" }
    tenant { name: "g" uids: 1002 gids: [2000, 2001] socket: "g.sock" }
    tenant { name: "n" socket: "n.sock" }
    tenant { name: "o" uids: 1003 socket: "o.sock" socket_uid: 7 socket_gid: 8 }
    tenant { name: "m" gids: 2002 socket: "m.sock" socket_mode: "0666" }
  )");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto access = [&](const char* name) { return dir->Find(name)->socket_access; };
  EXPECT_EQ(access("u"), (SocketAccess{1000, 0, 0600}));
  EXPECT_EQ(access("g"), (SocketAccess{0, 2000, 0660}));
  EXPECT_EQ(access("n"), (SocketAccess{0, 0, 0600}));
  EXPECT_EQ(access("o"), (SocketAccess{7, 8, 0660}));
  EXPECT_EQ(access("m"), (SocketAccess{0, 2002, 0666}));
  ExpectError(std::string(kSockets) +
                  "tenant {\n name: \"a\"\n socket: \"a.sock\"\n socket_mode: \"0777\"\n}\n",
              "t.textproto:5:", "socket_mode 0777 is not a socket mode");
  ExpectError(std::string(kSockets) +
                  "tenant {\n name: \"a\"\n socket: \"a.sock\"\n socket_mode: \"0640\"\n}\n",
              "t.textproto:5:", "socket_mode 0640 is not a socket mode");
  ExpectError(std::string(kSockets) + "tenant {\n name: \"a\"\n socket_uid: 5\n}\n",
              "t.textproto:4:", "but no socket");
}

TEST(TenantDirectoryTest, SocketTenantsMadeAtRunTime) {
  absl::StatusOr<TenantDirectory> dir = FromText(std::string(kSockets) + R"(
    tenant { name: "a" uids: 1000 socket: "a.sock" }
  )");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<TenantDirectory> v2 = dir->WithSocketTenant(Spec("claim-1", "/run/t/c1/s", 1 << 20, 3));
  ASSERT_TRUE(v2.ok()) << v2.status();
  const Tenant* c1 = v2->Find("claim-1");
  ASSERT_NE(c1, nullptr);
  EXPECT_TRUE(c1->runtime);
  EXPECT_EQ(c1->id, kFirstRuntimeTenantId);
  EXPECT_EQ(*c1->quota.total_bytes, 1u << 20);
  EXPECT_EQ(v2->ResolveCaller(0, 0, c1->id)->name, "claim-1");
  EXPECT_EQ(v2->ResolveCaller(0, 0, c1->id)->priority, 3);
  // The main socket never resolves to it, and it does not make the
  // directory "configured" on its own.
  EXPECT_EQ(v2->Resolve(0, 0).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(v2->tenants().size(), 2u);
  EXPECT_EQ(v2->IdOf("claim-1"), c1->id);

  // The same again changes the quota only; the id stays.
  absl::StatusOr<TenantDirectory> v3 = v2->WithSocketTenant(Spec("claim-1", "/run/t/c1/s", 2 << 20));
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->Find("claim-1")->id, c1->id);
  EXPECT_EQ(*v3->Find("claim-1")->quota.total_bytes, 2u << 20);
  EXPECT_EQ(v3->tenants().size(), 2u);
  // Refused: moving its socket, another tenant's socket, a config name.
  EXPECT_EQ(v3->WithSocketTenant(Spec("claim-1", "/run/t/e/elsewhere")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v3->WithSocketTenant(Spec("claim-2", "/run/t/c1/s")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(v3->WithSocketTenant(Spec("claim-2", "/run/t/a/a.sock")).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Nor a directory another tenant's socket is in, or one inside or around it.
  for (const char* shared : {"/run/t/c1/t", "/run/t/c1/sub/t", "/run/t/a/b/c"}) {
    absl::StatusOr<TenantDirectory> refused = v3->WithSocketTenant(Spec("claim-2", shared));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists) << shared;
    EXPECT_NE(refused.status().message().find("directory of its own"), std::string::npos)
        << refused.status();
  }
  absl::StatusOr<TenantDirectory> around = v3->WithSocketTenant(Spec("claim-2", "/run/t/x/s"));
  ASSERT_TRUE(around.ok()) << "a sibling directory is its own: " << around.status();
  EXPECT_EQ(around->WithSocketTenant(Spec("claim-3", "/run/t/x/y/s")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(v3->WithSocketTenant(Spec("a", "/run/t/other")).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A second one gets the next id; removing the first retires its id and
  // name, and the next new one never gets that id again.
  absl::StatusOr<TenantDirectory> v4 = v3->WithSocketTenant(Spec("claim-2", "/run/t/c2/s"));
  ASSERT_TRUE(v4.ok()) << v4.status();
  const uint32_t c2 = v4->Find("claim-2")->id;
  EXPECT_EQ(c2, kFirstRuntimeTenantId + 1);
  TenantDirectory v5 = v4->Without(c1->id);
  EXPECT_EQ(v5.Find("claim-1"), nullptr);
  EXPECT_EQ(v5.FindId(c1->id), nullptr);
  EXPECT_EQ(v5.NameOf(c1->id), "claim-1");
  EXPECT_EQ(v5.ResolveCaller(0, 0, c1->id).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(v5.ResolveCaller(0, 0, c1->id).status().message().find("claim-1"), std::string::npos);
  EXPECT_EQ(v5.FindId(c2)->name, "claim-2");  // indexes rebuilt
  absl::StatusOr<TenantDirectory> v6 = v5.WithSocketTenant(Spec("claim-1", "/run/t/c1/s"));
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->Find("claim-1")->id, kFirstRuntimeTenantId + 2);
  // Without() of a config tenant changes nothing.
  EXPECT_NE(v6->Without(v6->Find("a")->id).Find("a"), nullptr);
}

TEST(TenantDirectoryTest, ReloadKeepsRuntimeTenantsAndRefusesTheirNames) {
  absl::StatusOr<TenantDirectory> v1 = FromText(std::string(kSockets) + R"(tenant { name: "a" uids: 1 })");
  ASSERT_TRUE(v1.ok());
  absl::StatusOr<TenantDirectory> v2 = v1->WithSocketTenant(Spec("claim-1", "/run/t/c1/s", 5));
  ASSERT_TRUE(v2.ok());
  const uint32_t id = v2->Find("claim-1")->id;
  absl::StatusOr<TenantDirectory> v3 = FromText(std::string(kSockets) + R"(
    tenant { name: "a" uids: 1 }
    tenant { name: "b" uids: 2 socket: "b.sock" }
  )", &*v2);
  ASSERT_TRUE(v3.ok()) << v3.status();
  ASSERT_NE(v3->Find("claim-1"), nullptr);
  EXPECT_EQ(v3->Find("claim-1")->id, id);
  EXPECT_EQ(v3->Find("claim-1")->socket, "/run/t/c1/s");
  EXPECT_EQ(*v3->Find("claim-1")->quota.total_bytes, 5u);
  EXPECT_EQ(v3->Find("b")->id, 2u);
  absl::StatusOr<TenantDirectory> v4 = v3->WithSocketTenant(Spec("claim-2", "/run/t/c2/s"));
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->Find("claim-2")->id, id + 1);
  // A config that takes a runtime tenant's name, or its socket: refused,
  // naming the line.
  ExpectErrorFrom(std::string(kSockets) + "tenant { name: \"a\" uids: 1 }\ntenant {\n name: \"claim-1\" }\n",
                  &*v4, "t.textproto:3:", "made at run time");
  ExpectErrorFrom(std::string(kSockets) +
                      "tenant { name: \"a\" uids: 1 }\ntenant {\n name: \"z\" socket: \"/run/t/c2/s\" }\n",
                  &*v4, "t.textproto:3:", "socket of tenant \"claim-2\"");
  ExpectErrorFrom(std::string(kSockets) +
                      "tenant { name: \"a\" uids: 1 }\ntenant {\n name: \"z\" socket: \"/run/t/c2/t\" }\n",
                  &*v4, "t.textproto:3:", "would share a directory with tenant \"claim-2\"'s");
}

TEST(TenantDirectoryTest, WithoutConfiguredTenantsRuntimeIdsAreNoUids) {
  TenantDirectory none;
  absl::StatusOr<TenantDirectory> dir = none.WithSocketTenant(Spec("claim-1", "/run/t/c1/s"));
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_FALSE(dir->configured());
  const uint32_t id = dir->Find("claim-1")->id;
  EXPECT_EQ(id, kFirstRuntimeTenantId);
  EXPECT_EQ(dir->Resolve(1000, 1000)->name, "uid-1000");
  EXPECT_EQ(dir->Resolve(0, 0)->id, 0u);
  // A uid that could meet a runtime tenant's id is refused, saying why.
  absl::StatusOr<TenantRef> high = dir->Resolve(kFirstRuntimeTenantId, 0);
  EXPECT_EQ(high.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(high.status().message().find("2^31"), std::string::npos);
  EXPECT_FALSE(dir->IdOf("uid-2147483648").has_value());
  EXPECT_EQ(dir->IdOf("uid-7"), 7u);
  EXPECT_EQ(dir->IdOf("claim-1"), id);
  EXPECT_EQ(dir->NameOf(id), "claim-1");
  EXPECT_EQ(dir->NameOf(7), "uid-7");
  TenantDirectory gone = dir->Without(id);
  EXPECT_EQ(gone.NameOf(id), "claim-1");  // its last events keep its name
  // A reload in this mode (no tenants) keeps it and its numbering.
  absl::StatusOr<TenantDirectory> reloaded = FromText("", &*dir);
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->Find("claim-1")->id, id);
  EXPECT_EQ(reloaded->WithSocketTenant(Spec("claim-2", "/run/t/c2/s"))->Find("claim-2")->id, id + 1);
}

TEST(TenantDirectoryHolderTest, ReadersKeepTheirSnapshot) {
  absl::StatusOr<TenantDirectory> v1 = FromText(R"(tenant { name: "a" uids: 7 })");
  ASSERT_TRUE(v1.ok());
  TenantDirectoryHolder holder(*v1);
  std::shared_ptr<const TenantDirectory> before = holder.Get();
  absl::StatusOr<TenantDirectory> v2 = FromText(R"(tenant { name: "b" uids: 7 })", before.get());
  ASSERT_TRUE(v2.ok());
  holder.Replace(*std::move(v2));
  EXPECT_EQ(before->Resolve(7, 0)->name, "a");
  EXPECT_EQ(holder.Get()->Resolve(7, 0)->name, "b");
  EXPECT_EQ(holder.Get()->Resolve(7, 0)->id, 2u);
  EXPECT_EQ(holder.Get()->NameOf(1), "a");
}

}  // namespace
}  // namespace tenants
}  // namespace gpumem
