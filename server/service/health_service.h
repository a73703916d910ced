// HealthService: the standard grpc.health.v1.Health service, served by the
// daemon itself.
//
// Why not grpc::EnableDefaultHealthCheckService: in gRPC 1.51 on Linux the
// default implementation uses the callback API, which starts a pool of
// "nexting" threads that poll every connection of the server, so every
// call of the daemon passes through extra threads (tests/bench/RESULTS.md,
// "Hot path", has what it cost).
//
// What it answers:
//  - Check: SERVING for "" (the whole daemon) and "gpumem.v1.GpuMemory"
//    while serving, NOT_SERVING once SetNotServing() was called, NOT_FOUND
//    for any other service name.
//  - Watch: the same status once (SERVICE_UNKNOWN for other names, as the
//    protocol says), then the stream stays open until the client leaves or
//    the daemon stops. Served asynchronously from a completion queue the
//    daemon already drains (StreamService's), so open watches hold no
//    thread each and the health service adds no thread at all.
#ifndef GPUMEMD_SERVER_SERVICE_HEALTH_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_HEALTH_SERVICE_H_

#include <atomic>
#include <string>

#include <grpcpp/server_builder.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/service/cq_event.h"

namespace gpumem {

class HealthService final
    : public grpc::health::v1::Health::WithAsyncMethod_Watch<
          grpc::health::v1::Health::Service> {
 public:
  HealthService() = default;

  grpc::Status Check(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

  // After the server started: accepts Watch calls on `queue`, whose thread
  // hands each tag to CqEvent::OnEvent (cq_event.h) and which is drained
  // after grpc::Server::Shutdown().
  void Start(EventQueue* queue);
  // Check answers NOT_SERVING from now on (the daemon is stopping).
  void SetNotServing() { serving_.store(false, std::memory_order_relaxed); }

  class WatchCall;  // health_service.cc

  // The status reported for `service` now.
  grpc::health::v1::HealthCheckResponse::ServingStatus StatusOf(
      const std::string& service) const;

 private:
  std::atomic<bool> serving_{true};
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_HEALTH_SERVICE_H_
