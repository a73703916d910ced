// A test client that sends --requests Allocate requests at once, each
// allowed to wait (--wait_ms), from as many threads over one connection,
// and reports each answer on a line of its own:
//   "sent N"          all requests are on their way
//   "alloc ID"        one was served (the block is kept until the process ends)
//   "error CODE MSG"  one was refused
// With --stream the requests go over one raw GpuMemory.Stream instead (ids
// 1..N, sent at once; answers reported as they come). Then it sleeps until
// it is killed. With --keeper it first forks a child
// that holds the process's connections open and prints "keeper PID": when
// this process is killed its calls are not cancelled (the sockets live on
// in the child), so only the daemon's session end can drop its waiters.
// The keeper lives until it is killed (at most 10 minutes).
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/lib/cpp/client.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(int, requests, 10, "requests sent at once");
ABSL_FLAG(uint64_t, size, 1 << 20, "bytes each");
ABSL_FLAG(uint32_t, wait_ms, 60000, "AllocateRequest.wait_ms");
ABSL_FLAG(bool, keeper, false, "fork a child that keeps the connections open");
ABSL_FLAG(bool, stream, false, "send the requests over one raw Stream");

namespace gpumem {
namespace {

std::mutex out_mu;
void Line(const std::string& s) {
  std::lock_guard<std::mutex> lock(out_mu);
  printf("%s\n", s.c_str());
  fflush(stdout);
}

void Answered(const absl::Status& s, uint64_t id) {
  if (s.ok()) {
    Line("alloc " + std::to_string(id));
  } else {
    Line("error " + std::to_string(static_cast<int>(s.code())) + " " + std::string(s.message()));
  }
}

// The requests over one stream of this process's connection; its session
// is the process's, as for the unary calls.
int StreamMain() {
  auto stub = v1::GpuMemory::NewStub(grpc::CreateChannel(
      "unix:" + absl::GetFlag(FLAGS_socket), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  const int n = absl::GetFlag(FLAGS_requests);
  for (int i = 1; i <= n; ++i) {
    v1::StreamRequest req;
    req.set_request_id(i);
    req.mutable_allocate()->set_size_bytes(absl::GetFlag(FLAGS_size));
    req.mutable_allocate()->set_wait_ms(absl::GetFlag(FLAGS_wait_ms));
    if (!stream->Write(req)) {
      Line("error stream " + stream->Finish().error_message());
      return 1;
    }
  }
  Line("sent " + std::to_string(n));
  v1::StreamReply reply;
  for (int i = 0; i < n && stream->Read(&reply); ++i) {
    const v1::StreamAnswer& a = reply.answer();
    if (a.status().code() != 0) {
      Answered(absl::Status(static_cast<absl::StatusCode>(a.status().code()),
                            a.status().message()),
               0);
    } else {
      Answered(absl::OkStatus(), a.allocate().allocations(0).id());
    }
  }
  for (;;) pause();  // the stream stays open: its blocks are kept
}

int Main() {
  if (absl::GetFlag(FLAGS_stream)) return StreamMain();
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) {
    Line("error " + std::to_string(static_cast<int>(c.status().code())) + " " +
         std::string(c.status().message()));
    return 1;
  }
  v1::AllocateRequest req;
  req.set_size_bytes(absl::GetFlag(FLAGS_size));
  req.set_wait_ms(absl::GetFlag(FLAGS_wait_ms));
  std::vector<std::thread> threads;
  for (int i = 0; i < absl::GetFlag(FLAGS_requests); ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<v1::AllocateResponse> r = (*c)->AllocateRaw(req);
      Answered(r.status(), r.ok() ? r->allocations(0).id() : 0);
    });
  }
  Line("sent " + std::to_string(threads.size()));
  if (absl::GetFlag(FLAGS_keeper)) {
    // A raw clone, not fork(): no atfork handler runs (gRPC's would shut
    // the child's copies of its sockets down).
    const pid_t keeper = static_cast<pid_t>(syscall(SYS_clone, SIGCHLD, nullptr, nullptr,
                                                    nullptr, nullptr));
    if (keeper == 0) {
      alarm(600);  // SIGALRM ends it should the test not
      for (;;) pause();
    }
    Line("keeper " + std::to_string(keeper));
  }
  for (auto& t : threads) t.join();
  for (;;) pause();
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Main();
}
