// gpumemd_probe: asks a gpumemd over its Unix socket whether it serves, with
// the standard gRPC health service (grpc.health.v1.Health/Check), for
// Kubernetes exec probes and scripts. Exit status: 0 SERVING; 1 anything
// else (not serving, draining, unreachable, timed out), with one line on
// stderr saying which; 2 usage.
//
// It sends nothing but the health check and reads nothing else: safe to run
// every few seconds against a loaded daemon (the call is answered by gRPC's
// own health service, without the broker's lock).
#include <iostream>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/security/credentials.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "grpc/health/v1/health.pb.h"

ABSL_FLAG(std::string, socket, "",
          "gpumemd's socket (default $GPUMEMD_SOCKET, then /run/gpumemd/gpumemd.sock)");
ABSL_FLAG(int, timeout_ms, 3000, "give up after this long");
ABSL_FLAG(std::string, service, "",
          "service name to ask about (default \"\": the server as a whole)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gpumemd_probe [--socket=PATH] [--timeout_ms=3000]: exit 0 if gpumemd serves");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "gpumemd_probe: unexpected argument \"" << rest[1] << "\"\n";
    return 2;
  }
  std::string path = absl::GetFlag(FLAGS_socket);
  if (path.empty() && getenv("GPUMEMD_SOCKET") != nullptr) path = getenv("GPUMEMD_SOCKET");
  if (path.empty()) path = "/run/gpumemd/gpumemd.sock";

  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  // The generated stub's own call, without generating a stub for one method.
  const grpc::internal::RpcMethod check("/grpc.health.v1.Health/Check",
                                        grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status status = grpc::internal::BlockingUnaryCall(channel.get(), check, &ctx,
                                                          request, &response);
  if (!status.ok()) {
    std::cerr << "gpumemd_probe: " << path << ": " << status.error_message() << " (code "
              << status.error_code() << ")\n";
    return 1;
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    std::cerr << "gpumemd_probe: " << path << ": "
              << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
              << "\n";
    return 1;
  }
  std::cout << "SERVING\n";
  return 0;
}
