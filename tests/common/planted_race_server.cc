// planted_race_server: a test-only program whose unary gRPC handler races on
// purpose, so tsan_suppressions_test can show that ThreadSanitizer, with the
// project's compiled-in suppressions (common/tsan_support.cc), still reports a
// race reached from an RPC handler.
//
// It starts a synchronous gRPC server (grpc.health.v1.Health, in process) and
// makes two concurrent Check calls from two client threads. The handler runs
// under grpc::internal::RpcMethodHandler::RunHandler on a gRPC server thread,
// and the client under grpc::internal::BlockingUnaryCall: the frames that a
// namespace-wide `race:grpc::internal::` suppression matched.
//
//   --mode=race    each call waits until both are inside the handler (a
//                  barrier of relaxed atomics, which gives TSan no
//                  happens-before edge) and then writes one unsynchronized
//                  global in PlantedRaceWrite: a data race TSan must report.
//   --mode=locked  the same, with the write under an absl::Mutex: the control,
//                  where TSan must report nothing (no false positive from
//                  gRPC itself once the namespace suppression is gone).
//
// Prints "answered 2 calls" and exits 0 when both calls succeeded (TSan, if
// it reported something, makes the exit code its own: exitcode=66).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"

// The raced-on variable (external linkage, and printed at the end, so the
// compiler keeps every store).
long planted_global = 0;

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

std::atomic<int> inside{0};  // relaxed only: no happens-before between calls
absl::Mutex planted_mu;

// Named so the test can find it in TSan's report.
__attribute__((noinline)) void PlantedRaceWrite(long v) { planted_global = v; }

__attribute__((noinline)) void LockedWrite(long v) {
  absl::MutexLock lock(&planted_mu);
  planted_global = v;
}

class RacyHealth final : public Health::Service {
 public:
  explicit RacyHealth(bool locked) : locked_(locked) {}

  grpc::Status Check(grpc::ServerContext*, const HealthCheckRequest* request,
                     HealthCheckResponse* response) override {
    // Both calls inside before either writes, so they are on two threads.
    inside.fetch_add(1, std::memory_order_relaxed);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (inside.load(std::memory_order_relaxed) < 2) {
      if (absl::Now() > deadline) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "the second call never reached the handler");
      }
      std::this_thread::yield();
    }
    const long v = static_cast<long>(request->service().size());
    if (locked_) {
      LockedWrite(v);
    } else {
      PlantedRaceWrite(v);
    }
    response->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }

 private:
  const bool locked_;
};

}  // namespace

int main(int argc, char** argv) {
  bool locked = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mode=race") == 0) {
      locked = false;
    } else if (std::strcmp(argv[i], "--mode=locked") == 0) {
      locked = true;
    } else {
      std::fprintf(stderr, "usage: %s [--mode=race|--mode=locked]\n", argv[0]);
      return 2;
    }
  }
  RacyHealth service(locked);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "the server did not start\n");
    return 1;
  }
  std::shared_ptr<grpc::Channel> channel = server->InProcessChannel(grpc::ChannelArguments());
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel);

  std::atomic<int> answered{0};
  auto call = [&](const char* name) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    HealthCheckRequest request;
    request.set_service(name);
    HealthCheckResponse response;
    const grpc::Status s = stub->Check(&ctx, request, &response);
    if (s.ok()) {
      answered.fetch_add(1);
    } else {
      std::fprintf(stderr, "Check(%s) failed: %s\n", name, s.error_message().c_str());
    }
  };
  std::thread a(call, "a");
  std::thread b(call, "bb");
  a.join();
  b.join();
  server->Shutdown();
  std::printf("answered %d calls (last write %ld)\n", answered.load(), planted_global);
  return answered.load() == 2 ? 0 : 1;
}
