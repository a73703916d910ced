// stream_abuser: a client process that misuses GpuMemory.Stream, for
// stream_test.cc. It first allocates --hold_bytes through the client library
// (so its session holds memory), then, by --mode:
//   garbage            sends bytes that are no StreamRequest; prints the
//                      stream's final "status CODE MESSAGE"
//   reuse              sends an Allocate of 64 MiB on device 0 (a new slab:
//                      slow under --sim_slab_create_delay, so it is in
//                      flight on a backend worker) and then many requests,
//                      all with its request id 7, without reading; then
//                      reads; prints "status CODE MESSAGE"
//   stop_reading       sends Allocate requests (4 KiB) and never reads;
//                      prints "stalled" once its writes stop getting through
//   close_mid_request  as stop_reading, then, once --go_file exists,
//                      cancels the stream with answers still queued in the
//                      daemon; prints "cancelled"
//   slow_then_die      sends one Allocate of 64 MiB on device 0 (a new
//                      slab: slow under --sim_slab_create_delay) and prints
//                      "sent" without reading; the test then kills it
// and then prints "holding" and waits to be killed.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/lib/cpp/client.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

ABSL_FLAG(std::string, socket, "", "the daemon's socket");
ABSL_FLAG(std::string, mode, "",
          "garbage | reuse | stop_reading | close_mid_request | slow_then_die");
ABSL_FLAG(std::string, go_file, "", "close_mid_request: cancel once this file exists");
ABSL_FLAG(uint64_t, hold_bytes, 1 << 20, "bytes held through the client library");

namespace gpumem {
using client::Client;
namespace {

void Say(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
}

void SayStatus(const grpc::Status& s) {
  Say("status " + std::to_string(s.error_code()) + " " + s.error_message());
}

std::shared_ptr<grpc::Channel> Dial() {
  return grpc::CreateChannel("unix:" + absl::GetFlag(FLAGS_socket),
                             grpc::InsecureChannelCredentials());
}

void Garbage() {
  auto channel = Dial();
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> s(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(),
          grpc::internal::RpcMethod("/gpumem.v1.GpuMemory/Stream",
                                    grpc::internal::RpcMethod::BIDI_STREAMING),
          &ctx));
  // Field 2 (allocate), length 80, one byte of it: a truncated message.
  const char bytes[] = {0x12, 0x50, 0x01};
  grpc::Slice slice(bytes, sizeof(bytes));
  grpc::ByteBuffer buffer(&slice, 1);
  s->Write(buffer);
  s->WritesDone();
  grpc::ByteBuffer ignored;
  while (s->Read(&ignored)) {
  }
  SayStatus(s->Finish());
}

void Reuse() {
  auto stub = v1::GpuMemory::NewStub(Dial());
  grpc::ClientContext ctx;
  auto s = stub->Stream(&ctx);
  // The first id 7 is an Allocate that takes a slow slab creation (the
  // test's daemon delays device 0's): on a backend worker for 300 ms, in
  // flight however fast the other answers are written, so the next id 7 is
  // a reuse whatever the scheduling. The many after it pile answers up too
  // (the daemon's writes stall on flow control while none is read).
  std::atomic<bool> written{false};
  std::thread writer([&] {
    v1::StreamRequest slow;
    slow.set_request_id(7);
    slow.mutable_allocate()->set_size_bytes(64 << 20);
    slow.mutable_allocate()->mutable_placement()->add_devices("0");
    v1::StreamRequest r;
    r.set_request_id(7);
    r.mutable_get_session();
    if (s->Write(slow)) {
      for (int i = 0; i < 3000; ++i) {
        if (!s->Write(r)) break;
      }
    }
    s->WritesDone();
    written = true;
  });
  // No read until every request is written (or the daemon ended the
  // stream): reading earlier lets answers drain, and a slow client (TSan)
  // then never has id 7 twice in flight. A writer blocked by flow control
  // waits at most 10 s.
  for (int i = 0; i < 1000 && !written; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  v1::StreamReply reply;
  while (s->Read(&reply)) {
  }
  writer.join();
  SayStatus(s->Finish());
}

// Writes Allocate requests on a stream it never reads, until its writes
// stop getting through; prints "stalled".
void StallStream(grpc::ClientContext* ctx, v1::GpuMemory::Stub* stub, std::thread* writer,
                 std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamReply>>* s) {
  *s = stub->Stream(ctx);
  auto* stream = s->get();
  static std::atomic<uint64_t> written{0};  // read after this returns
  *writer = std::thread([stream] {
    v1::StreamRequest r;
    r.mutable_allocate()->set_size_bytes(4096);
    for (uint64_t id = 1; id <= 1000000; ++id) {
      r.set_request_id(id);
      if (!stream->Write(r)) return;
      written.store(id, std::memory_order_relaxed);
    }
  });
  // Stalled: no write got through for half a second.
  uint64_t last = ~0ull;
  while (written.load() != last) {
    last = written.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  Say("stalled");
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace gpumem;
  auto client = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) {
    Say("error " + client.status().ToString());
    return 1;
  }
  auto held = (*client)->Allocate(absl::GetFlag(FLAGS_hold_bytes));
  if (!held.ok()) {
    Say("error " + held.status().ToString());
    return 1;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  // Kept alive until the process is killed (their destructors would block).
  static grpc::ClientContext ctx;
  static std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamReply>> s;
  static std::thread writer;
  static std::unique_ptr<v1::GpuMemory::Stub> stub = v1::GpuMemory::NewStub(Dial());
  if (mode == "garbage") {
    Garbage();
  } else if (mode == "reuse") {
    Reuse();
  } else if (mode == "slow_then_die") {
    s = stub->Stream(&ctx);
    v1::StreamRequest r;
    r.set_request_id(1);
    r.mutable_allocate()->set_size_bytes(64 << 20);
    r.mutable_allocate()->mutable_placement()->add_devices("0");
    if (!s->Write(r)) {
      Say("error write");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // on the wire
    Say("sent");
  } else if (mode == "stop_reading" || mode == "close_mid_request") {
    StallStream(&ctx, stub.get(), &writer, &s);
    if (mode == "close_mid_request") {
      while (access(absl::GetFlag(FLAGS_go_file).c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ctx.TryCancel();
      Say("cancelled");
    }
  } else {
    Say("error unknown --mode");
    return 2;
  }
  Say("holding");
  for (;;) pause();
}
