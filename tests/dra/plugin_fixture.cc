#include "tests/dra/plugin_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/dra/atomic_file.h"
#include "client/dra/node_devices.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace dra {
namespace testing {

std::string ClaimJson(const ClaimRef& ref, const std::vector<Result>& results,
                      const std::string& pool) {
  nlohmann::json requests = nlohmann::json::array();
  nlohmann::json allocated = nlohmann::json::array();
  int share = 0;
  for (const Result& r : results) {
    nlohmann::json exactly = {{"deviceClassName", "gpumemd.io"}, {"allocationMode", "ExactCount"},
                              {"count", 1}};
    if (!r.memory.empty()) exactly["capacity"] = {{"requests", {{"memory", r.memory}}}};
    requests.push_back({{"name", r.request}, {"exactly", exactly}});
    nlohmann::json res = {{"request", r.request}, {"driver", kDriver}, {"pool", pool},
                          {"device", r.device},
                          {"shareID", absl::StrFormat("00000000-0000-0000-0000-%012d", ++share)}};
    if (!r.memory.empty()) res["consumedCapacity"] = {{"memory", r.memory}};
    allocated.push_back(res);
  }
  nlohmann::json claim = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", ref.name}, {"namespace", ref.ns}, {"uid", ref.uid},
                    {"resourceVersion", "4711"}}},
      {"spec", {{"devices", {{"requests", requests}}}}},
      {"status",
       {{"allocation",
         {{"devices", {{"results", allocated}}},
          {"nodeSelector",
           {{"nodeSelectorTerms",
             {{{"matchFields", {{{"key", "metadata.name"}, {"operator", "In"},
                                 {"values", {pool}}}}}}}}}}}},
        {"reservedFor", {{{"resource", "pods"}, {"name", "app"}, {"uid", "pod-uid-1"}}}}}},
  };
  return claim.dump();
}

void DraPluginFixture::SetUp() {
  dir_ = gpumem::testing::MakeTempDir();
#ifdef GPUMEMD_DRA_REAL_DAEMON
  std::string why;
  peer_ = StartRealPeer(dir_, &why);
  ASSERT_NE(peer_, nullptr) << why;
  if (absl::Status s = ProbeTenantRpcs(*peer_); !s.ok()) {
    FAIL() << "gpumemd does not serve socket tenants (PutTenant/DeleteTenant): " << s;
  }
#else
  peer_ = StartFakePeer(dir_);
#endif
  api_ = std::make_unique<FakeApiServer>(dir_ + "/api.sock");
  registration_socket_ = dir_ + "/registry/" + std::string(kDriver) + "-reg.sock";
  plugin_dir_ = dir_ + "/plugin";
  cdi_dir_ = dir_ + "/cdi";
  state_file_ = plugin_dir_ + "/state.json";
  std::ofstream(dir_ + "/token") << "test-token-1\n";
}

void DraPluginFixture::TearDown() {
  if (plugin_ > 0) StopPlugin(true);
  api_.reset();
  peer_.reset();
  if (::testing::Test::HasFailure()) {
    std::cerr << "---- gpumemd-dra log ----\n" << PluginLog() << "----\n";
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void DraPluginFixture::StartPlugin(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      gpumem::testing::RunfilePath("client/dra/gpumemd-dra"),
      absl::StrCat("--driver_name=", kDriver),
      absl::StrCat("--node_name=", kNode),
      "--gpumemd_socket=" + peer_->socket(),
      "--claims_dir=" + peer_->claims_dir(),
      "--cdi_dir=" + cdi_dir_,
      "--plugin_dir=" + plugin_dir_,
      "--registration_dir=" + dir_ + "/registry",
      "--api_server=http://localhost",
      "--api_server_unix_socket=" + api_->socket(),
      "--api_token_file=" + dir_ + "/token",
      "--api_timeout=1s",
      "--gpumemd_timeout=3s",
      "--poll_interval=100ms",
      "--resync_interval=1h",
      "--backoff_initial=100ms",
      "--backoff_max=800ms",
  };
  argv.insert(argv.end(), extra.begin(), extra.end());
  unlink(registration_socket_.c_str());
  std::vector<char*> cargs;
  for (std::string& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  plugin_ = fork();
  if (plugin_ == 0) {
    const int log = open((dir_ + "/plugin.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 2);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  for (int i = 0; i < 1000; ++i) {
    struct stat st;
    if (stat(registration_socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) break;
    int status;
    ASSERT_NE(waitpid(plugin_, &status, WNOHANG), plugin_) << "gpumemd-dra exited:\n" << PluginLog();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  absl::StatusOr<pluginregistration::PluginInfo> info = kubelet_.Register(registration_socket_);
  ASSERT_TRUE(info.ok()) << info.status() << "\n" << PluginLog();
}

int DraPluginFixture::StopPlugin(bool kill9) {
  if (plugin_ <= 0) return -1001;
  kill(plugin_, kill9 ? SIGKILL : SIGTERM);
  int status = 0;
  for (int i = 0; i < 1000; ++i) {
    if (waitpid(plugin_, &status, WNOHANG) == plugin_) {
      plugin_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return -WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(plugin_, SIGKILL);
  waitpid(plugin_, &status, 0);
  plugin_ = -1;
  return -1000;
}

std::string DraPluginFixture::PluginLog() const {
  absl::StatusOr<std::string> s = ReadWholeFile(dir_ + "/plugin.log");
  return s.ok() ? *s : "";
}

std::string DraPluginFixture::DeviceName(uint32_t index) const {
  absl::StatusOr<v1::GetStatsResponse> s = peer_->Stats();
  if (!s.ok() || index >= static_cast<uint32_t>(s->devices_size())) return "no-such-device";
  return DeviceNameForUuid(s->devices(index).uuid(), index);
}

ClaimRef DraPluginFixture::AddClaim(const std::string& name, const std::vector<Result>& results) {
  ClaimRef ref{"team-a", name,
               absl::StrFormat("5f0c1d2e-0000-4000-8000-%012d", ++claim_counter_)};
  api_->SetClaim(ref.ns, ref.name, ClaimJson(ref, results));
  return ref;
}

std::string DraPluginFixture::SocketDir(const ClaimRef& c) const {
  return peer_->claims_dir() + "/claim-" + c.uid;
}

std::string DraPluginFixture::CdiSpec(const ClaimRef& c) const {
  return cdi_dir_ + "/" + std::string(kDriver) + "-claim_" + c.uid + ".json";
}

nlohmann::json DraPluginFixture::StateFile() const {
  absl::StatusOr<std::string> s = ReadWholeFile(state_file_);
  if (!s.ok()) return nlohmann::json::object();
  return nlohmann::json::parse(*s, nullptr, false);
}

void DraPluginFixture::ExpectNothingMadeFor(const ClaimRef& c) const {
  absl::StatusOr<std::unique_ptr<v1::TenantStats>> t = peer_->Tenant("claim-" + c.uid);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, nullptr) << "tenant claim-" << c.uid << " is left in gpumemd";
  struct stat st;
  EXPECT_NE(lstat(SocketDir(c).c_str(), &st), 0) << SocketDir(c) << " is left";
  EXPECT_NE(lstat(CdiSpec(c).c_str(), &st), 0) << CdiSpec(c) << " is left";
  const nlohmann::json state = StateFile();
  if (state.is_object() && state.contains("claims")) {
    EXPECT_FALSE(state["claims"].contains(c.uid)) << "the state file still records " << c.uid;
  }
}

}  // namespace testing
}  // namespace dra
}  // namespace gpumem
