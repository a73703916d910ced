// reflection_probe --socket=PATH [--hold_ms=N]: opens one server reflection
// stream (grpc.reflection.v1, what grpcurl asks), sends list_services and
// prints one line: "listed" when the answer names gpumem.v1.GpuMemory, else
// "ended CODE MESSAGE" with the status the daemon ended the stream with.
// With --hold_ms, a listed stream is then held open (no request) for that
// long and the probe prints "held" or "ended CODE MESSAGE" if the daemon
// closed it first. Run by tests as other uids.
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"

ABSL_FLAG(std::string, socket, "", "the daemon's socket");
ABSL_FLAG(int, hold_ms, 0, "hold a listed stream open this long");

namespace {

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto channel = grpc::CreateChannel("unix:" + absl::GetFlag(FLAGS_socket),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok = false;
  auto next = [&](int ms) {
    return cq.AsyncNext(&tag, &ok, In(ms)) == grpc::CompletionQueue::GOT_EVENT && ok;
  };
  auto ended = [&] {
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(9));
    if (cq.AsyncNext(&tag, &ok, In(30000)) != grpc::CompletionQueue::GOT_EVENT) {
      std::cout << "ended ? no status within 30 s" << std::endl;
    } else {
      std::cout << "ended " << status.error_code() << " " << status.error_message() << std::endl;
    }
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool listed = false;
  if (next(30000)) {
    // list_services = "*" (field 7), as bytes: tag 0x3a, length 1, '*'.
    grpc::Slice request_slice(std::string("\x3a\x01*", 3));
    grpc::ByteBuffer request(&request_slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    grpc::ByteBuffer reply;
    call->Read(&reply, reinterpret_cast<void*>(3));
    bool wrote = next(30000);
    bool read = wrote && next(30000);
    std::vector<grpc::Slice> slices;
    if (read && reply.Dump(&slices).ok()) {
      std::string bytes;
      for (const grpc::Slice& sl : slices) {
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      listed = bytes.find("gpumem.v1.GpuMemory") != std::string::npos;
    }
  }
  if (!listed) {
    ended();
  } else {
    std::cout << "listed" << std::endl;
    const int hold = absl::GetFlag(FLAGS_hold_ms);
    if (hold > 0) {
      grpc::ByteBuffer more;
      call->Read(&more, reinterpret_cast<void*>(4));
      if (cq.AsyncNext(&tag, &ok, In(hold)) == grpc::CompletionQueue::TIMEOUT) {
        std::cout << "held" << std::endl;
      } else {
        ended();
      }
    }
  }
  ctx.TryCancel();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return 0;
}
