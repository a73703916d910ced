// torch_pair_bench: what a cached PyTorch allocation costs through the
// library, measured side by side in one run:
//   torch pair   gpumem_torch_malloc + gpumem_torch_free of --size bytes on
//                one stream (the cuda gpumemd GPUMEMD_SOCKET names, over the
//                driver --driver names), while --pending frees wait on
//                another stream that a host function holds back (work the
//                GPU has not reached yet: PyTorch frees as soon as a kernel
//                is queued);
//   sim pair     gpumem_malloc + gpumem_free of the same size on the sim
//                gpumemd --sim_socket names: the library's cached pair with
//                no device and nothing to wait for.
// Rounds alternate the two, so noise hits both alike. Prints p50 and p99
// microseconds of each, the ratio of the p50s, the bytes this process holds
// from gpumemd for the torch pairs (before the rounds, with the pending
// frees, and at most during them: what the CPU-GPU lag holds), and, where
// the driver is the fake (fakeCudaCalls), the driver calls per torch pair.
// --json prints the same as one JSON object.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/lib/include/gpumem.h"
#include "common/cuda_driver.h"

ABSL_FLAG(std::string, driver, "libcuda.so.1", "the CUDA driver library to dlopen");
ABSL_FLAG(std::string, sim_socket, "", "a running sim gpumemd, for the sim pair");
ABSL_FLAG(uint64_t, size, 64 << 10, "bytes per allocation");
ABSL_FLAG(int, pending, 1000, "frees left waiting on a held-back stream");
ABSL_FLAG(int, rounds, 10, "rounds");
ABSL_FLAG(int, per_round, 200, "pairs per kind per round");
ABSL_FLAG(bool, json, false, "print JSON");

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "torch_pair_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) Die(std::string(call) + " failed: " + std::to_string(r));
}

void CUDA_CB WaitGate(void* gate) {
  auto* g = static_cast<std::atomic<bool>*>(gate);
  while (!g->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

uint64_t Reserved() {
  gpumem_torch_stats st = {};
  if (gpumem_torch_memory_stats(0, &st) != GPUMEM_OK) {
    Die(std::string("gpumem_torch_memory_stats: ") + gpumem_last_error_message());
  }
  return st.reserved_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const uint64_t size = absl::GetFlag(FLAGS_size);
  const int pending = absl::GetFlag(FLAGS_pending);
  const int per_round = absl::GetFlag(FLAGS_per_round);
  absl::StatusOr<const gpumem::CudaDriver*> loaded =
      gpumem::LoadCudaDriver(absl::GetFlag(FLAGS_driver).c_str());
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  const gpumem::CudaDriver& d = **loaded;
  auto fake_calls = reinterpret_cast<long (*)()>(dlsym(d.lib, "fakeCudaCalls"));
  CUcontext ctx = nullptr;
  Check(d.cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  Check(d.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent");
  CUstream work = nullptr, held = nullptr;
  Check(d.cuStreamCreate(&work, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  Check(d.cuStreamCreate(&held, CU_STREAM_NON_BLOCKING), "cuStreamCreate");

  // The frees the GPU has not reached: blocks freed on a stream held back.
  std::atomic<bool> gate{false};
  std::vector<void*> blocks;
  for (int i = 0; i < pending; ++i) {
    void* p = gpumem_torch_malloc(static_cast<ssize_t>(size), 0, held);
    if (p == nullptr) Die(std::string("gpumem_torch_malloc: ") + gpumem_last_error_message());
    blocks.push_back(p);
  }
  Check(d.cuLaunchHostFunc(held, WaitGate, &gate), "cuLaunchHostFunc");
  for (void* p : blocks) gpumem_torch_free(p, static_cast<ssize_t>(size), 0, held);

  gpumem_client* sim = nullptr;
  if (!absl::GetFlag(FLAGS_sim_socket).empty()) {
    sim = gpumem_connect(absl::GetFlag(FLAGS_sim_socket).c_str());
    if (sim == nullptr) Die(std::string("gpumem_connect: ") + gpumem_last_error_message());
  }
  auto torch_pair = [&] {
    void* p = gpumem_torch_malloc(static_cast<ssize_t>(size), 0, work);
    if (p == nullptr) Die(std::string("gpumem_torch_malloc: ") + gpumem_last_error_message());
    gpumem_torch_free(p, static_cast<ssize_t>(size), 0, work);
  };
  auto sim_pair = [&] {
    void* p = nullptr;
    if (gpumem_malloc(sim, size, nullptr, &p) != GPUMEM_OK) {
      Die(std::string("gpumem_malloc: ") + gpumem_last_error_message());
    }
    gpumem_free(sim, p);
  };
  torch_pair();  // warm: the stream's first event, the lease already there
  if (sim != nullptr) sim_pair();

  const uint64_t reserved_before = Reserved();
  uint64_t reserved_max = reserved_before;
  std::vector<double> torch_us, sim_us;
  long calls = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const long calls_before = fake_calls != nullptr ? fake_calls() : 0;
    for (int k = 0; k < per_round; ++k) {
      const auto t0 = Clock::now();
      torch_pair();
      torch_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (fake_calls != nullptr) calls += fake_calls() - calls_before;
    reserved_max = std::max(reserved_max, Reserved());
    for (int k = 0; sim != nullptr && k < per_round; ++k) {
      const auto t0 = Clock::now();
      sim_pair();
      sim_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  gate.store(true);
  Check(d.cuStreamSynchronize(held), "cuStreamSynchronize");
  if (sim != nullptr) gpumem_close(sim);

  const double torch_p50 = Percentile(torch_us, 0.5), sim_p50 = Percentile(sim_us, 0.5);
  const double calls_per_pair =
      fake_calls != nullptr ? static_cast<double>(calls) / static_cast<double>(torch_us.size()) : -1;
  const double ratio = sim_p50 > 0 ? torch_p50 / sim_p50 : 0;
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"size_bytes\": %llu, \"pending_frees\": %d, \"pairs\": %zu, "
        "\"torch_pair\": {\"p50_us\": %.3f, \"p99_us\": %.3f}, "
        "\"sim_pair\": {\"p50_us\": %.3f, \"p99_us\": %.3f}, \"torch_over_sim_p50\": %.3f, "
        "\"driver_calls_per_torch_pair\": %.2f, \"reserved_bytes\": {\"before\": %llu, "
        "\"max\": %llu}}\n",
        static_cast<unsigned long long>(size), pending, torch_us.size(), torch_p50,
        Percentile(torch_us, 0.99), sim_p50, Percentile(sim_us, 0.99), ratio, calls_per_pair,
        static_cast<unsigned long long>(reserved_before),
        static_cast<unsigned long long>(reserved_max));
  } else {
    std::printf("%-58s %10s %10s\n", "pair", "p50 us", "p99 us");
    std::printf("%-58s %10.3f %10.3f\n", "gpumem_torch_malloc+free (cuda, frees pending)",
                torch_p50, Percentile(torch_us, 0.99));
    std::printf("%-58s %10.3f %10.3f\n", "gpumem_malloc+free (sim)", sim_p50,
                Percentile(sim_us, 0.99));
    std::printf("torch pair / sim pair (p50): %.2f\n", ratio);
    if (calls_per_pair >= 0) std::printf("driver calls per torch pair: %.2f\n", calls_per_pair);
    std::printf("held from gpumemd: %llu bytes with %d frees pending, at most %llu during\n",
                static_cast<unsigned long long>(reserved_before), pending,
                static_cast<unsigned long long>(reserved_max));
  }
  return 0;
}
