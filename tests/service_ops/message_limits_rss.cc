// What memory a caller can still make the daemon take with large requests,
// now that each method has its limit (server/service/message_limits.h):
// starts gpumemd (//server:gpumemd, --sim_devices=2x1GiB, no ledger) and,
// one attack at a time, keeps `--connections` connections each with
// `--calls` calls in flight for `--seconds`, every request as large as the
// method lets through, and prints the daemon's RSS before, at its peak
// during, and 2 s after, with the calls answered and their statuses:
//  - getstats_junk: GetStats padded with unknown fields to just under
//    max_receive_message_size (each parsed, then refused by its 4 KiB limit);
//  - getstats_fit: GetStats padded to its own limit (served);
//  - allocate_fit: Allocate padded to its 64 KiB limit (served, refused for
//    its size only past it);
//  - resume_max: Resume of as many blocks as fit in max_receive_message_size
//    (refused past Resume's 256 KiB limit, or, before it, each answered
//    "lost" by the query workers);
//  - resume_page: Resume of 1,000 blocks, the client library's page
//    (answered by the query workers, within each caller's query budget).
// Run by hand (not a test; the figures are this machine's), beside an
// earlier build with --daemon=PATH:
//   bazel run -c opt //tests/service_ops:message_limits_rss -- --connections=16 --calls=100
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "tests/integration/daemon_fixture.h"

ABSL_FLAG(int, connections, 16, "connections, each its own HTTP/2 connection");
ABSL_FLAG(int, calls, 100, "calls in flight per connection");
ABSL_FLAG(double, seconds, 5, "how long each attack lasts");
ABSL_FLAG(std::string, attacks, "getstats_junk,getstats_fit,allocate_fit,resume_max,resume_page",
          "which attacks, in order");
ABSL_FLAG(int64_t, max_receive, 1 << 20, "the daemon's --max_receive_message_size");
ABSL_FLAG(std::string, daemon, "", "another gpumemd binary than this build's (a baseline)");

namespace gpumem {
namespace {

using testing::DaemonProcess;
using testing::RssKiB;

std::string Junk(google::protobuf::Message* m, size_t total) {
  std::string bytes = m->SerializeAsString();
  const size_t pad = total > bytes.size() + 8 ? total - bytes.size() - 8 : 0;
  m->GetReflection()->MutableUnknownFields(m)->AddLengthDelimited(1000, std::string(pad, 'x'));
  return m->SerializeAsString();
}

std::string Request(const std::string& attack, int64_t max_receive) {
  if (attack == "getstats_junk") {
    v1::GetStatsRequest r;
    return Junk(&r, static_cast<size_t>(max_receive) - 64);
  }
  if (attack == "getstats_fit") {
    v1::GetStatsRequest r;
    return Junk(&r, 4000);
  }
  if (attack == "allocate_fit") {
    v1::AllocateRequest r;
    r.set_size_bytes(4096);
    return Junk(&r, 65000);
  }
  v1::ResumeRequest r;  // resume_max, resume_page
  for (uint64_t i = 0; attack != "resume_page" || i < 1000; ++i) {
    v1::Allocation* a = r.add_allocations();
    a->set_id(1000000 + i);
    a->set_device_uuid("GPU-00000000-0000-4000-8000-000000000000");
    a->set_slab_id(77);
    a->set_offset(i << 20);
    a->set_size_bytes(1 << 20);
    if (r.ByteSizeLong() > static_cast<size_t>(max_receive) - 256) {
      r.mutable_allocations()->RemoveLast();
      break;
    }
  }
  return r.SerializeAsString();
}

std::string Method(const std::string& attack) {
  if (attack == "allocate_fit") return "/gpumem.v1.GpuMemory/Allocate";
  if (attack == "resume_max" || attack == "resume_page") return "/gpumem.v1.GpuMemory/Resume";
  return "/gpumem.v1.GpuMemory/GetStats";
}

struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer reply;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc;
  int conn = 0;
};

void Attack(const std::string& socket, pid_t daemon, const std::string& attack) {
  const std::string body = Request(attack, absl::GetFlag(FLAGS_max_receive));
  const std::string method = Method(attack);
  const int conns = absl::GetFlag(FLAGS_connections), per = absl::GetFlag(FLAGS_calls);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int c = 0; c < conns; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("gpumem.rss.channel", c);  // no two share a connection
    args.SetMaxSendMessageSize(-1);
    stubs.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args)));
  }
  grpc::CompletionQueue cq;
  const grpc::Slice slice(body);
  const grpc::ByteBuffer request(&slice, 1);
  auto start = [&](int c) {
    auto* call = new Call;
    call->conn = c;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    call->rpc = stubs[c]->PrepareUnaryCall(&call->ctx, method, request, &cq);
    call->rpc->StartCall();
    call->rpc->Finish(&call->reply, &call->status, call);
  };
  const int64_t before = RssKiB(daemon);
  std::atomic<int64_t> peak{before};
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling.load()) {
      const int64_t r = RssKiB(daemon);
      if (r > peak.load()) peak.store(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  for (int c = 0; c < conns; ++c) {
    for (int k = 0; k < per; ++k) start(c);
  }
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_seconds) * 1000));
  std::map<std::string, int64_t> outcomes;
  int64_t answered = 0;
  int in_flight = conns * per;
  while (in_flight > 0) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    auto* call = static_cast<Call*>(tag);
    --in_flight;
    ++answered;
    std::string what = call->status.ok() ? "OK" : absl::StrCat("code ", call->status.error_code());
    if (!call->status.ok()) {
      absl::StrAppend(&what, " ", call->status.error_message().substr(0, 60));
    }
    ++outcomes[what];
    const int c = call->conn;
    delete call;
    if (std::chrono::steady_clock::now() < until) {
      start(c);
      ++in_flight;
    }
  }
  // Its connections closed, then 2 s.
  stubs.clear();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  sampling.store(false);
  sampler.join();
  const int64_t after = RssKiB(daemon);
  std::printf("%-14s request %7zu B  %3d conns x %3d in flight  answered %7lld  RSS KiB before %7lld"
              "  peak %8lld  after %7lld\n",
              attack.c_str(), body.size(), conns, per, static_cast<long long>(answered),
              static_cast<long long>(before), static_cast<long long>(peak.load()),
              static_cast<long long>(after));
  for (const auto& [what, n] : outcomes) {
    std::printf("    %7lld  %s\n", static_cast<long long>(n), what.c_str());
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  gpumem::testing::DaemonProcess daemon(
      {"--sim_devices=2x1GiB", "--ledger=none", "--state=none",
       absl::StrCat("--max_receive_message_size=", absl::GetFlag(FLAGS_max_receive))});
  if (!absl::GetFlag(FLAGS_daemon).empty()) daemon.SetBinary(absl::GetFlag(FLAGS_daemon));
  if (!daemon.Start()) {
    std::fprintf(stderr, "gpumemd did not start:\n%s\n", daemon.Log().c_str());
    return 1;
  }
  const std::vector<std::string> attacks =
      absl::StrSplit(absl::GetFlag(FLAGS_attacks), ',', absl::SkipEmpty());
  for (const std::string& attack : attacks) {
    gpumem::Attack(daemon.socket(), daemon.pid(), attack);
  }
  return daemon.Stop() == 0 ? 0 : 1;
}
