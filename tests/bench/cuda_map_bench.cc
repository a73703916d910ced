// cuda_map_bench: what opening device memory costs, per call, measured side
// by side in one run. Against the fake driver (tests/fake_cuda) the figures
// are for catching regressions in our own code paths only; on a GPU
// (tests/gpu/run) they are the real comparison:
//   cuMemAlloc / cuMemFree          the driver's allocator (what cudaMalloc
//                                   and cudaFree call), --size bytes
//   VMM open / close                the client's CUDA VMM mapper on a slab
//                                   fd of --slab_size: import, reserve, map,
//                                   set access / unmap, free, release
//   IPC open / close                the client's legacy IPC mapper:
//                                   cuIpcOpenMemHandle / cuIpcCloseMemHandle
//                                   of a --slab_size cuMemAlloc made by a
//                                   child process (handles cannot be opened
//                                   by their exporter)
//   gpumemd Allocate (warm) / Free  with --socket: Client::Allocate of
//                                   --size bytes to a usable device pointer,
//                                   its slab already open; then Buffer::Free
//   gpumemd first map / close       with --socket: the first block in a slab
//                                   this process has not opened (a fresh
//                                   Client each time, the slab made already
//                                   at the daemon): the RPC, the slab's fd
//                                   over the socket and the VMM open; then
//                                   Free and closing the Client (unmap)
//   gpumem_malloc / gpumem_free     with --socket: the C ABI's cached path
//                                   (warm: blocks of --size from a lease),
//                                   the free stream-ordered on CUDA memory
// Operations are timed in rounds, each kind in turn, so noise hits all alike.
// Prints median and p99 microseconds; --json prints the same as JSON, with
// "client_cost": what the client adds, per first map (first map minus the
// driver's own VMM open of the same slab) and per warm allocation (the
// RPC path and the cached path), beside cuMemAlloc's figure.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/lib/cpp/client.h"
#include "client/lib/include/gpumem.h"
#include "client/lib/slabs/slab_mapper.h"
#include "common/cuda_driver.h"

ABSL_FLAG(std::string, driver, "libcuda.so.1", "the CUDA driver library to dlopen");
ABSL_FLAG(int, device, 0, "device ordinal for the driver-level rows");
ABSL_FLAG(int, rounds, 10, "rounds");
ABSL_FLAG(int, per_round, 20, "operations per kind per round");
ABSL_FLAG(uint64_t, size, 1 << 20, "bytes per allocation (cuMemAlloc, gpumemd)");
ABSL_FLAG(uint64_t, slab_size, 64 << 20, "bytes per slab opened (VMM, IPC)");
ABSL_FLAG(std::string, socket, "", "a running gpumemd (cuda backend): adds its rows");
ABSL_FLAG(bool, json, false, "print JSON");

namespace gpumem {
using client::Client;
using client::Buffer;
using client::OpenedSlab;
using client::SlabFdSource;
using client::NewSlabMapper;
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cuda_map_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

struct Series {
  std::string name;
  std::vector<double> us;
};

// A pair of operations timed separately: `open` returns what `close` undoes.
struct OpPair {
  std::string open_name, close_name;
  std::function<void()> open, close;
  std::function<void()> prepare;  // untimed, before each open
};

// The legacy IPC exporter: a child process, forked before this process
// initialises CUDA, that allocates a slab and sends its handle and device UUID.
struct IpcExporter {
  pid_t pid = -1;
  int hold = -1;  // closing it lets the child exit
  std::string handle, uuid;
};

IpcExporter StartExporter(const std::string& driver, int device, uint64_t bytes) {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) Die("pipe");
  IpcExporter e;
  e.pid = fork();
  if (e.pid == 0) {
    close(up[0]);
    close(down[1]);
    auto d = LoadCudaDriver(driver.c_str());
    if (!d.ok()) _exit(3);
    CUcontext ctx;
    CUdeviceptr p;
    CUipcMemHandle h;
    CUuuid u;
    if ((*d)->cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
        (*d)->cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        (*d)->cuMemAlloc_v2(&p, bytes) != CUDA_SUCCESS ||
        (*d)->cuIpcGetMemHandle(&h, p) != CUDA_SUCCESS ||
        (*d)->cuDeviceGetUuid_v2(&u, device) != CUDA_SUCCESS) {
      _exit(4);
    }
    std::string msg(h.reserved, sizeof(h.reserved));
    msg += FormatCudaUuid(u);
    if (write(up[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) _exit(5);
    char c;
    while (read(down[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  e.hold = down[1];
  char buf[64 + 40];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = read(up[0], buf + got, sizeof(buf) - got);
    if (n <= 0) Die("the IPC exporter process failed (no CUDA device?)");
    got += static_cast<size_t>(n);
  }
  close(up[0]);
  e.handle.assign(buf, 64);
  e.uuid.assign(buf + 64, 40);
  return e;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The median of the first series whose name starts with `prefix`.
double P50Of(const std::vector<Series>& series, const std::string& prefix) {
  for (const Series& s : series) {
    if (s.name.rfind(prefix, 0) == 0) return Percentile(s.us, 0.5);
  }
  return 0;
}

int Run() {
  const std::string driver_name = absl::GetFlag(FLAGS_driver);
  const int device = absl::GetFlag(FLAGS_device);
  const uint64_t size = absl::GetFlag(FLAGS_size);
  const uint64_t slab_size = absl::GetFlag(FLAGS_slab_size);
  IpcExporter exporter = StartExporter(driver_name, device, slab_size);

  absl::StatusOr<const CudaDriver*> loaded = LoadCudaDriver(driver_name.c_str());
  Check(loaded.status(), "load driver");
  const CudaDriver& d = **loaded;
  CUcontext ctx;
  if (d.cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
      d.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    Die("no context on device " + std::to_string(device));
  }
  CUuuid uuid;
  d.cuDeviceGetUuid_v2(&uuid, device);

  // A VMM slab exported once; each open imports a new dup of its fd.
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle vmm;
  Check(CudaStatus(d, d.cuMemCreate(&vmm, slab_size, &prop, 0), "cuMemCreate"), "slab");
  int slab_fd = -1;
  Check(CudaStatus(d, d.cuMemExportToShareableHandle(
                          &slab_fd, vmm, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                   "cuMemExportToShareableHandle"),
        "export");
  v1::Allocation vmm_alloc;
  vmm_alloc.set_slab_id(1);
  vmm_alloc.set_slab_size_bytes(slab_size);
  vmm_alloc.set_device_uuid(FormatCudaUuid(uuid));
  vmm_alloc.set_size_bytes(slab_size);
  vmm_alloc.set_handle_kind(v1::HANDLE_KIND_CUDA_VMM_FD);
  v1::Allocation ipc_alloc = vmm_alloc;
  ipc_alloc.set_handle_kind(v1::HANDLE_KIND_CUDA_IPC);
  ipc_alloc.set_ipc_handle(exporter.handle);
  ipc_alloc.set_device_uuid(exporter.uuid);
  auto vmm_mapper = NewSlabMapper(v1::HANDLE_KIND_CUDA_VMM_FD, driver_name.c_str());
  auto ipc_mapper = NewSlabMapper(v1::HANDLE_KIND_CUDA_IPC, driver_name.c_str());
  Check(vmm_mapper.status(), "VMM mapper");
  Check(ipc_mapper.status(), "IPC mapper");
  SlabFdSource fetch = [&]() -> absl::StatusOr<SlabFd> {
    return SlabFd{fcntl(slab_fd, F_DUPFD_CLOEXEC, 0), slab_size};
  };

  CUdeviceptr plain = 0;
  std::unique_ptr<OpenedSlab> opened;
  std::vector<OpPair> pairs = {
      {"cuMemAlloc", "cuMemFree",
       [&] { Check(CudaStatus(d, d.cuMemAlloc_v2(&plain, size), "cuMemAlloc"), "alloc"); },
       [&] { Check(CudaStatus(d, d.cuMemFree_v2(plain), "cuMemFree"), "free"); }},
      {"VMM open (import+reserve+map+access)", "VMM close (unmap+free+release)",
       [&] {
         auto s = (*vmm_mapper)->Open(vmm_alloc, fetch);
         Check(s.status(), "VMM open");
         opened = std::move(*s);
       },
       [&] { opened.reset(); }},
      {"IPC open (cuIpcOpenMemHandle)", "IPC close (cuIpcCloseMemHandle)",
       [&] {
         auto s = (*ipc_mapper)->Open(ipc_alloc, fetch);
         Check(s.status(), "IPC open");
         opened = std::move(*s);
       },
       [&] { opened.reset(); }},
  };
  std::unique_ptr<Client> client;
  std::unique_ptr<Client> fresh;
  std::vector<Buffer> warm;
  Buffer buffer;
  gpumem_client* cabi = nullptr;
  void* cblock = nullptr;
  if (!absl::GetFlag(FLAGS_socket).empty()) {
    auto c = Client::Connect(absl::GetFlag(FLAGS_socket));
    Check(c.status(), "connect");
    client = std::move(*c);
    v1::PlacementRequest where;
    where.add_devices(vmm_alloc.device_uuid());
    auto first = client->Allocate(size, where);  // opens the slab: later calls are warm
    Check(first.status(), "first gpumemd allocation");
    warm.push_back(std::move(*first));
    pairs.push_back({"gpumemd Allocate (warm, to device pointer)", "gpumemd Free",
                     [&, where] {
                       auto b = client->Allocate(size, where);
                       Check(b.status(), "gpumemd Allocate");
                       buffer = std::move(*b);
                     },
                     [&] { Check(buffer.Free(), "gpumemd Free"); }});
    // A first map: a Client that has not opened the slab yet (connected
    // before the clock starts), whose first block lands in the slab `warm`
    // keeps at the daemon.
    auto connect_fresh = [&] {
      auto c2 = Client::Connect(absl::GetFlag(FLAGS_socket));
      Check(c2.status(), "connect");
      fresh = std::move(*c2);
      // Its RPC stream up before the clock starts: what is timed is the map.
      Check(fresh->GetSession().status(), "GetSession");
    };
    connect_fresh();
    pairs.push_back({"gpumemd first map (RPC + slab fd + VMM open)",
                     "gpumemd close (Free + unmap)",
                     [&, where] {
                       auto b = fresh->Allocate(size, where);
                       Check(b.status(), "gpumemd first map");
                       buffer = std::move(*b);
                     },
                     [&] {
                       Check(buffer.Free(), "gpumemd Free");
                       fresh.reset();
                     },
                     connect_fresh});
    cabi = gpumem_connect(absl::GetFlag(FLAGS_socket).c_str());
    if (cabi == nullptr) Die(std::string("gpumem_connect: ") + gpumem_last_error_message());
    const std::string on = "--gpus=" + vmm_alloc.device_uuid();
    // Warm: the first block made its lease (and mapped it).
    if (gpumem_malloc_str(cabi, size, on.c_str(), &cblock) != GPUMEM_OK) {
      Die(std::string("gpumem_malloc: ") + gpumem_last_error_message());
    }
    gpumem_free(cabi, cblock);
    pairs.push_back({"gpumem_malloc (warm, C ABI cache)", "gpumem_free (stream-ordered)",
                     [&, on] {
                       if (gpumem_malloc_str(cabi, size, on.c_str(), &cblock) != GPUMEM_OK) {
                         Die(std::string("gpumem_malloc: ") + gpumem_last_error_message());
                       }
                     },
                     [&] {
                       if (gpumem_free(cabi, cblock) != GPUMEM_OK) {
                         Die(std::string("gpumem_free: ") + gpumem_last_error_message());
                       }
                     }});
  }

  std::vector<Series> series;
  for (const OpPair& p : pairs) {
    series.push_back({p.open_name, {}});
    series.push_back({p.close_name, {}});
  }
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t i = 0; i < pairs.size(); ++i) {
      for (int k = 0; k < absl::GetFlag(FLAGS_per_round); ++k) {
        if (pairs[i].prepare) pairs[i].prepare();
        auto t0 = Clock::now();
        pairs[i].open();
        auto t1 = Clock::now();
        pairs[i].close();
        auto t2 = Clock::now();
        series[2 * i].us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        series[2 * i + 1].us.push_back(
            std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
    }
  }
  warm.clear();
  fresh.reset();
  client.reset();
  if (cabi != nullptr) gpumem_close(cabi);
  close(slab_fd);
  d.cuMemRelease(vmm);
  close(exporter.hold);
  waitpid(exporter.pid, nullptr, 0);

  char name[256] = {};
  d.cuDeviceGetName(name, sizeof(name), device);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"device\": \"%s\", \"size_bytes\": %llu, \"slab_size_bytes\": %llu, \"rows\": [",
                name, static_cast<unsigned long long>(size),
                static_cast<unsigned long long>(slab_size));
    for (size_t i = 0; i < series.size(); ++i) {
      std::printf("%s{\"op\": \"%s\", \"n\": %zu, \"p50_us\": %.2f, \"p99_us\": %.2f}",
                  i ? ", " : "", series[i].name.c_str(), series[i].us.size(),
                  Percentile(series[i].us, 0.5), Percentile(series[i].us, 0.99));
    }
    std::printf("]");
    if (!absl::GetFlag(FLAGS_socket).empty()) {
      const double first = P50Of(series, "gpumemd first map"), driver = P50Of(series, "VMM open");
      std::printf(", \"client_cost\": {\"first_map_us\": %.2f, \"first_map_driver_us\": %.2f, "
                  "\"first_map_added_us\": %.2f, \"warm_rpc_alloc_us\": %.2f, "
                  "\"warm_cached_alloc_us\": %.2f, \"warm_cached_free_us\": %.2f, "
                  "\"driver_alloc_us\": %.2f}",
                  first, driver, first - driver, P50Of(series, "gpumemd Allocate"),
                  P50Of(series, "gpumem_malloc"), P50Of(series, "gpumem_free"),
                  P50Of(series, "cuMemAlloc"));
    }
    std::printf("}\n");
    return 0;
  }
  std::printf("device %d: %s; allocations of %s, slabs of %s\n", device, name,
              absl::StrFormat("%d B", size).c_str(), absl::StrFormat("%d B", slab_size).c_str());
  std::printf("%-46s %8s %12s %12s\n", "operation", "n", "p50 us", "p99 us");
  for (const Series& s : series) {
    std::printf("%-46s %8zu %12.2f %12.2f\n", s.name.c_str(), s.us.size(),
                Percentile(s.us, 0.5), Percentile(s.us, 0.99));
  }
  if (!absl::GetFlag(FLAGS_socket).empty()) {
    const double first = P50Of(series, "gpumemd first map"), driver = P50Of(series, "VMM open");
    std::printf("client cost (p50): first map %.2f us (%.2f us over the driver's VMM open), "
                "warm allocation %.2f us by RPC, %.2f us cached (free %.2f us); cuMemAlloc "
                "%.2f us\n",
                first, first - driver, P50Of(series, "gpumemd Allocate"),
                P50Of(series, "gpumem_malloc"), P50Of(series, "gpumem_free"),
                P50Of(series, "cuMemAlloc"));
  }
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
