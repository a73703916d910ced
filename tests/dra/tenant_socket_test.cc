// What a claim's socket means, against the real daemon (//server:gpumemd):
// a process that connects through it is charged to the claim's tenant
// whatever it is (here uid 0, in its own PID namespace, as in a pod), is
// refused past the claim's quota, cannot touch another claim's memory, and
// loses its memory and its socket when the claim is unprepared.
// Uses gpumemd's per-tenant sockets (a daemon answering PutTenant with
// UNIMPLEMENTED fails it). Needs root and unshare (skipped otherwise).
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/dra/plugin_fixture.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace dra {
namespace testing {
namespace {

using gpumem::testing::ChildProcess;
using gpumem::testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;

class TenantSocketTest : public DraPluginFixture {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
      GTEST_SKIP() << "needs root and unshare";
    }
    DraPluginFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    StartPlugin();
  }

  ClaimRef Prepared(const std::string& name, const std::string& memory) {
    const ClaimRef c = AddClaim(name, {{"mem", DeviceName(0), memory}});
    absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) EXPECT_EQ(r->claims().at(c.uid).error(), "");
    return c;
  }
  std::string Socket(const ClaimRef& c) const { return SocketDir(c) + "/gpumemd.sock"; }

  // test_client through the claim's socket, as uid 0 in a PID namespace of
  // its own (SO_PEERCRED gives the daemon pid 0, as for a pod).
  std::unique_ptr<ChildProcess> Client(const ClaimRef& c, std::vector<std::string> args) {
    std::vector<std::string> argv = {"/usr/bin/unshare", "--pid", "--fork", "--kill-child",
                                     RunfilePath("tests/integration/test_client"),
                                     "--socket=" + Socket(c)};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(argv);
  }

  uint64_t TenantUsed(const std::string& name) {
    absl::StatusOr<std::unique_ptr<v1::TenantStats>> t = peer_->Tenant(name);
    if (!t.ok() || *t == nullptr) return 0;
    return (*t)->used_bytes();
  }
};

TEST_F(TenantSocketTest, ChargedToTheClaimsTenantAndRefusedPastItsQuota) {
  const ClaimRef a = Prepared("a", "1Gi");
  // Who reaches it: the claims directory is root's alone (0700); the
  // claim's directory (what CDI mounts) lets any uid pass but not list
  // (0711: gpumemd gives a claim's socket directory its socket's access),
  // and its socket is open to the containers' uids (0666).
  struct stat st;
  const std::string claim_dir = SocketDir(a);
  const std::string claims_dir = claim_dir.substr(0, claim_dir.rfind('/'));
  ASSERT_EQ(stat(claims_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u) << claims_dir;
  ASSERT_EQ(stat(claim_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0711u) << claim_dir;
  EXPECT_EQ(st.st_uid, 0u) << claim_dir;
  ASSERT_EQ(lstat(Socket(a).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0666u);
  EXPECT_EQ(st.st_uid, 0u);
  auto holder = Client(a, {absl::StrCat("--size=", 768 * kMiB), "--count=1", "--then=hold"});
  const std::string line = holder->ReadLine();
  ASSERT_TRUE(absl::StartsWith(line, "alloc ")) << line;
  ASSERT_EQ(holder->ReadLine(), "ready");
  EXPECT_EQ(TenantUsed("claim-" + a.uid), 768 * kMiB);
  EXPECT_EQ(TenantUsed("uid-0"), 0u) << "charged to the caller's uid instead of the claim";
  // 768 MiB + 512 MiB > the claim's 1 GiB: refused, RESOURCE_EXHAUSTED.
  auto more = Client(a, {absl::StrCat("--size=", 512 * kMiB), "--count=1", "--then=exit"});
  const std::string refused = more->ReadLine();
  EXPECT_TRUE(absl::StartsWith(refused, "error 8 ")) << refused;
  EXPECT_EQ(TenantUsed("claim-" + a.uid), 768 * kMiB);
  // Within the quota: served.
  auto fits = Client(a, {absl::StrCat("--size=", 256 * kMiB), "--count=1", "--then=free"});
  EXPECT_TRUE(absl::StartsWith(fits->ReadLine(), "alloc "));
  EXPECT_EQ(fits->ReadLine(), "ready");
  EXPECT_EQ(fits->ReadLine(), "freed");
}

TEST_F(TenantSocketTest, TwoClaimsStayIsolated) {
  const ClaimRef a = Prepared("a", "1Gi");
  const ClaimRef b = Prepared("b", "1Gi");
  auto in_a = Client(a, {absl::StrCat("--size=", 512 * kMiB), "--count=1", "--then=hold"});
  const std::string alloc_a = in_a->ReadLine();
  ASSERT_TRUE(absl::StartsWith(alloc_a, "alloc ")) << alloc_a;
  ASSERT_EQ(in_a->ReadLine(), "ready");
  auto in_b = Client(b, {absl::StrCat("--size=", 256 * kMiB), "--count=1", "--then=hold"});
  ASSERT_TRUE(absl::StartsWith(in_b->ReadLine(), "alloc "));
  ASSERT_EQ(in_b->ReadLine(), "ready");
  EXPECT_EQ(TenantUsed("claim-" + a.uid), 512 * kMiB);
  EXPECT_EQ(TenantUsed("claim-" + b.uid), 256 * kMiB);
  // "alloc ID DEVICE SLAB OFFSET SIZE": B may neither free A's block nor
  // map A's slab, although both are uid 0.
  std::vector<std::string> f = absl::StrSplit(alloc_a, ' ');
  ASSERT_EQ(f.size(), 6u);
  auto free_a = Client(b, {"--free=" + f[1]});
  const std::string freed = free_a->ReadLine();
  EXPECT_TRUE(absl::StartsWith(freed, "status ")) << freed;
  EXPECT_NE(freed, "status 0") << "claim b freed claim a's memory";
  auto read_a = Client(b, {"--read_slab=" + f[3], "--offset=" + f[4], "--expect=0"});
  const std::string read = read_a->ReadLine();
  EXPECT_TRUE(absl::StartsWith(read, "error ")) << "claim b mapped claim a's slab: " << read;
  EXPECT_EQ(TenantUsed("claim-" + a.uid), 512 * kMiB);
}

TEST_F(TenantSocketTest, UnprepareEndsTheClaimsSessionsAndItsSocket) {
  const ClaimRef a = Prepared("a", "1Gi");
  auto in_a = Client(a, {absl::StrCat("--size=", 512 * kMiB), "--count=1", "--then=hold"});
  ASSERT_TRUE(absl::StartsWith(in_a->ReadLine(), "alloc "));
  ASSERT_EQ(in_a->ReadLine(), "ready");
  absl::StatusOr<drapb::NodeUnprepareResourcesResponse> u = kubelet_.Unprepare({a});
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->claims().at(a.uid).error(), "");
  ExpectNothingMadeFor(a);
  absl::StatusOr<v1::GetStatsResponse> s = peer_->Stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->devices(0).used_bytes(), 0u) << "the ended session's memory did not come back";
  // A connection to the removed tenant's socket: refused, clearly.
  auto late = Client(a, {absl::StrCat("--size=", kMiB), "--count=1", "--then=exit"});
  const std::string line = late->ReadLine();
  EXPECT_TRUE(absl::StartsWith(line, "error 14")) << line;  // UNAVAILABLE
}

}  // namespace
}  // namespace testing
}  // namespace dra
}  // namespace gpumem
