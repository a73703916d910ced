// test_client: a real client process for the multi-process tests.
//
// Modes (one per run):
//   --size=BYTES --count=N [--devices=0,1] --then=hold|exit|free
//       allocates N mapped buffers (round-robin over --devices), fills each
//       with the byte (id & 0xff), prints "alloc ID DEVICE SLAB OFFSET SIZE"
//       per buffer and "ready", then holds them until killed, exits without
//       freeing (_exit), or frees them and prints "freed".
//   --read_slab=ID --offset=O --expect=B
//       fetches a slab's fd over the slab channel, maps it and prints
//       "read ok" if the byte at O is B, else "read mismatch", or
//       "error CODE" if the daemon refused.
//   --free=ID   prints "status CODE" of Free(ID).
// Every line is flushed at once so the parent can follow along.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/fd_channel.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(uint64_t, size, 0, "bytes per buffer");
ABSL_FLAG(int, count, 1, "buffers");
ABSL_FLAG(std::string, devices, "", "comma-separated selectors, round-robin");
ABSL_FLAG(std::string, then, "hold", "hold | exit | free");
ABSL_FLAG(uint64_t, read_slab, 0, "slab to map and read");
ABSL_FLAG(uint64_t, offset, 0, "offset to read");
ABSL_FLAG(int, expect, 0, "expected byte");
ABSL_FLAG(uint64_t, free, 0, "allocation to free");

namespace gpumem {
namespace {

int Main() {
  const std::string socket = absl::GetFlag(FLAGS_socket);
  if (absl::GetFlag(FLAGS_read_slab) != 0) {
    absl::StatusOr<int> ch = ConnectFdChannel(socket);
    if (!ch.ok()) {
      printf("error %d\n", static_cast<int>(ch.status().code()));
      return 1;
    }
    absl::StatusOr<SlabFd> slab = RequestSlabFd(*ch, absl::GetFlag(FLAGS_read_slab));
    if (!slab.ok()) {
      printf("error %d\n", static_cast<int>(slab.status().code()));
      return 0;
    }
    void* base = mmap(nullptr, slab->size, PROT_READ, MAP_SHARED, slab->fd, 0);
    if (base == MAP_FAILED) {
      printf("error mmap\n");
      return 1;
    }
    unsigned char b = static_cast<unsigned char*>(base)[absl::GetFlag(FLAGS_offset)];
    printf(b == absl::GetFlag(FLAGS_expect) ? "read ok\n" : "read mismatch\n");
    return 0;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) {
    printf("error %d\n", static_cast<int>(client.status().code()));
    return 1;
  }
  if (absl::GetFlag(FLAGS_free) != 0) {
    absl::Status s = (*client)->Free(absl::GetFlag(FLAGS_free));
    printf("status %d\n", static_cast<int>(s.code()));
    fflush(stdout);
    return 0;
  }
  std::vector<std::string> devices;
  if (!absl::GetFlag(FLAGS_devices).empty()) {
    devices = absl::StrSplit(absl::GetFlag(FLAGS_devices), ',');
  }
  std::vector<Buffer> buffers;
  for (int i = 0; i < absl::GetFlag(FLAGS_count); ++i) {
    v1::PlacementRequest placement;
    if (!devices.empty()) placement.add_devices(devices[i % devices.size()]);
    absl::StatusOr<Buffer> b = (*client)->Allocate(absl::GetFlag(FLAGS_size), placement);
    if (!b.ok()) {
      printf("error %d %s\n", static_cast<int>(b.status().code()),
             std::string(b.status().message()).c_str());
      fflush(stdout);
      return 1;
    }
    memset(b->data(), static_cast<int>(b->id() & 0xff), b->size());
    printf("alloc %lu %u %lu %lu %lu\n", static_cast<unsigned long>(b->id()),
           b->device_index(), static_cast<unsigned long>(b->allocation().slab_id()),
           static_cast<unsigned long>(b->allocation().offset()),
           static_cast<unsigned long>(b->size()));
    buffers.push_back(std::move(*b));
  }
  printf("ready\n");
  fflush(stdout);
  const std::string then = absl::GetFlag(FLAGS_then);
  if (then == "exit") _exit(0);  // no destructors: the daemon must reclaim
  if (then == "free") {
    for (Buffer& b : buffers) {
      if (!b.Free().ok()) return 1;
    }
    printf("freed\n");
    fflush(stdout);
    return 0;
  }
  for (;;) pause();
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Main();
}
