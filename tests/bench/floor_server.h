// FloorServer: the gRPC floor that load_bench compares gpumemd with.
//
// It serves gpumem.v1.GpuMemory on a Unix socket with the daemon's message
// shapes but no work behind them: Allocate answers one canned Allocation
// (same fields as the daemon's), Free answers freed_bytes, GetSession a
// canned Session, and Stream answers each StreamRequest with the same canned
// StreamAnswer. So the same client code times the floor and the daemon, and
// what differs is only what gpumemd adds.
//
// Shapes, chosen per instance so their costs can be told apart in one run:
//  - unary methods: synchronous (gRPC's thread pool), as gpumemd serves them,
//    or Allocate and Free asynchronous on the stream's completion queue;
//  - Stream: raw and async, one completion queue drained by one thread, as
//    gpumemd serves it (ping-pong: one answer per request read);
//  - connections: from gRPC's own listening port ("unix:PATH"), or accepted
//    by the server itself and handed over with AddInsecureChannelFromFd, the
//    way gpumemd's SocketListener does.
#ifndef GPUMEMD_TESTS_BENCH_FLOOR_SERVER_H_
#define GPUMEMD_TESTS_BENCH_FLOOR_SERVER_H_

#include <string>

namespace gpumem {
namespace bench {

enum class FloorAccept { kGrpcPort, kOwnAccept };
enum class FloorUnary { kSync, kAsync };

// Serves on `socket_path` until SIGTERM/SIGINT; prints "ready" on stdout
// once connections are accepted. Returns the exit status.
int RunFloorServer(const std::string& socket_path, FloorAccept accept, FloorUnary unary);

}  // namespace bench
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_BENCH_FLOOR_SERVER_H_
