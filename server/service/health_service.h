// HealthService: the standard grpc.health.v1.Health service, served by the
// daemon itself rather than by grpc::EnableDefaultHealthCheckService, whose
// Linux implementation uses the callback API: that starts a pool of
// "nexting" threads that poll every connection of the server, so every call
// of the daemon would pass through extra threads.
//
// Invariants: the health service adds no thread at all (Watch is served
// asynchronously from a completion queue the daemon already drains,
// StreamService's, so open watches hold no thread each; a change reaches
// them through an alarm on that queue); once SetNotServing() was called it
// never says SERVING again.
#ifndef GPUMEMD_SERVER_SERVICE_HEALTH_SERVICE_H_
#define GPUMEMD_SERVER_SERVICE_HEALTH_SERVICE_H_

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/alarm.h>
#include <grpcpp/server_builder.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/service/cq_event.h"

namespace gpumem {

class HealthService final
    : public grpc::health::v1::Health::WithAsyncMethod_Watch<
          grpc::health::v1::Health::Service> {
 public:
  HealthService() = default;

  // SERVING for "" (the whole daemon) and "gpumem.v1.GpuMemory" while
  // serving, NOT_SERVING once SetNotServing() was called, NOT_FOUND for any
  // other service name.
  grpc::Status Check(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

  // Watch answers the same status at once (SERVICE_UNKNOWN for other names,
  // as the protocol says), then again whenever it changes (NOT_SERVING once
  // a drain has begun); the stream stays open until the client leaves or
  // the daemon stops.
  // After the server started: accepts Watch calls on `queue`, whose thread
  // hands each tag to CqEvent::OnEvent (cq_event.h) and which is drained
  // after grpc::Server::Shutdown().
  void Start(EventQueue* queue);
  // Check answers NOT_SERVING from now on (the daemon is stopping), and
  // open watches are sent it. Before the queue is shut down.
  void SetNotServing();

  class WatchCall;  // health_service.cc

  // The status reported for `service` now.
  grpc::health::v1::HealthCheckResponse::ServingStatus StatusOf(
      const std::string& service) const;

 private:
  // The alarm's event: on the queue's thread, every open watch sends its
  // status if it changed.
  struct Changed final : CqEvent {
    explicit Changed(HealthService* s) : service(s) {}
    void OnEvent(bool ok) override;
    HealthService* const service;
  };

  std::atomic<bool> serving_{true};
  EventQueue* queue_ = nullptr;  // set by Start, before any call
  // Made and set once, by the first SetNotServing (not before: a gRPC
  // alarm that merely exists changes how gRPC's timer threads come and go).
  std::unique_ptr<grpc::Alarm> changed_alarm_;
  Changed changed_{this};
  // Watches accepted and not yet deleted: the queue's thread only.
  std::set<WatchCall*> open_;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_HEALTH_SERVICE_H_
