// Socket tenants against a real daemon (//server:gpumemd) and real client
// processes: PutTenant and DeleteTenant over the main socket (as root), and
// clients through the tenants' sockets as uid 0 in a pid namespace of their
// own (unshare --pid --fork: SO_PEERCRED gives the daemon pid 0, as for a
// pod without hostPID).
//  - PutTenant answers the resolved absolute path, makes a mode 0666
//    socket in a directory of the tenant's own, and is idempotent; bad
//    names and paths (outside the directory, directly in it, "..",
//    symlinks, an existing file, another tenant's socket or directory, a
//    live socket) get precise statuses and leave nothing behind.
//  - A socket's directory lets through only those its socket is for: any
//    other uid can neither connect, nor look the socket up, nor list it.
//  - Only root and the admin group administer: not another uid, and not a
//    uid 0 through a tenant's socket (which also sees only its tenant);
//    root with pid 0 (a container without hostPID) does.
//  - A client through a tenant's socket is charged to it and refused past
//    its quota; its pid-0 session works as on the main socket.
//  - DeleteTenant of a tenant holding memory is FAILED_PRECONDITION naming
//    it; with end_sessions its sessions end (memory back), its socket goes
//    (connect fails) and its open connections are closed (a slab channel
//    sees EOF; a gRPC client's next call fails).
//  - Tenants made at run time come back with their sockets after a restart
//    on the same ledger (SIGTERM, and kill -9 with stale socket files); a
//    deleted one does not; one an earlier daemon kept directly in
//    tenant_socket_dir moves into a directory of its own.
//  - A config tenant's socket survives a reload (same socket, connections
//    and charges kept), follows the config when it moves or goes, and a
//    reload that takes a runtime tenant's name is refused.
// Needs root and unshare (skipped otherwise).
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <grp.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "common/fd_channel.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "server/ledger/ledger_store.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace {

using testing::ChildProcess;
using testing::DaemonProcess;
using testing::MakeTempDir;
using testing::RunfilePath;

constexpr uint64_t kMiB = uint64_t{1} << 20;

bool Connectable(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return false;
  memcpy(addr.sun_path, path.data(), path.size());
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// What `op` returns (0, or an errno) in a child process of uid `uid`, gid
// `gid` and no supplementary groups.
template <typename Op>
int ErrnoAs(uid_t uid, gid_t gid, Op op) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      _exit(250);
    }
    _exit(op());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 251;
}

// connect() to `path` from a child process of uid and gid `uid` (no
// supplementary groups; `gid` for another group): 0, or the errno.
int ConnectErrnoAs(uid_t uid, const std::string& path, gid_t gid = static_cast<gid_t>(-1)) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  memcpy(addr.sun_path, path.data(), path.size());
  return ErrnoAs(uid, gid == static_cast<gid_t>(-1) ? uid : gid, [&] {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    return connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : errno;
  });
}

// lstat() of `path` as uid and gid `uid`: 0, or the errno.
int StatErrnoAs(uid_t uid, const std::string& path) {
  return ErrnoAs(uid, uid, [&] {
    struct stat st;
    return lstat(path.c_str(), &st) == 0 ? 0 : errno;
  });
}

// opendir() of `dir` as uid and gid `uid`: 0, or the errno.
int ListErrnoAs(uid_t uid, const std::string& dir) {
  return ErrnoAs(uid, uid, [&] {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    return fd >= 0 ? 0 : errno;
  });
}

std::string DirOf(const std::string& path) { return path.substr(0, path.rfind('/')); }

// Owner, group and mode of `path`, as "uid gid 0mode".
std::string Access(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return "missing";
  char mode[8];
  snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
  return absl::StrCat(st.st_uid, " ", st.st_gid, " ", mode);
}

// Polls `done` every 10 ms for up to `ms`.
template <typename F>
bool Eventually(F done, int ms = 5000) {
  for (int waited = 0; waited <= ms; waited += 10) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TenantSocketsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
      GTEST_SKIP() << "needs root and unshare";
    }
    dir_ = MakeTempDir();
    sockets_ = dir_ + "/tenants";
    ledger_ = dir_ + "/ledger.db";
    WriteConfig("");
  }
  void TearDown() override {
    daemon_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void WriteConfig(const std::string& tenants) {
    std::ofstream(dir_ + "/gpumemd.textproto")
        << "tenant_socket_dir: \"" << sockets_ << "\"\n" << tenants;
  }
  void StartDaemon(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--config=" + dir_ + "/gpumemd.textproto",
                                     "--ledger=" + ledger_, "--sim_devices=2x256MiB",
                                     "--slab_size=16MiB"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(daemon_->Start()) << daemon_->Log();
    stub_ = v1::GpuMemory::NewStub(grpc::CreateChannel("unix:" + daemon_->socket(),
                                                       grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }
  absl::StatusOr<v1::PutTenantResponse> Put(const std::string& name, const std::string& path,
                                            uint64_t total = 0, int32_t priority = 0) {
    v1::PutTenantRequest req;
    req.set_name(name);
    req.set_socket_path(path);
    req.set_priority(priority);
    if (total > 0) req.mutable_quota()->set_total_bytes(total);
    v1::PutTenantResponse resp;
    grpc::Status s = stub_->PutTenant(Ctx().get(), req, &resp);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return resp;
  }
  absl::StatusOr<v1::DeleteTenantResponse> Delete(const std::string& name, bool end_sessions) {
    v1::DeleteTenantRequest req;
    req.set_name(name);
    req.set_end_sessions(end_sessions);
    v1::DeleteTenantResponse resp;
    grpc::Status s = stub_->DeleteTenant(Ctx().get(), req, &resp);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return resp;
  }
  v1::GetStatsResponse Stats() {
    v1::GetStatsResponse resp;
    grpc::Status s = stub_->GetStats(Ctx().get(), v1::GetStatsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  // The tenant of that name in GetStats (as root), or null.
  std::unique_ptr<v1::TenantStats> Tenant(const std::string& name) {
    const v1::GetStatsResponse stats = Stats();
    for (const v1::TenantStats& t : stats.tenants()) {
      if (t.name() == name) return std::make_unique<v1::TenantStats>(t);
    }
    return nullptr;
  }
  uint64_t Used(const std::string& tenant) {
    std::unique_ptr<v1::TenantStats> t = Tenant(tenant);
    return t == nullptr ? 0 : t->used_bytes();
  }
  uint64_t DeviceUsed() {
    uint64_t used = 0;
    const v1::GetStatsResponse stats = Stats();
    for (const v1::DeviceStats& d : stats.devices()) used += d.used_bytes();
    return used;
  }
  // test_client through `socket` as uid 0 in a pid namespace of its own.
  std::unique_ptr<ChildProcess> Client(const std::string& socket, std::vector<std::string> args,
                                       bool own_pid_namespace = true) {
    std::vector<std::string> argv;
    if (own_pid_namespace) argv = {"/usr/bin/unshare", "--pid", "--fork", "--kill-child"};
    argv.push_back(RunfilePath("tests/integration/test_client"));
    argv.push_back("--socket=" + socket);
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(argv);
  }
  // test_client where another uid can run it (runfiles live under root's
  // home, which other uids cannot enter).
  std::string NobodysClient() {
    const std::string copy = dir_ + "/test_client";
    std::filesystem::copy_file(RunfilePath("tests/integration/test_client"), copy,
                               std::filesystem::copy_options::overwrite_existing);
    chmod(copy.c_str(), 0755);
    return copy;
  }
  std::string Hold(ChildProcess& c) {
    const std::string line = c.ReadLine();
    EXPECT_TRUE(absl::StartsWith(line, "alloc ")) << line;
    EXPECT_EQ(c.ReadLine(), "ready");
    return line;
  }

  std::string dir_, sockets_, ledger_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
};

// PutTenant's socket_uid/socket_gid/socket_mode decide who may connect:
// another uid gets EACCES, the socket's uid connects; an update without
// them keeps them, one with them changes the live socket; no fields: 0666;
// a bad mode is INVALID_ARGUMENT naming socket_mode.
TEST_F(TenantSocketsTest, PutTenantSetsWhoMayConnect) {
  StartDaemon();
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // other uids pass through the test's directory
  auto put = [&](const std::string& name, std::optional<uint32_t> uid, uint32_t mode) {
    v1::PutTenantRequest req;
    req.set_name(name);
    req.set_socket_path(name + ".sock");
    if (uid) req.set_socket_uid(*uid);
    req.set_socket_mode(mode);
    v1::PutTenantResponse resp;
    grpc::Status s = stub_->PutTenant(Ctx().get(), req, &resp);
    return s.ok() ? absl::StatusOr<v1::PutTenantResponse>(resp)
                  : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  };
  absl::StatusOr<v1::PutTenantResponse> owned = put("owned", 4242, 0600);
  ASSERT_TRUE(owned.ok()) << owned.status();
  EXPECT_EQ(owned->socket_uid(), 4242u);
  EXPECT_EQ(owned->socket_mode(), 0600u);
  const std::string path = owned->socket_path();
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4242u);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  struct stat dir_st;
  ASSERT_EQ(stat(sockets_.c_str(), &dir_st), 0);
  EXPECT_EQ(dir_st.st_mode & 07777, 0711u) << "tenant_socket_dir, made by the daemon";
  EXPECT_EQ(path, sockets_ + "/owned/owned.sock");
  EXPECT_EQ(Access(DirOf(path)), "4242 0 0100") << "its directory: only uid 4242 passes";
  EXPECT_EQ(ConnectErrnoAs(65534, path), EACCES);
  EXPECT_EQ(StatErrnoAs(65534, path), EACCES) << "another uid cannot even look it up";
  EXPECT_EQ(ListErrnoAs(65534, DirOf(path)), EACCES);
  EXPECT_EQ(ConnectErrnoAs(4242, path), 0);
  // An update without access keeps it.
  ASSERT_TRUE(Put("owned", "", 8 * kMiB).ok());
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4242u);
  EXPECT_EQ(ConnectErrnoAs(65534, path), EACCES);
  // One with access changes the live socket.
  ASSERT_TRUE(put("owned", std::nullopt, 0666).ok());
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 07777, 0666u);
  EXPECT_EQ(Access(DirOf(path)), "0 0 0711") << "others pass, nobody lists";
  EXPECT_EQ(ConnectErrnoAs(65534, path), 0);
  EXPECT_EQ(ListErrnoAs(65534, DirOf(path)), EACCES);
  // No fields: root's, 0666 (a claim's socket, reached through its mount).
  absl::StatusOr<v1::PutTenantResponse> plain = Put("plain", "plain.sock");
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(lstat(plain->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0666u);
  absl::StatusOr<v1::PutTenantResponse> bad = put("bad", 4242, 0777);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "socket_mode 0777")) << bad.status();
  EXPECT_NE(lstat((sockets_ + "/bad").c_str(), &st), 0) << "nothing made for a refusal";
}

// A socket for a group: its directory is the group's too (root, the group,
// 0710): a uid of the group connects, any other uid (the socket's owner
// group aside) can neither connect, nor look the socket up, nor list its
// directory, and so cannot read anything through it. Two tenants' sockets
// never share a directory.
TEST_F(TenantSocketsTest, OnlyTheSocketsUsersPassThroughItsDirectory) {
  StartDaemon();
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  v1::PutTenantRequest req;
  req.set_name("grp");
  req.set_socket_gid(4343);
  v1::PutTenantResponse grp;
  ASSERT_TRUE(stub_->PutTenant(Ctx().get(), req, &grp).ok());
  const std::string path = grp.socket_path();
  EXPECT_EQ(path, sockets_ + "/grp/gpumemd.sock");
  EXPECT_EQ(Access(path), "0 4343 0660");
  EXPECT_EQ(Access(DirOf(path)), "0 4343 0710");
  EXPECT_EQ(ConnectErrnoAs(5000, path, 4343), 0) << "a uid of the group";
  for (uid_t other : {65534u, 4242u}) {
    EXPECT_EQ(ConnectErrnoAs(other, path), EACCES) << other;
    EXPECT_EQ(StatErrnoAs(other, path), EACCES) << other;
    EXPECT_EQ(ListErrnoAs(other, DirOf(path)), EACCES) << other;
  }
  // Reading through it needs a connection: another uid's client fails to
  // connect, while the main socket still serves it.
  ChildProcess reader({NobodysClient(), "--socket=" + path, absl::StrCat("--size=", kMiB),
                       "--count=1", "--then=exit"},
                      65534);
  const std::string line = reader.ReadLine();
  EXPECT_TRUE(absl::StartsWith(line, "error 14")) << line;
  // Another tenant cannot put its socket in grp's directory, nor below it.
  for (const std::string& p : {sockets_ + "/grp/mine.sock", sockets_ + "/grp/sub/mine.sock"}) {
    absl::StatusOr<v1::PutTenantResponse> r = Put("intruder", p);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << p;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "directory of its own")) << r.status();
  }
  EXPECT_EQ(Access(DirOf(path)), "0 4343 0710") << "a refusal changed grp's directory";
  // A reload of the access changes the directory with the socket.
  req.clear_socket_gid();
  req.set_socket_uid(4242);
  req.set_socket_mode(0600);
  ASSERT_TRUE(stub_->PutTenant(Ctx().get(), req, &grp).ok());
  EXPECT_EQ(Access(path), "4242 0 0600");
  EXPECT_EQ(Access(DirOf(path)), "4242 0 0100");
  EXPECT_EQ(ConnectErrnoAs(5000, path, 4343), EACCES);
  EXPECT_EQ(ConnectErrnoAs(4242, path), 0);
  // DeleteTenant removes the directory it made.
  ASSERT_TRUE(Delete("grp", true).ok());
  EXPECT_FALSE(Exists(DirOf(path)));
}

TEST_F(TenantSocketsTest, PutTenantAnswersTheResolvedSocketAndIsIdempotent) {
  StartDaemon();
  const std::string uuid1 = Stats().devices(1).uuid();
  v1::PutTenantRequest req;
  req.set_name("team");
  req.mutable_quota()->set_total_bytes(64 * kMiB);
  v1::DeviceQuota* dq = req.mutable_quota()->add_devices();
  dq->set_device(uuid1);
  dq->set_bytes(32 * kMiB);
  v1::PutTenantResponse first, second;
  ASSERT_TRUE(stub_->PutTenant(Ctx().get(), req, &first).ok());
  EXPECT_EQ(first.name(), "team");
  EXPECT_EQ(first.socket_path(), sockets_ + "/team/gpumemd.sock");
  EXPECT_TRUE(first.created());
  EXPECT_GE(first.tenant(), uint32_t{1} << 31);
  ASSERT_EQ(first.quota().devices_size(), 1);
  EXPECT_EQ(first.quota().devices(0).device(), "1");  // by index in answers
  struct stat st;
  ASSERT_EQ(lstat(first.socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u) << "pods run as any uid";
  EXPECT_TRUE(Connectable(first.socket_path()));
  // The same again: the same answer, nothing made again.
  ASSERT_TRUE(stub_->PutTenant(Ctx().get(), req, &second).ok());
  EXPECT_FALSE(second.created());
  EXPECT_EQ(second.tenant(), first.tenant());
  EXPECT_EQ(second.socket_path(), first.socket_path());
  struct stat again;
  ASSERT_EQ(lstat(first.socket_path().c_str(), &again), 0);
  EXPECT_EQ(again.st_ino, st.st_ino) << "the socket was made again";
  // A new quota and priority; the socket stays (an empty path keeps it).
  absl::StatusOr<v1::PutTenantResponse> changed = Put("team", "", 128 * kMiB, 4);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->socket_path(), first.socket_path());
  EXPECT_EQ(Tenant("team")->quota().total_bytes(), 128 * kMiB);
  // Moving it is refused.
  EXPECT_EQ(Put("team", "elsewhere.sock").status().code(), absl::StatusCode::kFailedPrecondition);

  // The DRA plugin's form: a file in a directory it made there; a bare name.
  ASSERT_EQ(mkdir((sockets_ + "/claim-1").c_str(), 0755), 0);
  absl::StatusOr<v1::PutTenantResponse> claim =
      Put("claim-1", sockets_ + "/claim-1/gpumemd.sock", 8 * kMiB);
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->socket_path(), sockets_ + "/claim-1/gpumemd.sock");
  EXPECT_EQ(Access(sockets_ + "/claim-1"), "0 0 0711") << "the directory found is the tenant's";
  EXPECT_NE(claim->tenant(), first.tenant());
  absl::StatusOr<v1::PutTenantResponse> bare = Put("bare", "bare-name.sock");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->socket_path(), sockets_ + "/bare/bare-name.sock");
  EXPECT_TRUE(Connectable(bare->socket_path()));
  // GetStats lists them while they hold nothing.
  ASSERT_NE(Tenant("claim-1"), nullptr);
  EXPECT_EQ(Tenant("claim-1")->quota().total_bytes(), 8 * kMiB);
}

TEST_F(TenantSocketsTest, BadNamesAndPathsArePreciseAndLeaveNothing) {
  StartDaemon();
  ASSERT_TRUE(Put("owner", "owned.sock").ok());
  const std::string owned = sockets_ + "/owner/owned.sock";
  ASSERT_EQ(mkdir(sockets_.c_str(), 0755) == 0 || errno == EEXIST, true);
  // A symlink inside the directory to a directory outside it, and one in a
  // tenant's directory.
  const std::string outside = dir_ + "/outside";
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  ASSERT_EQ(symlink(outside.c_str(), (sockets_ + "/link").c_str()), 0);
  for (const char* d : {"/t6", "/t7", "/t9"}) ASSERT_EQ(mkdir((sockets_ + d).c_str(), 0755), 0);
  ASSERT_EQ(symlink((outside + "/x.sock").c_str(), (sockets_ + "/t6/link.sock").c_str()), 0);
  std::ofstream(sockets_ + "/file.sock") << "not a socket\n";
  std::ofstream(sockets_ + "/t7/file.sock") << "not a socket\n";
  // A live socket nobody told the daemon about.
  const int live = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string live_path = sockets_ + "/t9/live.sock";
  memcpy(addr.sun_path, live_path.data(), live_path.size());
  ASSERT_EQ(bind(live, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(live, 1), 0);

  struct Case {
    std::string name, path;
    absl::StatusCode code;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"t1", "/tmp/t1.sock", absl::StatusCode::kInvalidArgument, "outside"},
      {"t2", sockets_ + "-evil/t2.sock", absl::StatusCode::kInvalidArgument, "outside"},
      {"t3", sockets_ + "/../t3.sock", absl::StatusCode::kInvalidArgument, "\"..\""},
      {"t4", "sub/t4.sock", absl::StatusCode::kInvalidArgument, "relative"},
      {"t5", sockets_ + "/link/t5.sock", absl::StatusCode::kInvalidArgument, "symlink"},
      {"t6", "link.sock", absl::StatusCode::kInvalidArgument, "symlink"},
      {"t7", "file.sock", absl::StatusCode::kAlreadyExists, "not a socket"},
      {"t8", owned, absl::StatusCode::kAlreadyExists, "\"owner\""},
      {"t8", sockets_ + "/owner/other.sock", absl::StatusCode::kAlreadyExists,
       "directory of its own"},
      {"t9", "live.sock", absl::StatusCode::kAlreadyExists, "serving"},
      {"t10", sockets_ + "/file.sock/t10.sock", absl::StatusCode::kInvalidArgument,
       "not a directory"},
      {"t11", sockets_ + "/t11.sock", absl::StatusCode::kInvalidArgument,
       "directly in tenant_socket_dir"},
      {"uid-0", "", absl::StatusCode::kInvalidArgument, "uid tenant"},
      {"a/b", "", absl::StatusCode::kInvalidArgument, "letters, digits"},
      {std::string(64, 'n'), "", absl::StatusCode::kInvalidArgument, "63"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<v1::PutTenantResponse> r = Put(c.name, c.path);
    ASSERT_FALSE(r.ok()) << c.name << " " << c.path << " answered " << r->socket_path();
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.words)) << c.name << ": " << r.status();
    EXPECT_EQ(Tenant(c.name), nullptr) << c.name << " is listed after a refusal";
  }
  {  // An unknown device in the quota.
    v1::PutTenantRequest req;
    req.set_name("t11");
    v1::DeviceQuota* dq = req.mutable_quota()->add_devices();
    dq->set_device("GPU-nope");
    dq->set_bytes(kMiB);
    v1::PutTenantResponse resp;
    EXPECT_EQ(stub_->PutTenant(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Nothing was made: outside, the files, the links and the directories
  // are as they were.
  EXPECT_TRUE(std::filesystem::is_empty(outside));
  EXPECT_EQ(Slurp(sockets_ + "/file.sock"), "not a socket\n");
  EXPECT_EQ(Slurp(sockets_ + "/t7/file.sock"), "not a socket\n");
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(sockets_)) {
    entries.push_back(e.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(absl::StrJoin(entries, " "), "file.sock link owner t6 t7 t9");
  EXPECT_EQ(Access(sockets_ + "/owner"), "0 0 0711");
  EXPECT_TRUE(Connectable(owned));
  EXPECT_TRUE(Connectable(live_path));
  close(live);
  // A socket nobody serves any more (left by a dead daemon) is replaced.
  absl::StatusOr<v1::PutTenantResponse> stale = Put("t9", "live.sock");
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(Connectable(live_path));
}

TEST_F(TenantSocketsTest, OnlyAdministratorsAndNeverThroughATenantSocket) {
  StartDaemon();
  ASSERT_TRUE(Put("team", "team.sock").ok());
  ASSERT_TRUE(Put("other", "other.sock").ok());
  const std::string team = sockets_ + "/team/team.sock";
  for (const std::string rpc : {"put", "delete", "set_quota"}) {
    // uid 0 in its own pid namespace, through a tenant's socket: refused.
    auto pod = Client(team, {"--tenant_rpc=" + rpc, "--tenant=other"});
    EXPECT_EQ(pod->ReadLine(), "status 7") << rpc << " through a tenant socket";
    // Another uid on the main socket: refused.
    ChildProcess nobody({NobodysClient(), "--socket=" + daemon_->socket(),
                         "--tenant_rpc=" + rpc, "--tenant=other"},
                        65534);
    EXPECT_EQ(nobody.ReadLine(), "status 7") << rpc << " as uid 65534";
  }
  ASSERT_NE(Tenant("other"), nullptr);
  // Through its socket it sees its own tenant only.
  auto usage = Client(team, {"--tenant_rpc=usage"});
  EXPECT_EQ(usage->ReadLine(), "usage team");
  // Root with pid 0 (a container without hostPID) on the main socket: served.
  auto root_pod = Client(daemon_->socket(), {"--tenant_rpc=delete", "--tenant=other"});
  EXPECT_EQ(root_pod->ReadLine(), "status 0");
  EXPECT_EQ(Tenant("other"), nullptr);
}

TEST_F(TenantSocketsTest, ClientsThroughTheSocketAreChargedToItsTenant) {
  StartDaemon();
  absl::StatusOr<v1::PutTenantResponse> put = Put("team", "team.sock", 32 * kMiB);
  ASSERT_TRUE(put.ok()) << put.status();
  const std::string team = put->socket_path();
  auto session = Client(team, {"--session"});
  EXPECT_TRUE(absl::StartsWith(session->ReadLine(), "session ")) << "pid 0 gets a session";
  auto holder = Client(team, {absl::StrCat("--size=", 24 * kMiB), "--count=1", "--then=hold"});
  Hold(*holder);
  EXPECT_EQ(Used("team"), 24 * kMiB);
  EXPECT_EQ(Used("uid-0"), 0u) << "charged to the caller's uid instead";
  auto over = Client(team, {absl::StrCat("--size=", 16 * kMiB), "--count=1", "--then=exit"});
  EXPECT_TRUE(absl::StartsWith(over->ReadLine(), "error 8 ")) << "past the tenant's quota";
  // The same program on the main socket is uid 0's, not the tenant's.
  auto main = Client(daemon_->socket(), {absl::StrCat("--size=", 16 * kMiB), "--count=1",
                                         "--then=hold"});
  Hold(*main);
  EXPECT_EQ(Used("uid-0"), 16 * kMiB);
  EXPECT_EQ(Used("team"), 24 * kMiB);
  holder->Kill(SIGKILL);
  EXPECT_TRUE(Eventually([&] { return Used("team") == 0; }));
}

TEST_F(TenantSocketsTest, DeleteRefusesWhileItHoldsThenEndsSessionsAndClosesTheSocket) {
  StartDaemon();
  absl::StatusOr<v1::PutTenantResponse> put = Put("team", "team.sock");
  ASSERT_TRUE(put.ok()) << put.status();
  const std::string team = put->socket_path();
  auto holder = Client(team, {absl::StrCat("--size=", 8 * kMiB), "--count=1", "--then=hold"});
  Hold(*holder);
  // This process (pid visible) through the socket too, with a raw slab
  // channel beside its client.
  absl::StatusOr<std::unique_ptr<client::Client>> mine = client::Client::Connect(team);
  ASSERT_TRUE(mine.ok()) << mine.status();
  absl::StatusOr<client::Buffer> buf = (*mine)->Allocate(kMiB);
  ASSERT_TRUE(buf.ok()) << buf.status();
  absl::StatusOr<int> channel = ConnectFdChannel(team);
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE(HelloFdChannel(*channel).ok());

  absl::StatusOr<v1::DeleteTenantResponse> refused = Delete("team", false);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "holds 2 allocation(s), 9.00 MiB"))
      << refused.status();
  EXPECT_EQ(Used("team"), 9 * kMiB);
  EXPECT_TRUE(Connectable(team));
  absl::StatusOr<client::Buffer> still = (*mine)->Allocate(kMiB);
  ASSERT_TRUE(still.ok()) << "refused delete changed something: " << still.status();
  ASSERT_TRUE(still->Free().ok());

  absl::StatusOr<v1::DeleteTenantResponse> ended = Delete("team", true);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->existed());
  EXPECT_GE(ended->sessions_ended(), 2u);
  EXPECT_EQ(ended->allocations_freed(), 2u);
  EXPECT_EQ(DeviceUsed(), 0u) << "the ended sessions' memory did not come back";
  EXPECT_EQ(Tenant("team"), nullptr);
  EXPECT_FALSE(Exists(team)) << "the socket file is left";
  EXPECT_FALSE(Connectable(team));
  // Its open connections are closed: the slab channel sees the end...
  struct pollfd p = {*channel, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  char byte;
  EXPECT_EQ(recv(*channel, &byte, 1, 0), 0);
  close(*channel);
  // ...and the gRPC client's next call fails.
  absl::StatusOr<client::Buffer> after = (*mine)->Allocate(kMiB);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
  // A new connection to it: refused as the daemon is not there.
  auto late = Client(team, {absl::StrCat("--size=", kMiB), "--count=1", "--then=exit"});
  EXPECT_TRUE(absl::StartsWith(late->ReadLine(), "error 14")) << "UNAVAILABLE";
  // Again: nothing to remove.
  absl::StatusOr<v1::DeleteTenantResponse> again = Delete("team", true);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->existed());
}

TEST_F(TenantSocketsTest, RuntimeTenantsComeBackAfterARestart) {
  StartDaemon();
  ASSERT_EQ(mkdir(sockets_.c_str(), 0755) == 0 || errno == EEXIST, true);
  ASSERT_EQ(mkdir((sockets_ + "/claim-1").c_str(), 0755), 0);
  const std::string uuid0 = Stats().devices(0).uuid();
  v1::PutTenantRequest req;
  req.set_name("team");
  req.set_priority(3);
  req.mutable_quota()->set_total_bytes(16 * kMiB);
  v1::DeviceQuota* dq = req.mutable_quota()->add_devices();
  dq->set_device(uuid0);
  dq->set_bytes(8 * kMiB);
  v1::PutTenantResponse team;
  ASSERT_TRUE(stub_->PutTenant(Ctx().get(), req, &team).ok());
  absl::StatusOr<v1::PutTenantResponse> claim =
      Put("claim-1", sockets_ + "/claim-1/gpumemd.sock", 4 * kMiB);
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  EXPECT_FALSE(Exists(team.socket_path())) << "a clean stop removes its sockets";

  StartDaemon();
  ASSERT_TRUE(Eventually([&] { return Connectable(team.socket_path()); })) << daemon_->Log();
  ASSERT_TRUE(Eventually([&] { return Connectable(claim->socket_path()); }));
  std::unique_ptr<v1::TenantStats> back = Tenant("team");
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->quota().total_bytes(), 16 * kMiB);
  ASSERT_EQ(back->quota().devices_size(), 1);
  EXPECT_EQ(back->quota().devices(0).bytes(), 8 * kMiB);
  auto in_team = Client(team.socket_path(), {absl::StrCat("--size=", 6 * kMiB), "--count=1",
                                             "--devices=0", "--then=hold"});
  Hold(*in_team);
  EXPECT_EQ(Used("team"), 6 * kMiB);
  auto over = Client(team.socket_path(),
                     {absl::StrCat("--size=", 4 * kMiB), "--count=1", "--devices=0", "--then=exit"});
  EXPECT_TRUE(absl::StartsWith(over->ReadLine(), "error 8 ")) << "its device quota came back";
  // PutTenant again after the restart: the same tenant, not a new one.
  absl::StatusOr<v1::PutTenantResponse> reput =
      Put("claim-1", sockets_ + "/claim-1/gpumemd.sock", 4 * kMiB);
  ASSERT_TRUE(reput.ok()) << reput.status();
  EXPECT_FALSE(reput->created());
  ASSERT_TRUE(Delete("claim-1", true).ok());
  in_team->Kill(SIGKILL);

  // kill -9: the sockets stay behind as files nobody serves; the next start
  // replaces team's and does not bring claim-1 back.
  kill(daemon_->pid(), SIGKILL);
  daemon_->Stop();
  ASSERT_TRUE(Exists(team.socket_path()));
  StartDaemon();
  ASSERT_TRUE(Eventually([&] { return Connectable(team.socket_path()); })) << daemon_->Log();
  EXPECT_NE(Tenant("team"), nullptr);
  EXPECT_EQ(Tenant("claim-1"), nullptr);
  EXPECT_FALSE(Exists(claim->socket_path()));
}

// A ledger an earlier gpumemd wrote, with a socket tenant whose socket it
// made directly in tenant_socket_dir: the tenant is restored with its
// socket in a directory of its own (same file name), the log says where it
// moved, and the ledger keeps the new path (the next start says nothing).
TEST_F(TenantSocketsTest, ASocketKeptDirectlyInTheDirectoryMovesIntoOneOfItsOwn) {
  {
    absl::StatusOr<std::unique_ptr<ledger::LedgerStore>> store =
        ledger::LedgerStore::Open(ledger_, absl::GetCurrentTimeNanos());
    ASSERT_TRUE(store.ok()) << store.status();
    ledger::SocketTenantRow row;
    row.name = "old";
    row.socket = sockets_ + "/old.sock";
    row.total_bytes = 8 * kMiB;
    row.source = "PutTenant by uid 0";
    ASSERT_TRUE((*store)->PutSocketTenant(row).ok());
  }
  StartDaemon();
  const std::string moved = sockets_ + "/old/old.sock";
  ASSERT_TRUE(Eventually([&] { return Connectable(moved); })) << daemon_->Log();
  EXPECT_FALSE(Exists(sockets_ + "/old.sock"));
  EXPECT_TRUE(absl::StrContains(daemon_->Log(),
                                absl::StrCat("moves from ", sockets_, "/old.sock to ", moved)))
      << daemon_->Log();
  ASSERT_NE(Tenant("old"), nullptr);
  EXPECT_EQ(Tenant("old")->quota().total_bytes(), 8 * kMiB);
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  StartDaemon();
  ASSERT_TRUE(Eventually([&] { return Connectable(moved); })) << daemon_->Log();
  EXPECT_FALSE(absl::StrContains(daemon_->Log(), "moves from")) << daemon_->Log();
}

// kill -9 under a client in its own pid namespace (a connection-bound
// session) that holds a block through a tenant's socket: the next daemon
// lists the tenant again before it restores, the client rebinds its
// session through the new socket, and the block survives intact, charged
// to the tenant as before, and frees normally.
TEST_F(TenantSocketsTest, ABlockHeldThroughATenantSocketSurvivesKillNine) {
  // (Each daemon of the fixture has a socket of its own: the state is put
  // where both find it.)
  const std::vector<std::string> keep = {"--state=" + dir_ + "/state"};
  StartDaemon(keep);
  absl::StatusOr<v1::PutTenantResponse> put = Put("team", "team.sock", 32 * kMiB);
  ASSERT_TRUE(put.ok()) << put.status();
  const std::string check = dir_ + "/check";
  auto holder = Client(put->socket_path(), {absl::StrCat("--size=", 6 * kMiB), "--count=2",
                                            "--then=check", "--check_file=" + check});
  EXPECT_TRUE(absl::StartsWith(holder->ReadLine(), "alloc "));
  EXPECT_TRUE(absl::StartsWith(holder->ReadLine(), "alloc "));
  ASSERT_EQ(holder->ReadLine(), "ready");
  ASSERT_EQ(Used("team"), 12 * kMiB);

  kill(daemon_->pid(), SIGKILL);
  daemon_->Stop();
  StartDaemon(keep);
  EXPECT_EQ(Used("team"), 12 * kMiB) << "the tenant's charge is back at once\n" << daemon_->Log();
  EXPECT_EQ(Used("uid-0"), 0u);
  ASSERT_TRUE(Eventually([&] { return Connectable(put->socket_path()); })) << daemon_->Log();
  std::ofstream(check) << "go";
  EXPECT_EQ(holder->ReadLine(), "intact 2 lost 0 restarts 1") << daemon_->Log();
  EXPECT_EQ(holder->ReadLine(), "freed") << daemon_->Log();
  EXPECT_TRUE(Eventually([&] { return Used("team") == 0; }));
  EXPECT_EQ(DeviceUsed(), 0u);
}

TEST_F(TenantSocketsTest, AConfigTenantsSocketSurvivesAReloadAndFollowsTheConfig) {
  WriteConfig(R"(tenant { name: "team" uids: 4242 socket: "team.sock" quota { total_bytes: "32MiB" } })");
  StartDaemon();
  const std::string team = sockets_ + "/team/team.sock";
  ASSERT_TRUE(Eventually([&] { return Connectable(team); })) << daemon_->Log();
  EXPECT_TRUE(Eventually([&] { return Access(DirOf(team)) == "4242 0 0100"; }))
      << "owner uid 4242 alone passes: " << Access(DirOf(team));
  struct stat before;
  ASSERT_EQ(lstat(team.c_str(), &before), 0);
  const uint32_t id = Tenant("team")->tenant();
  auto holder = Client(team, {absl::StrCat("--size=", 4 * kMiB), "--count=1", "--then=hold"});
  Hold(*holder);
  EXPECT_EQ(Used("team"), 4 * kMiB);
  ASSERT_TRUE(Put("claim-1", "claim-1.sock").ok());

  // A reload that adds a tenant with a socket and raises team's quota.
  WriteConfig(R"(
    tenant { name: "team" uids: 4242 socket: "team.sock" quota { total_bytes: "48MiB" } }
    tenant { name: "other" uids: 4243 socket: "other.sock" }
  )");
  kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(Eventually([&] { return Connectable(sockets_ + "/other/other.sock"); })) << daemon_->Log();
  ASSERT_TRUE(Eventually([&] { return Tenant("team")->quota().total_bytes() == 48 * kMiB; }));
  struct stat after;
  ASSERT_EQ(lstat(team.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "team's socket was made again";
  EXPECT_EQ(Tenant("team")->tenant(), id);
  EXPECT_EQ(Used("team"), 4 * kMiB);
  auto more = Client(team, {absl::StrCat("--size=", 40 * kMiB), "--count=1", "--then=free"});
  Hold(*more);  // 4 + 40 MiB: within the new quota
  EXPECT_EQ(more->ReadLine(), "freed");
  EXPECT_TRUE(Connectable(sockets_ + "/claim-1/claim-1.sock")) << "a runtime tenant lost its socket";

  // A reload that takes a runtime tenant's name: refused, nothing changes.
  WriteConfig(R"(
    tenant { name: "team" uids: 4242 socket: "team.sock" }
    tenant { name: "claim-1" uids: 4244 }
  )");
  kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(Eventually([&] { return absl::StrContains(daemon_->Log(), "reload refused"); }));
  EXPECT_TRUE(absl::StrContains(daemon_->Log(), "made at run time")) << daemon_->Log();
  EXPECT_TRUE(Connectable(sockets_ + "/other/other.sock"));
  EXPECT_EQ(Tenant("team")->quota().total_bytes(), 48 * kMiB);

  // team's socket leaves the config: the file goes; the tenant and its
  // open connection's session stay, as a reload keeps live sessions.
  WriteConfig(R"(
    tenant { name: "team" uids: 4242 quota { total_bytes: "48MiB" } }
    tenant { name: "other" uids: 4243 socket: "other.sock" }
  )");
  kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(Eventually([&] { return !Exists(team); })) << daemon_->Log();
  EXPECT_FALSE(Exists(DirOf(team))) << "the directory made for it stays";
  EXPECT_EQ(Used("team"), 4 * kMiB);
  holder->Kill(SIGKILL);
  EXPECT_TRUE(Eventually([&] { return Used("team") == 0; }));
}

}  // namespace
}  // namespace gpumem
