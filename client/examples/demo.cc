// gpumem_demo: a short client run against a live daemon.
//
// Allocates one buffer on device 0 and one on device 1, writes a pattern
// into each (Buffer::Write: memcpy on sim, cuMemcpyHtoD on cuda), reads it
// back, prints the daemon's
// view (GetStats) while the buffers are live, frees them and prints the
// view again. Exit status 0 only if every step checked out.
#include <cstring>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/lib/cpp/client.h"
#include "common/byte_size.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(std::string, size, "64MiB", "bytes per buffer");

namespace gpumem {
namespace client {
namespace {

void PrintDevices(const v1::GetStatsResponse& stats) {
  for (const v1::DeviceStats& d : stats.devices()) {
    std::cout << absl::StrFormat("  device %d %s: used %s of %s, %d allocation(s), %d slab(s)\n",
                                 d.index(), d.uuid(), FormatBytes(d.used_bytes()),
                                 FormatBytes(d.total_bytes()), d.allocation_count(),
                                 d.slab_count());
  }
}

int Run() {
  absl::StatusOr<uint64_t> size = ParseByteSize(absl::GetFlag(FLAGS_size));
  if (!size.ok()) {
    std::cerr << size.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) {
    std::cerr << "demo: " << client.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<v1::Session> session = (*client)->GetSession();
  if (session.ok()) {
    std::cout << absl::StrFormat("demo: session %d (pid %d, uid %d, as the kernel says)\n",
                                 session->session_id(), session->pid(), session->uid());
  }
  std::vector<Buffer> buffers;
  for (const char* device : {"0", "1"}) {
    v1::PlacementRequest placement;
    placement.add_devices(device);
    absl::StatusOr<Buffer> b = (*client)->Allocate(*size, placement);
    if (!b.ok()) {
      std::cerr << "demo: allocate on device " << device << ": " << b.status() << "\n";
      return 1;
    }
    std::cout << absl::StrFormat("demo: allocation %d: %s on device %d (%s), slab %d offset %d\n",
                                 b->id(), FormatBytes(b->size()), b->device_index(),
                                 b->device_uuid(), b->allocation().slab_id(),
                                 b->allocation().offset());
    buffers.push_back(std::move(*b));
  }
  // Through Buffer::Write/Read: memcpy on sim, cuMemcpyHtoD/DtoH on cuda
  // (where data() is a device pointer).
  for (size_t i = 0; i < buffers.size(); ++i) {
    std::vector<unsigned char> host(buffers[i].size());
    for (uint64_t j = 0; j < host.size(); j += 4096) host[j] = static_cast<unsigned char>(i * 31 + j / 4096);
    absl::Status s = buffers[i].Write(0, host.data(), host.size());
    if (!s.ok()) {
      std::cerr << "demo: write buffer " << i << ": " << s << "\n";
      return 1;
    }
  }
  uint64_t checked = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    std::vector<unsigned char> host(buffers[i].size());
    absl::Status s = buffers[i].Read(0, host.data(), host.size());
    if (!s.ok()) {
      std::cerr << "demo: read buffer " << i << ": " << s << "\n";
      return 1;
    }
    for (uint64_t j = 0; j < host.size(); j += 4096, ++checked) {
      if (host[j] != static_cast<unsigned char>(i * 31 + j / 4096)) {
        std::cerr << "demo: read back the wrong byte at buffer " << i << " offset " << j << "\n";
        return 1;
      }
    }
  }
  std::cout << "demo: wrote and read back " << checked << " pages across 2 devices: ok\n";
  absl::StatusOr<v1::GetStatsResponse> stats = (*client)->GetStats();
  if (!stats.ok()) return 1;
  std::cout << "demo: stats while holding the buffers:\n";
  PrintDevices(*stats);
  for (Buffer& b : buffers) {
    absl::Status s = b.Free();
    if (!s.ok()) {
      std::cerr << "demo: free: " << s << "\n";
      return 1;
    }
  }
  stats = (*client)->GetStats();
  if (!stats.ok()) return 1;
  std::cout << "demo: stats after freeing:\n";
  PrintDevices(*stats);
  for (const v1::DeviceStats& d : stats->devices()) {
    if (d.used_bytes() != 0) {
      std::cerr << "demo: device " << d.index() << " still shows used bytes\n";
      return 1;
    }
  }
  std::cout << "demo: done\n";
  return 0;
}

}  // namespace
}  // namespace client
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::client::Run();
}
