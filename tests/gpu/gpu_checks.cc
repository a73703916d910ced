// gpu_checks: the in-process checks of tests/gpu/run, one subcommand each.
// Every subcommand prints one JSON object on stdout ({"result": "pass" |
// "fail" | "skip", "detail": "...", figures...}) and exits 0 unless it could
// not run at all. They use the client library exactly as programs do (the C
// ABI, the PyTorch entry points, gpumem::Client) and the driver directly
// where a program would (streams, events, contexts), so the same binary
// judges a real GPU and, in CI, the fake driver.
//
//   driver-info [--device=N]    devices as the driver shows this process:
//                               UUIDs, bus ids, totals, granularities,
//                               compute modes; with --meminfo the driver's
//                               free/total on --device (with this process's
//                               context)
//   stream-free --socket=S      blocks freed while work queued on them is
//                               pending (gpumem_torch_free on the work's
//                               stream, gpumem_free) are not reused before it
//                               ran: the next owner's bytes survive, no fault
//   contexts --socket=S         every C ABI entry point leaves the calling
//                               thread's current context as it found it
//   fork --socket=S             a fork() child of a process that used CUDA is
//                               told it cannot, with FAILED_PRECONDITION
//   zeros --socket=S --uuid=U --size=N
//                               a new block of N bytes reads as zeros
//   fill --socket=S --uuid=U --block=N
//                               allocates N-byte blocks until refused; how
//                               much, and how it was refused
//   restart-victim --socket=S   holds a VMM block, a legacy IPC block and a
//                               C ABI block; after "killed" on stdin reads
//                               the VMM block; after "restarted", that the
//                               VMM and C ABI blocks survived (bytes intact,
//                               freed normally), that the IPC block is lost
//                               by name, and that new memory never lands on
//                               its addresses
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/lib/cpp/client.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/include/gpumem.h"
#include "common/cuda_driver.h"

ABSL_FLAG(std::string, socket, "", "the daemon's socket");
ABSL_FLAG(int, device, 0, "this process's CUDA ordinal of the device to check");
ABSL_FLAG(std::string, uuid, "", "device UUID (zeros, fill)");
ABSL_FLAG(uint64_t, size, 64 << 20, "bytes (zeros, stream-free's large block)");
ABSL_FLAG(uint64_t, block, 1ull << 30, "bytes per block (fill)");
ABSL_FLAG(int, max_blocks, 4096, "most blocks fill takes");
ABSL_FLAG(bool, meminfo, false, "driver-info: cuMemGetInfo of --device too");

namespace gpumem {
namespace {

using client::Buffer;
using client::Client;

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// One JSON object: result, detail and extra "key": value pairs (values
// already JSON).
int Report(const std::string& result, const std::string& detail,
           const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  std::string out = "{\"result\": " + Quote(result) + ", \"detail\": " + Quote(detail);
  for (const auto& [k, v] : extra) out += ", " + Quote(k) + ": " + v;
  std::printf("%s}\n", out.c_str());
  std::fflush(stdout);
  return 0;
}

const CudaDriver* DriverOrDie() {
  absl::StatusOr<const CudaDriver*> d = LoadCudaDriver();
  if (!d.ok()) {
    Report("fail", std::string(d.status().message()));
    std::exit(0);
  }
  return *d;
}

std::string UuidOf(const CudaDriver& d, int ordinal) {
  absl::StatusOr<std::string> u = client::CudaDeviceContext::UuidOfOrdinal(d, ordinal);
  return u.ok() ? *u : "";
}

int DriverInfo() {
  const CudaDriver& d = *DriverOrDie();
  int count = 0;
  d.cuDeviceGetCount(&count);
  std::vector<std::string> rows;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    d.cuDeviceGet(&dev, i);
    char name[256] = {}, bus[64] = {};
    d.cuDeviceGetName(name, sizeof(name), dev);
    d.cuDeviceGetPCIBusId(bus, sizeof(bus), dev);
    size_t total = 0;
    d.cuDeviceTotalMem_v2(&total, dev);
    int mode = 0;
    d.cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = i;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gmin = 0, grec = 0;
    d.cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    d.cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    rows.push_back(absl::StrCat("{\"ordinal\": ", i, ", \"uuid\": ", Quote(UuidOf(d, i)),
                                ", \"name\": ", Quote(name), ", \"pci_bus_id\": ", Quote(bus),
                                ", \"total_bytes\": ", total, ", \"compute_mode\": ", mode,
                                ", \"granularity_min\": ", gmin,
                                ", \"granularity_recommended\": ", grec, "}"));
  }
  std::vector<std::pair<std::string, std::string>> extra = {
      {"devices", "[" + absl::StrJoin(rows, ", ") + "]"}};
  if (absl::GetFlag(FLAGS_meminfo)) {
    const int ordinal = absl::GetFlag(FLAGS_device);
    CUcontext ctx = nullptr;
    size_t free = 0, total = 0;
    CUresult r = d.cuDevicePrimaryCtxRetain(&ctx, ordinal);
    if (r == CUDA_SUCCESS) {
      ScopedCudaContext scope(d, ctx);
      r = d.cuMemGetInfo_v2(&free, &total);
    }
    if (r != CUDA_SUCCESS) return Report("fail", "cuMemGetInfo: " + d.ErrorText(r), extra);
    extra.push_back({"free_bytes", absl::StrCat(free)});
    extra.push_back({"total_bytes", absl::StrCat(total)});
  }
  return Report("pass", absl::StrCat(count, " device(s)"), extra);
}

void WaitGate(void* gate) {
  auto* g = static_cast<std::atomic<bool>*>(gate);
  while (!g->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// One free-while-queued round: a block gets a gated memset queued on
// `stream`, is freed (`torch`: gpumem_torch_free on that stream, else
// gpumem_free), and the next allocation of that size is written by the host
// before the gate opens. Returns "" or what went wrong; *reused says whether
// the next owner got the same address.
std::string FreeWhileQueued(const CudaDriver& d, gpumem_client* c, CUstream stream,
                            const std::string& on, size_t size, bool torch, bool* reused) {
  const int ordinal = absl::GetFlag(FLAGS_device);
  std::atomic<bool> gate{false};
  // Should a library call wait for the held-up work, the gate opens by
  // itself after 20 s (and the round fails) instead of hanging.
  std::atomic<bool> finished{false}, forced{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 2000 && !finished.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!finished.load() && !gate.load()) {
      forced.store(true);
      gate.store(true);
    }
  });
  struct Join {
    std::atomic<bool>& done;
    std::thread& t;
    ~Join() {
      done.store(true);
      t.join();
    }
  } join{finished, watchdog};
  void* p = nullptr;
  if (torch) {
    p = gpumem_torch_malloc(static_cast<ssize_t>(size), ordinal, stream);
  } else if (gpumem_malloc_str(c, size, on.c_str(), &p) != GPUMEM_OK) {
    p = nullptr;
  }
  if (p == nullptr) return absl::StrCat("malloc(", size, "): ", gpumem_last_error_message());
  CUresult r = d.cuLaunchHostFunc(stream, WaitGate, &gate);
  if (r == CUDA_SUCCESS) {
    r = d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0xAB, size, stream);
  }
  if (r != CUDA_SUCCESS) {
    gate.store(true);
    return "queueing the work: " + d.ErrorText(r);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (torch) {
    gpumem_torch_free(p, static_cast<ssize_t>(size), ordinal, stream);
  } else {
    gpumem_free(c, p);
  }
  const double free_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  void* q = nullptr;
  if (torch) {
    q = gpumem_torch_malloc(static_cast<ssize_t>(size), ordinal, nullptr);
  } else if (gpumem_malloc_str(c, size, on.c_str(), &q) != GPUMEM_OK) {
    q = nullptr;
  }
  if (q == nullptr) {
    gate.store(true);
    return absl::StrCat("malloc after free: ", gpumem_last_error_message());
  }
  *reused = q == p;
  std::vector<unsigned char> mine(size, 0x5c), back(size);
  r = d.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(q), mine.data(), size);
  if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(nullptr);
  gate.store(true);
  CUresult done = d.cuStreamSynchronize(stream);
  if (r != CUDA_SUCCESS) return "writing the next owner's bytes: " + d.ErrorText(r);
  if (done != CUDA_SUCCESS) return "the queued work faulted: " + d.ErrorText(done);
  r = d.cuMemcpyDtoH_v2(back.data(), reinterpret_cast<CUdeviceptr>(q), size);
  if (r != CUDA_SUCCESS) return "reading back: " + d.ErrorText(r);
  if (torch) {
    gpumem_torch_free(q, static_cast<ssize_t>(size), ordinal, nullptr);
  } else {
    gpumem_free(c, q);
  }
  if (forced.load()) return "a library call waited for the held-up work (the gate was forced)";
  if (back != mine) return "the next owner's bytes were overwritten by the freed block's work";
  if (free_ms > 500) return absl::StrCat("the free waited ", free_ms, " ms for the queued work");
  return "";
}

int StreamFree() {
  const CudaDriver& d = *DriverOrDie();
  setenv("GPUMEMD_SOCKET", absl::GetFlag(FLAGS_socket).c_str(), 1);
  const int ordinal = absl::GetFlag(FLAGS_device);
  const std::string uuid = UuidOf(d, ordinal);
  const std::string on = "--gpus=" + uuid;
  gpumem_client* c = gpumem_connect(absl::GetFlag(FLAGS_socket).c_str());
  if (c == nullptr) return Report("fail", gpumem_last_error_message());
  CUcontext ctx = nullptr;
  CUresult r = d.cuDevicePrimaryCtxRetain(&ctx, ordinal);
  if (r != CUDA_SUCCESS) return Report("fail", "cuDevicePrimaryCtxRetain: " + d.ErrorText(r));
  ScopedCudaContext app(d, ctx);
  CUstream stream = nullptr;
  r = d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) return Report("fail", "cuStreamCreate: " + d.ErrorText(r));
  std::vector<std::string> notes, failures;
  for (bool torch : {true, false}) {
    for (size_t size : {size_t{1} << 20, static_cast<size_t>(absl::GetFlag(FLAGS_size))}) {
      bool reused = false;
      const std::string what =
          absl::StrCat(torch ? "gpumem_torch_free" : "gpumem_free", " of ", size, " bytes");
      std::string e = FreeWhileQueued(d, c, stream, on, size, torch, &reused);
      if (!e.empty()) failures.push_back(what + ": " + e);
      notes.push_back(absl::StrCat(what, reused ? ": address reused after the work ran"
                                                : ": next owner got other memory"));
    }
  }
  d.cuStreamDestroy_v2(stream);
  gpumem_close(c);
  if (!failures.empty()) return Report("fail", absl::StrJoin(failures, "; "));
  return Report("pass", absl::StrJoin(notes, "; "));
}

int Contexts() {
  const CudaDriver& d = *DriverOrDie();
  setenv("GPUMEMD_SOCKET", absl::GetFlag(FLAGS_socket).c_str(), 1);
  const int ordinal = absl::GetFlag(FLAGS_device);
  const std::string on = "--gpus=" + UuidOf(d, ordinal);
  int count = 0;
  d.cuDeviceGetCount(&count);
  // The application's own context: another device's when there is one.
  CUcontext other = nullptr;
  d.cuDevicePrimaryCtxRetain(&other, count > 1 ? (ordinal + 1) % count : ordinal);
  std::vector<std::string> changed;
  int calls = 0;
  for (CUcontext app : {other, static_cast<CUcontext>(nullptr)}) {
    d.cuCtxSetCurrent(app);
    auto same = [&](const char* call) {
      ++calls;
      CUcontext now = nullptr;
      d.cuCtxGetCurrent(&now);
      if (now != app) changed.push_back(absl::StrCat(call, app == nullptr ? " (none current)" : ""));
    };
    gpumem_client* c = gpumem_connect(absl::GetFlag(FLAGS_socket).c_str());
    same("gpumem_connect");
    if (c == nullptr) return Report("fail", gpumem_last_error_message());
    void *small = nullptr, *large = nullptr;
    if (gpumem_malloc_str(c, 4096, on.c_str(), &small) != GPUMEM_OK ||
        gpumem_malloc_str(c, 96 << 20, on.c_str(), &large) != GPUMEM_OK) {
      return Report("fail", std::string("gpumem_malloc_str: ") + gpumem_last_error_message());
    }
    same("gpumem_malloc_str");
    int o = -2;
    gpumem_device_ordinal(c, small, &o);
    same("gpumem_device_ordinal");
    gpumem_device_of(c, large);
    same("gpumem_device_of");
    gpumem_free(c, small);
    gpumem_free(c, large);
    same("gpumem_free");
    void* t = gpumem_torch_malloc(8192, ordinal, nullptr);
    same("gpumem_torch_malloc");
    gpumem_torch_free(t, 8192, ordinal, nullptr);
    same("gpumem_torch_free");
    gpumem_trim(c, nullptr);
    same("gpumem_trim");
    char* json = nullptr;
    gpumem_stats_json(c, &json);
    gpumem_string_free(json);
    same("gpumem_stats_json");
    gpumem_close(c);
    same("gpumem_close");
  }
  d.cuCtxSetCurrent(nullptr);
  if (!changed.empty()) {
    return Report("fail", "the current context changed in: " + absl::StrJoin(changed, ", "));
  }
  return Report("pass", absl::StrCat(calls, " calls, the caller's context unchanged after each"));
}

int Fork() {
  const CudaDriver& d = *DriverOrDie();
  setenv("GPUMEMD_SOCKET", absl::GetFlag(FLAGS_socket).c_str(), 1);
  const int ordinal = absl::GetFlag(FLAGS_device);
  void* p = gpumem_torch_malloc(4096, ordinal, nullptr);  // CUDA is in use here now
  if (p == nullptr) return Report("fail", gpumem_last_error_message());
  (void)d;
  int pipefd[2];
  if (pipe(pipefd) != 0) return Report("fail", "pipe");
  pid_t pid = fork();
  if (pid == 0) {
    void* q = gpumem_torch_malloc(4096, ordinal, nullptr);
    std::string verdict = absl::StrCat(q == nullptr ? gpumem_last_error() : 0, " ",
                                       gpumem_last_error_message());
    (void)!write(pipefd[1], verdict.data(), verdict.size());
    _exit(0);
  }
  close(pipefd[1]);
  std::string verdict;
  char buf[1024];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) verdict.append(buf, n);
  close(pipefd[0]);
  waitpid(pid, nullptr, 0);
  gpumem_torch_free(p, 4096, ordinal, nullptr);
  if (verdict.rfind(absl::StrCat(GPUMEM_E_FAILED_PRECONDITION, " "), 0) == 0 &&
      absl::StrContains(verdict, "fork()")) {
    return Report("pass", "the child was told: " + verdict.substr(2));
  }
  return Report("fail", "the child got: " + verdict);
}

int Zeros() {
  auto c = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) return Report("fail", std::string(c.status().message()));
  v1::PlacementRequest where;
  where.add_devices(absl::GetFlag(FLAGS_uuid));
  absl::StatusOr<Buffer> b = (*c)->Allocate(absl::GetFlag(FLAGS_size), where);
  if (!b.ok()) return Report("fail", b.status().ToString());
  std::vector<unsigned char> host(b->size(), 0xEE);
  absl::Status s = b->Read(0, host.data(), host.size());
  if (!s.ok()) return Report("fail", s.ToString());
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != 0) {
      return Report("fail", absl::StrCat("byte ", i, " of the new block reads ",
                                         static_cast<int>(host[i]), ", not 0"),
                    {{"slab_id", absl::StrCat(b->allocation().slab_id())}});
    }
  }
  return Report("pass", absl::StrCat(host.size(), " bytes of a new block read as zeros"),
                {{"slab_id", absl::StrCat(b->allocation().slab_id())}});
}

int Fill() {
  auto c = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) return Report("fail", std::string(c.status().message()));
  const uint64_t block = absl::GetFlag(FLAGS_block);
  std::vector<uint64_t> ids;
  absl::Status refused;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < absl::GetFlag(FLAGS_max_blocks); ++i) {
    v1::AllocateRequest req;
    req.set_size_bytes(block);
    req.mutable_placement()->add_devices(absl::GetFlag(FLAGS_uuid));
    absl::StatusOr<v1::AllocateResponse> r = (*c)->AllocateRaw(req);
    if (!r.ok()) {
      refused = r.status();
      break;
    }
    ids.push_back(r->allocations(0).id());
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats();
  uint64_t driver_free = 0, free_bytes = 0, total = 0;
  if (st.ok()) {
    for (const v1::DeviceStats& dev : st->devices()) {
      if (dev.uuid() == absl::GetFlag(FLAGS_uuid)) {
        driver_free = dev.driver_free_bytes();
        free_bytes = dev.free_bytes();
        total = dev.total_bytes();
      }
    }
  }
  for (uint64_t id : ids) (*c)->Free(id).IgnoreError();
  const bool by_placement = client::PlacementRefusalOf(refused).has_value();
  const bool by_driver = absl::StrContains(refused.message(), "cuMemCreate");
  std::vector<std::pair<std::string, std::string>> extra = {
      {"blocks", absl::StrCat(ids.size())},
      {"bytes", absl::StrCat(ids.size() * block)},
      {"total_bytes", absl::StrCat(total)},
      {"driver_free_bytes_when_refused", absl::StrCat(driver_free)},
      {"free_bytes_when_refused", absl::StrCat(free_bytes)},
      {"refused_by", Quote(refused.ok() ? "nothing" : by_placement ? "placement" : by_driver ? "cuMemCreate" : "other")},
      {"refusal", Quote(refused.ToString())},
      {"seconds", absl::StrCat(secs)}};
  if (refused.ok()) return Report("fail", "never refused", extra);
  if (refused.code() != absl::StatusCode::kResourceExhausted || !by_placement) {
    return Report("fail", "refused otherwise than by placement with its figures", extra);
  }
  return Report("pass", absl::StrCat(ids.size(), " blocks of ", block, " bytes, then refused by "
                                     "placement with the driver's figure"), extra);
}

std::string Line() {
  std::string line;
  std::getline(std::cin, line);
  return line;
}

int RestartVictim() {
  const CudaDriver& d = *DriverOrDie();
  const int ordinal = absl::GetFlag(FLAGS_device);
  const std::string uuid = UuidOf(d, ordinal);
  const std::string socket = absl::GetFlag(FLAGS_socket);
  setenv("GPUMEM_RECONNECT_MS", "30000", 1);
  // Held through gpumem::Client: a VMM block and a legacy IPC block.
  auto vmm_client = Client::Connect(socket);
  auto ipc_client = Client::Connect(socket);
  if (!vmm_client.ok() || !ipc_client.ok()) return Report("fail", "connect");
  (*ipc_client)->SetHandleKind(v1::HANDLE_KIND_CUDA_IPC);
  v1::PlacementRequest where;
  where.add_devices(uuid);
  const uint64_t n = 4 << 20;
  absl::StatusOr<Buffer> vmm = (*vmm_client)->Allocate(n, where);
  absl::StatusOr<Buffer> ipc = (*ipc_client)->Allocate(n, where);
  if (!vmm.ok() || !ipc.ok()) {
    return Report("fail", "allocate: " + (!vmm.ok() ? vmm.status() : ipc.status()).ToString());
  }
  std::vector<unsigned char> pattern(n, 0x3d), back(n);
  if (!vmm->Write(0, pattern.data(), n).ok() || !ipc->Write(0, pattern.data(), n).ok()) {
    return Report("fail", "write");
  }
  const uint64_t vmm_id = vmm->id(), ipc_id = ipc->id();
  const uintptr_t ipc_lo = reinterpret_cast<uintptr_t>(ipc->data());
  // And a block through the C ABI, in a lease of its pool.
  gpumem_client* c = gpumem_connect(socket.c_str());
  void* pooled = nullptr;
  if (c == nullptr ||
      gpumem_malloc_str(c, 1 << 20, ("--gpus=" + uuid).c_str(), &pooled) != GPUMEM_OK) {
    return Report("fail", std::string("gpumem: ") + gpumem_last_error_message());
  }
  std::printf("ready\n");
  std::fflush(stdout);
  if (Line() != "killed") return Report("fail", "no 'killed' line");
  std::vector<std::string> notes;
  absl::Status rv = vmm->Read(0, back.data(), n);
  notes.push_back(rv.ok() && back == pattern
                      ? "with the daemon dead the VMM block reads back (its import holds it)"
                      : "with the daemon dead the VMM block is gone: " + rv.ToString());
  std::printf("lost-ok\n");
  std::fflush(stdout);
  if (Line() != "restarted") return Report("fail", "no 'restarted' line");
  // The library reconnects and re-presents its blocks by itself.
  for (int i = 0; i < 3000 && ((*vmm_client)->restarts() == 0 ||
                               (*ipc_client)->restarts() == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if ((*vmm_client)->restarts() == 0) return Report("fail", "the client did not resume");
  // The VMM block survived: same id, same bytes, freed normally.
  back.assign(n, 0);
  rv = vmm->Read(0, back.data(), n);
  const bool vmm_ok = rv.ok() && back == pattern && !(*vmm_client)->IsLost(vmm_id);
  absl::Status vmm_free = vmm->Free();
  // So did the pooled block's lease: its free is a normal one.
  const int pooled_free = gpumem_free(c, pooled);
  const bool pooled_ok = pooled_free == GPUMEM_OK;
  // The legacy IPC block did not: it is lost, by name, and its addresses are
  // never handed out again.
  const bool ipc_lost = (*ipc_client)->IsLost(ipc_id);
  absl::Status ipc_free = ipc->Free();
  std::string overlap;
  std::vector<Buffer> fresh;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<Buffer> q = (*ipc_client)->Allocate(1 << 20, where);
    if (!q.ok()) return Report("fail", "after the restart: " + q.status().ToString());
    const uintptr_t at = reinterpret_cast<uintptr_t>(q->data());
    if (at + (1 << 20) > ipc_lo && at < ipc_lo + n) overlap = absl::StrCat(absl::Hex(at));
    fresh.push_back(*std::move(q));
  }
  fresh.clear();
  gpumem_close(c);
  std::vector<std::pair<std::string, std::string>> extra = {
      {"vmm_survives", vmm_ok ? "true" : "false"},
      {"pooled_survives", pooled_ok ? "true" : "false"},
      {"ipc_lost", ipc_lost ? "true" : "false"}};
  if (!vmm_ok) return Report("fail", "the VMM block did not survive: " + rv.ToString(), extra);
  if (!vmm_free.ok()) return Report("fail", "freeing the VMM block: " + vmm_free.ToString(), extra);
  if (!pooled_ok) {
    return Report("fail", absl::StrCat("freeing the C ABI block answered ",
                                       gpumem_status_name(pooled_free), ": ",
                                       gpumem_last_error_message()), extra);
  }
  if (!ipc_lost || ipc_free.code() != absl::StatusCode::kNotFound) {
    return Report("fail", "the legacy IPC block was not reported lost: " + ipc_free.ToString(),
                  extra);
  }
  if (!overlap.empty()) {
    return Report("fail", "new memory landed on a lost address: " + overlap, extra);
  }
  return Report("pass", absl::StrJoin(notes, "; ") +
                            "; after the restart the VMM block read back and freed normally, "
                            "so did the C ABI block; the legacy IPC block was lost (" +
                            std::string(ipc_free.message()) + "); new blocks avoided its "
                            "addresses", extra);
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const std::string mode = rest.size() > 1 ? rest[1] : "";
  if (mode == "driver-info") return gpumem::DriverInfo();
  if (mode == "stream-free") return gpumem::StreamFree();
  if (mode == "contexts") return gpumem::Contexts();
  if (mode == "fork") return gpumem::Fork();
  if (mode == "zeros") return gpumem::Zeros();
  if (mode == "fill") return gpumem::Fill();
  if (mode == "restart-victim") return gpumem::RestartVictim();
  std::fprintf(stderr,
               "usage: gpu_checks driver-info|stream-free|contexts|fork|zeros|fill|"
               "restart-victim [flags]\n");
  return 2;
}
