// cuda_share_client: one side of a two-process slab share, through the same
// code paths as the client library, for the fake driver in CI and for a real
// GPU (tests/gpu/run).
//
//   write --socket=S --size=N --device=SEL [--kind=vmm|ipc] [--seed=K]
//       allocates N bytes on SEL through gpumem::Client (which opens the slab
//       with its mapper), writes the pattern of seed K with Buffer::Write
//       (cuMemcpyHtoD on cuda), prints "alloc HEX" (the Allocation, protobuf
//       bytes in hex) and "ready", then holds the memory until killed.
//   read --socket=S --alloc=HEX [--seed=K]
//       opens the allocation's slab with a SlabMapper of its handle kind (fd
//       from the daemon's slab channel, or the legacy IPC bytes), reads the
//       block with OpenedSlab::Read (cuMemcpyDtoH on cuda) and prints
//       "read ok" or "read mismatch at OFFSET"; "error STATUS" on failure.
// Exit status 0 only when the step checked out. Lines are flushed at once.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "client/lib/cpp/client.h"
#include "client/lib/slabs/slab_mapper.h"
#include "common/fd_channel.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(uint64_t, size, 1 << 20, "bytes to allocate (write)");
ABSL_FLAG(std::string, device, "0", "device selector (write)");
ABSL_FLAG(std::string, kind, "vmm", "vmm | ipc (write)");
ABSL_FLAG(std::string, alloc, "", "the writer's allocation, hex (read)");
ABSL_FLAG(int, seed, 1, "pattern seed");

namespace gpumem {
using client::Client;
using client::Buffer;
using client::OpenedSlab;
using client::SlabMapper;
using client::NewSlabMapper;
namespace {

unsigned char PatternAt(int seed, uint64_t i) {
  return static_cast<unsigned char>((seed * 131 + i * 7 + (i >> 12)) & 0xff);
}

int Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return 0;
}

int Fail(const absl::Status& s) {
  Say("error " + s.ToString());
  return 1;
}

int Write() {
  auto client = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Fail(client.status());
  (*client)->SetHandleKind(absl::GetFlag(FLAGS_kind) == "ipc" ? v1::HANDLE_KIND_CUDA_IPC
                                                               : v1::HANDLE_KIND_UNSPECIFIED);
  v1::PlacementRequest where;
  where.add_devices(absl::GetFlag(FLAGS_device));
  absl::StatusOr<Buffer> b = (*client)->Allocate(absl::GetFlag(FLAGS_size), where);
  if (!b.ok()) return Fail(b.status());
  std::vector<unsigned char> host(b->size());
  for (uint64_t i = 0; i < host.size(); ++i) host[i] = PatternAt(absl::GetFlag(FLAGS_seed), i);
  absl::Status s = b->Write(0, host.data(), host.size());
  if (!s.ok()) return Fail(s);
  Say("alloc " + absl::BytesToHexString(b->allocation().SerializeAsString()));
  Say("ready");
  for (;;) pause();
}

int Read() {
  v1::Allocation a;
  if (!a.ParseFromString(absl::HexStringToBytes(absl::GetFlag(FLAGS_alloc)))) {
    return Fail(absl::InvalidArgumentError("--alloc is not an Allocation in hex"));
  }
  absl::StatusOr<std::unique_ptr<SlabMapper>> mapper = NewSlabMapper(a.handle_kind());
  if (!mapper.ok()) return Fail(mapper.status());
  const std::string socket = absl::GetFlag(FLAGS_socket);
  int channel = -1;
  auto fetch_fd = [&]() -> absl::StatusOr<SlabFd> {
    absl::StatusOr<int> fd = ConnectFdChannel(socket);
    if (!fd.ok()) return fd.status();
    channel = *fd;
    return RequestSlabFd(channel, a.slab_id());
  };
  absl::StatusOr<std::unique_ptr<OpenedSlab>> slab = (*mapper)->Open(a, fetch_fd);
  if (channel >= 0) close(channel);
  if (!slab.ok()) return Fail(slab.status());
  std::vector<unsigned char> host(a.size_bytes());
  absl::Status s = (*slab)->Read(a.offset(), host.data(), host.size());
  if (!s.ok()) return Fail(s);
  for (uint64_t i = 0; i < host.size(); ++i) {
    if (host[i] != PatternAt(absl::GetFlag(FLAGS_seed), i)) {
      Say("read mismatch at " + std::to_string(i));
      return 1;
    }
  }
  return Say("read ok");
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::string mode = rest.size() > 1 ? rest[1] : "";
  if (mode == "write") return gpumem::Write();
  if (mode == "read") return gpumem::Read();
  std::fprintf(stderr, "usage: cuda_share_client write|read --socket=S ...\n");
  return 2;
}
