// planted_race_server: a test-only program whose unary gRPC handler races on
// purpose, so tsan_suppressions_test can show that ThreadSanitizer, with the
// project's compiled-in suppressions (common/tsan_support.cc), still reports a
// race reached from an RPC handler.
//
// It starts a gRPC server (grpc.health.v1.Health, on a Unix socket) and makes
// two concurrent Check calls from two client threads. The synchronous handler
// (race, locked) runs under grpc::internal::RpcMethodHandler::RunHandler on a
// gRPC server thread, and the client under grpc::internal::BlockingUnaryCall: the frames that a
// namespace-wide `race:grpc::internal::` suppression matched.
//
//   --mode=race    each call waits until both are inside the handler (a
//                  barrier of relaxed atomics, which gives TSan no
//                  happens-before edge) and then writes one unsynchronized
//                  global in PlantedRaceWrite: a data race TSan must report.
//   --mode=locked  the same, with the write under an absl::Mutex: the control,
//                  where TSan must report nothing (no false positive from
//                  gRPC itself once the namespace suppression is gone).
//   --mode=async_race  the daemon's way (server/service/gpumem_service.cc):
//                  an async Check on each of two completion queues, each
//                  drained by its own thread, the same barrier, then an
//                  unsynchronized write in PlantedAsyncRaceWrite: the
//                  completion-queue annotations of tsan_support must not
//                  order two handlers, so TSan must report it.
//
// Prints "answered 2 calls" and exits 0 when both calls succeeded (TSan, if
// it reported something, makes the exit code its own: exitcode=66).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <stdlib.h>
#include <unistd.h>

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

__attribute__((noinline)) void PlantedAsyncRaceWrite(long v) { planted_global = v; }

__attribute__((noinline)) void LockedWrite(long v) {
  absl::MutexLock lock(&planted_mu);
  planted_global = v;
}

// Both calls inside before either writes, so they are on two threads.
bool BothInside() {
  inside.fetch_add(1, std::memory_order_relaxed);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (inside.load(std::memory_order_relaxed) < 2) {
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

grpc::Status NeverBoth() {
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "the second call never reached the handler");
}

class RacyHealth final : public Health::Service {
 public:
  explicit RacyHealth(bool locked) : locked_(locked) {}

  grpc::Status Check(grpc::ServerContext*, const HealthCheckRequest* request,
                     HealthCheckResponse* response) override {
    if (!BothInside()) return NeverBoth();
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

// One async Check served on `cq` by the calling thread: accept, handle,
// finish, as the daemon's UnaryCall does.
void ServeOneAsync(Health::AsyncService* service, grpc::ServerCompletionQueue* cq) {
  grpc::ServerContext ctx;
  HealthCheckRequest request;
  grpc::ServerAsyncResponseWriter<HealthCheckResponse> writer(&ctx);
  int accept_tag = 0, finish_tag = 0;
  service->RequestCheck(&ctx, &request, &writer, cq, cq, &accept_tag);
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
    if (tag == &accept_tag && ok) {
      HealthCheckResponse response;
      grpc::Status status = NeverBoth();
      if (BothInside()) {
        PlantedAsyncRaceWrite(static_cast<long>(request.service().size()));
        response.set_status(HealthCheckResponse::SERVING);
        status = grpc::Status::OK;
      }
      writer.Finish(response, status, &finish_tag);
    } else if (tag == &finish_tag || (tag == &accept_tag && !ok)) {
      break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool locked = false;
  bool async = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mode=race") == 0) {
      locked = false;
    } else if (std::strcmp(argv[i], "--mode=locked") == 0) {
      locked = true;
    } else if (std::strcmp(argv[i], "--mode=async_race") == 0) {
      async = true;
    } else {
      std::fprintf(stderr, "usage: %s [--mode=race|--mode=locked|--mode=async_race]\n",
                   argv[0]);
      return 2;
    }
  }
  RacyHealth sync_service(locked);
  Health::AsyncService async_service;
  // Over a Unix socket, as the daemon serves (gRPC's in-process transport
  // completes some operations on the starting thread, under locks TSan sees).
  char dir[] = "/tmp/planted-race-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string socket_path = std::string(dir) + "/grpc.sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  std::unique_ptr<grpc::ServerCompletionQueue> cqs[2];
  if (async) {
    builder.RegisterService(&async_service);
    for (auto& cq : cqs) cq = builder.AddCompletionQueue();
  } else {
    builder.RegisterService(&sync_service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "the server did not start\n");
    return 1;
  }
  std::thread queue_threads[2];
  if (async) {
    for (int i = 0; i < 2; ++i) {
      queue_threads[i] = std::thread(ServeOneAsync, &async_service, cqs[i].get());
    }
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
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
  if (async) {
    for (int i = 0; i < 2; ++i) {
      queue_threads[i].join();
      cqs[i]->Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (cqs[i]->Next(&tag, &ok)) {
      }
    }
  }
  unlink(socket_path.c_str());
  rmdir(dir);
  std::printf("answered %d calls (last write %ld)\n", answered.load(), planted_global);
  return answered.load() == 2 ? 0 : 1;
}
