// gpumemd-dra: the Kubernetes DRA kubelet plugin of gpumemd.
//
// It runs on every GPU node beside gpumemd (deploy/kubernetes/) and
//   - registers with the kubelet as DRA driver --driver_name (a Unix socket
//     in --registration_dir; its node service on --plugin_dir/dra.sock);
//   - publishes the node's ResourceSlice (a device per GPU with its
//     leasable memory as consumable capacity) and keeps it current;
//   - prepares claims: each becomes gpumemd tenant claim-<uid> with the
//     claim's memory as per-device quota and a socket of its own, mounted
//     into the claim's containers by a CDI spec; unprepare removes it all.
// State survives restarts in --state_file. SIGTERM/SIGINT: deregister
// (remove the registration socket), stop serving, exit 0.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/dra/api_server.h"
#include "client/dra/claim_preparer.h"
#include "client/dra/kubelet_service.h"
#include "client/dra/log.h"
#include "client/dra/plugin_state.h"
#include "client/dra/quantity.h"
#include "client/dra/slice_publisher.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

ABSL_FLAG(std::string, driver_name, "gpumemd.io",
          "DRA driver name (a DNS subdomain): DeviceClass selectors, CDI vendor");
ABSL_FLAG(std::string, node_name, "", "this node's name (default $NODE_NAME)");
ABSL_FLAG(std::string, gpumemd_socket, "/run/gpumemd/gpumemd.sock", "gpumemd's main socket");
ABSL_FLAG(std::string, claims_dir, "/run/gpumemd/tenants",
          "gpumemd's tenant_socket_dir: each claim's socket directory is made here");
ABSL_FLAG(std::string, container_socket, "/run/gpumemd/gpumemd.sock",
          "the socket path inside the claim's containers (GPUMEMD_SOCKET)");
ABSL_FLAG(std::string, cdi_dir, "/var/run/cdi", "where the container runtime reads CDI specs");
ABSL_FLAG(std::string, plugin_dir, "",
          "the plugin's directory (default /var/lib/kubelet/plugins/<driver_name>): dra.sock");
ABSL_FLAG(std::string, registration_dir, "/var/lib/kubelet/plugins_registry",
          "the kubelet's plugin registration directory");
ABSL_FLAG(std::string, state_file, "",
          "what this plugin prepared (default <plugin_dir>/state.json)");
ABSL_FLAG(std::string, api_server, "",
          "API server URL (default: in-cluster, https://$KUBERNETES_SERVICE_HOST:PORT)");
ABSL_FLAG(std::string, api_server_unix_socket, "",
          "reach the API server through this Unix socket (kubectl proxy --unix-socket)");
ABSL_FLAG(std::string, api_token_file, "",
          "bearer token file (default in-cluster: the service account's token)");
ABSL_FLAG(std::string, api_ca_file, "",
          "CA bundle for the API server (default in-cluster: the service account's ca.crt)");
ABSL_FLAG(absl::Duration, api_timeout, absl::Seconds(10), "deadline of one API server request");
ABSL_FLAG(absl::Duration, gpumemd_timeout, absl::Seconds(5), "deadline of one gpumemd call");
ABSL_FLAG(absl::Duration, poll_interval, absl::Seconds(10), "how often gpumemd's capacity is read");
ABSL_FLAG(absl::Duration, resync_interval, absl::Minutes(5),
          "an unchanged ResourceSlice is written again this often");
ABSL_FLAG(absl::Duration, backoff_initial, absl::Seconds(1),
          "first retry delay of a failed ResourceSlice write (doubles)");
ABSL_FLAG(absl::Duration, backoff_max, absl::Minutes(2), "longest retry delay");
ABSL_FLAG(std::string, request_default, "1Gi",
          "memory a claim consumes when it names no amount (Kubernetes quantity)");
ABSL_FLAG(std::string, request_min, "256Mi", "smallest memory a claim may consume");
ABSL_FLAG(std::string, request_step, "256Mi", "consumed memory is rounded up to min + n*step");

namespace gpumem {
namespace dra {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "gpumemd-dra: " << s.ToString() << std::endl;
  return 1;
}

absl::StatusOr<uint64_t> QuantityFlag(const char* name, const std::string& v) {
  absl::StatusOr<uint64_t> b = ParseQuantityBytes(v);
  if (!b.ok()) return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", b.status().message()));
  return b;
}

// A gRPC server on one Unix socket (a stale socket file is replaced). The
// socket is bound under a temporary name and renamed into place once it
// listens: the kubelet dials a registration socket as soon as inotify shows
// it, and a socket bound but not yet listening refuses connections.
absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(const std::string& path,
                                                    std::vector<grpc::Service*> services) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".new";
  unlink(tmp.c_str());
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + tmp, grpc::InsecureServerCredentials());
  for (grpc::Service* s : services) b.RegisterService(s);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server) return absl::UnavailableError(absl::StrCat("cannot listen on ", tmp));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ",
                                               std::strerror(errno)));
  }
  return server;
}

int Main() {
  const std::string driver = absl::GetFlag(FLAGS_driver_name);
  std::string node = absl::GetFlag(FLAGS_node_name);
  if (node.empty() && std::getenv("NODE_NAME") != nullptr) node = std::getenv("NODE_NAME");
  if (node.empty()) {
    return Fail(absl::InvalidArgumentError("no node name: set --node_name or $NODE_NAME "
                                           "(the DaemonSet sets it from spec.nodeName)"));
  }
  std::string plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  if (plugin_dir.empty()) plugin_dir = "/var/lib/kubelet/plugins/" + driver;
  std::string state_file = absl::GetFlag(FLAGS_state_file);
  if (state_file.empty()) state_file = plugin_dir + "/state.json";

  SliceConfig slice{driver, node};
  for (auto [flag, name, dst] :
       {std::tuple<absl::Flag<std::string>*, const char*, uint64_t*>{
            &FLAGS_request_default, "request_default", &slice.default_bytes},
        {&FLAGS_request_min, "request_min", &slice.min_bytes},
        {&FLAGS_request_step, "request_step", &slice.step_bytes}}) {
    absl::StatusOr<uint64_t> v = QuantityFlag(name, absl::GetFlag(*flag));
    if (!v.ok()) return Fail(v.status());
    *dst = *v;
  }
  if (absl::Status s = ValidateSliceConfig(slice); !s.ok()) return Fail(s);

  PreparerConfig pc;
  pc.driver = driver;
  pc.pool = node;
  pc.claims_dir = absl::GetFlag(FLAGS_claims_dir);
  pc.cdi.dir = absl::GetFlag(FLAGS_cdi_dir);
  pc.cdi.driver = driver;
  pc.cdi.container_socket = absl::GetFlag(FLAGS_container_socket);
  pc.gpumemd_timeout = absl::GetFlag(FLAGS_gpumemd_timeout);
  if (absl::Status s = ValidatePreparerConfig(pc); !s.ok()) return Fail(s);

  ApiServerConfig ac;
  if (!absl::GetFlag(FLAGS_api_server).empty()) {
    ac.url = absl::GetFlag(FLAGS_api_server);
  } else {
    absl::StatusOr<ApiServerConfig> in = InClusterConfig();
    if (!in.ok()) return Fail(in.status());
    ac = *in;
  }
  if (!absl::GetFlag(FLAGS_api_server_unix_socket).empty()) {
    ac.unix_socket = absl::GetFlag(FLAGS_api_server_unix_socket);
  }
  if (!absl::GetFlag(FLAGS_api_token_file).empty()) ac.token_file = absl::GetFlag(FLAGS_api_token_file);
  if (!absl::GetFlag(FLAGS_api_ca_file).empty()) ac.ca_file = absl::GetFlag(FLAGS_api_ca_file);
  ac.timeout = absl::GetFlag(FLAGS_api_timeout);

  std::error_code ec;
  std::filesystem::create_directories(plugin_dir, ec);
  std::filesystem::create_directories(pc.cdi.dir, ec);
  absl::StatusOr<std::unique_ptr<PluginState>> state = PluginState::Load(state_file);
  if (!state.ok()) return Fail(state.status());
  Log("state ", state_file, ": ", (*state)->All().size(), " claim(s) prepared before");

  // Signals go to the waiting main thread only.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      "unix:" + absl::GetFlag(FLAGS_gpumemd_socket), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::GpuMemory::Stub> gpumemd = v1::GpuMemory::NewStub(channel);
  ApiServer api(ac);
  ClaimPreparer preparer(pc, &api, gpumemd.get(), state->get());
  if (absl::Status closed = preparer.CloseClaimsDir(); !closed.ok()) {
    Log("warning: ", closed.message());
  }

  PublisherConfig pub;
  pub.slice = slice;
  pub.poll = absl::GetFlag(FLAGS_poll_interval);
  pub.resync = absl::GetFlag(FLAGS_resync_interval);
  pub.backoff_initial = absl::GetFlag(FLAGS_backoff_initial);
  pub.backoff_max = absl::GetFlag(FLAGS_backoff_max);
  pub.gpumemd_timeout = pc.gpumemd_timeout;
  SlicePublisher publisher(pub, &api, gpumemd.get(), state->get());

  const std::string dra_socket = plugin_dir + "/dra.sock";
  DraServiceV1 v1_service(&preparer);
  DraServiceV1beta1 v1beta1_service(&preparer);
  absl::StatusOr<std::unique_ptr<grpc::Server>> dra = Serve(dra_socket, {&v1_service, &v1beta1_service});
  if (!dra.ok()) return Fail(dra.status());
  publisher.Start();
  // Registration last: the kubelet calls the node service as soon as it
  // has read GetInfo.
  const std::string reg_socket = absl::GetFlag(FLAGS_registration_dir) + "/" + driver + "-reg.sock";
  RegistrationService registration(driver, dra_socket);
  absl::StatusOr<std::unique_ptr<grpc::Server>> reg = Serve(reg_socket, {&registration});
  if (!reg.ok()) return Fail(reg.status());
  Log("serving DRA driver ", driver, " for node ", node, ": registration ", reg_socket,
      ", node service ", dra_socket, ", gpumemd ", absl::GetFlag(FLAGS_gpumemd_socket),
      ", API server ", ac.url, ac.unix_socket.empty() ? "" : " via " + ac.unix_socket);

  int sig = 0;
  sigwait(&sigs, &sig);
  Log("signal ", sig, ": deregistering and stopping");
  unlink(reg_socket.c_str());
  (*reg)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*dra)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  publisher.Stop();
  unlink(dra_socket.c_str());
  return 0;
}

}  // namespace
}  // namespace dra
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Kubernetes DRA kubelet plugin for gpumemd memory (see deploy/README.md)");
  // --help lists this file's flags (Abseil's default looks for a file named
  // after the program).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/dra/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "gpumemd-dra: unexpected argument \"" << rest[1] << "\" (see --help)\n";
    return 2;
  }
  return gpumem::dra::Main();
}
