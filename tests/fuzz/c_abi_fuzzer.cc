// Fuzzes sequences of C ABI calls (client/lib/include/gpumem.h) against a real daemon
// run in this process (server/daemon's Daemon, sim backend, on a private
// socket): mallocs of any size and placement text, sharded mallocs, frees of
// live blocks, double frees, interior pointers, random pointers and NULL,
// frees from another thread (two threads freeing one block at once),
// device_of, trim and stats.
//
// Checked for every call: the status is one the header documents for it;
// a live block is 256-byte aligned and writable over its whole size; a
// double free, an interior or a foreign pointer is refused with
// GPUMEM_E_DOUBLE_FREE or GPUMEM_E_FOREIGN_POINTER and leaves the block it
// points into live; of two threads freeing one block exactly one succeeds.
// After every input, once everything is freed and trimmed, the library
// holds no lease, no large block and nothing in use.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/lib/include/gpumem.h"
#include "server/config/settings.h"
#include "server/daemon/daemon.h"

namespace gpumem {
namespace {

struct World {
  std::string dir;
  std::unique_ptr<Daemon> daemon;
  gpumem_client* client = nullptr;
};

World* world = nullptr;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    fprintf(stderr, "c_abi_fuzzer: %s (last error %d: %s)\n", what.c_str(), gpumem_last_error(),
            gpumem_last_error_message());
    abort();
  }
}

class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t U8() { return i_ < n_ ? d_[i_++] : 0; }
  uint32_t U32() { return U8() | (U8() << 8) | (U8() << 16) | (uint32_t{U8()} << 24); }
  uint64_t U64() { return U32() | (uint64_t{U32()} << 32); }
  std::string Text(size_t max) {
    const size_t n = U8() % (max + 1);
    std::string s;
    for (size_t k = 0; k < n; ++k) s.push_back(static_cast<char>(U8()));
    return s;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

// Statuses an allocation may get.
bool AllocCode(int rc) {
  return rc == GPUMEM_OK || rc == GPUMEM_E_INVALID_ARGUMENT || rc == GPUMEM_E_RESOURCE_EXHAUSTED ||
         rc == GPUMEM_E_NOT_FOUND || rc == GPUMEM_E_FAILED_PRECONDITION;
}

bool Refused(int rc) { return rc == GPUMEM_E_DOUBLE_FREE || rc == GPUMEM_E_FOREIGN_POINTER; }

class Run {
 public:
  explicit Run(gpumem_client* c) : c_(c) {}

  void Step(Bytes& in) {
    switch (in.U8() % 12) {
      case 0:
      case 1: Malloc(in, in.U8() % 2 == 0 ? 1 + in.U32() % 65536 : 1 + in.U32() % (24 << 20)); break;
      case 2: MallocStr(in); break;
      case 3: Sharded(in); break;
      case 4: FreeLive(in); break;
      case 5: DoubleFree(in); break;
      case 6: Interior(in); break;
      case 7: Foreign(in); break;
      case 8: RacingFree(in); break;
      case 9: DeviceOf(in); break;
      case 10: {
        size_t released = 0;
        Check(gpumem_trim(c_, &released) == GPUMEM_OK, "trim");
        break;
      }
      case 11: {
        char* json = nullptr;
        Check(gpumem_stats_json(c_, &json) == GPUMEM_OK && json != nullptr, "stats");
        gpumem_string_free(json);
        Check(gpumem_free(c_, nullptr) == GPUMEM_OK, "free(NULL)");
        break;
      }
    }
  }

  // Frees everything; checks that nothing is left.
  void End() {
    for (const auto& [p, n] : live_) Check(gpumem_free(c_, p) == GPUMEM_OK, "final free");
    live_.clear();
    size_t released = 0;
    Check(gpumem_trim(c_, &released) == GPUMEM_OK, "final trim");
    char* json = nullptr;
    Check(gpumem_stats_json(c_, &json) == GPUMEM_OK, "final stats");
    const std::string s(json);
    gpumem_string_free(json);
    Check(absl::StrContains(s, "\"leases\":0,") && absl::StrContains(s, "\"in_use_bytes\":0,") &&
              absl::StrContains(s, "\"large_blocks\":0,"),
          "memory left after freeing everything and trimming: " + s.substr(0, 200));
  }

 private:
  void Took(void* p, size_t n) {
    Check(p != nullptr, "OK without a pointer");
    Check(reinterpret_cast<uintptr_t>(p) % 256 == 0, "not 256-byte aligned");
    Check(live_.count(p) == 0, "a live pointer handed out again");
    // Writable over its whole size (sim memory is host memory).
    static_cast<volatile char*>(p)[0] = 1;
    static_cast<volatile char*>(p)[n - 1] = 2;
    live_[p] = n;
    freed_.erase(p);
  }

  void Malloc(Bytes& in, size_t n) {
    void* p = nullptr;
    gpumem_placement where = {};
    const char* fallback[] = {"1", "all"};
    const uint8_t shape = in.U8();
    if (shape & 1) where.gpus = (shape & 2) ? "1" : "0,1";
    if (shape & 4) where.exclude = "0";
    if (shape & 8) {
      where.fallback = fallback;
      where.fallback_count = 2;
    }
    if (shape & 16) where.policy = (shape & 32) ? "pack" : "near:1";
    const int rc = gpumem_malloc(c_, n, (shape & 0x3f) ? &where : nullptr, &p);
    Check(AllocCode(rc), absl::StrCat("malloc code ", rc));
    if (rc == GPUMEM_OK) Took(p, n);
  }

  void MallocStr(Bytes& in) {
    const size_t n = 1 + in.U32() % (1 << 20);
    const std::string text = in.Text(24);
    void* p = nullptr;
    const int rc = gpumem_malloc_str(c_, n, text.c_str(), &p);
    Check(AllocCode(rc), absl::StrCat("malloc_str code ", rc, " for \"", text, "\""));
    if (rc == GPUMEM_OK) Took(p, n);
  }

  void Sharded(Bytes& in) {
    const size_t total = in.U32() % (8 << 20);
    const unsigned shards = in.U8() % 4;
    void* ptrs[3] = {};
    size_t sizes[3] = {};
    int devices[3] = {};
    const int rc = gpumem_malloc_sharded(c_, total, shards, nullptr, ptrs, sizes, devices);
    Check(AllocCode(rc), absl::StrCat("sharded code ", rc));
    if (rc != GPUMEM_OK) return;
    Check(shards >= 1 && shards <= 2, "sharded over more devices than there are");
    size_t sum = 0;
    for (unsigned i = 0; i < shards; ++i) {
      Check(devices[i] >= 0 && devices[i] < 2, "shard device");
      if (i > 0) Check(devices[i] != devices[i - 1], "two shards on one device");
      Took(ptrs[i], sizes[i]);
      sum += sizes[i];
    }
    Check(sum == total, "shard sizes do not add up");
  }

  void* PickLive(Bytes& in) {
    if (live_.empty()) return nullptr;
    auto it = live_.begin();
    std::advance(it, in.U8() % live_.size());
    return it->first;
  }

  void FreeLive(Bytes& in) {
    void* p = PickLive(in);
    if (p == nullptr) return;
    Check(gpumem_free(c_, p) == GPUMEM_OK, "free of a live block");
    live_.erase(p);
    freed_.insert(p);
  }

  void DoubleFree(Bytes& in) {
    if (freed_.empty()) return;
    auto it = freed_.begin();
    std::advance(it, in.U8() % freed_.size());
    const int rc = gpumem_free(c_, *it);
    Check(Refused(rc), absl::StrCat("double free answered ", rc));
  }

  void Interior(Bytes& in) {
    void* p = PickLive(in);
    if (p == nullptr || live_[p] < 2) return;
    const size_t off = 1 + in.U32() % (live_[p] - 1);
    const int rc = gpumem_free(c_, static_cast<char*>(p) + off);
    Check(Refused(rc), absl::StrCat("interior free answered ", rc));
  }

  void Foreign(Bytes& in) {
    uint64_t v = in.U64();
    const uint8_t how = in.U8();
    void* p = reinterpret_cast<void*>(v);
    if (how == 1) p = &v;                   // the stack
    if (how == 2) p = reinterpret_cast<void*>(&Check);  // code
    if (live_.count(p) != 0) return;        // by chance a live block
    const int rc = gpumem_free(c_, p);
    if (p == nullptr) {
      Check(rc == GPUMEM_OK, "free(NULL)");
      return;
    }
    Check(Refused(rc), absl::StrCat("free of a foreign pointer answered ", rc));
  }

  void RacingFree(Bytes& in) {
    void* p = PickLive(in);
    if (p == nullptr) return;
    std::atomic<int> ok{0}, refused{0};
    auto one = [&] {
      const int rc = gpumem_free(c_, p);
      if (rc == GPUMEM_OK) ++ok;
      else if (Refused(rc)) ++refused;
    };
    if (in.U8() & 1) {
      std::thread a(one), b(one);
      a.join();
      b.join();
      Check(ok.load() == 1 && refused.load() == 1, "two frees of one block at once");
    } else {
      std::thread a(one);  // a free from another thread
      a.join();
      Check(ok.load() == 1, "free from another thread");
    }
    live_.erase(p);
    freed_.insert(p);
  }

  void DeviceOf(Bytes& in) {
    void* p = PickLive(in);
    if (p != nullptr) {
      const int d = gpumem_device_of(c_, p);
      Check(d == 0 || d == 1, "device_of a live block");
    }
    const int d = gpumem_device_of(c_, reinterpret_cast<void*>(in.U64() | 1));
    Check(d == -1, "device_of a foreign pointer");
  }

  gpumem_client* c_;
  std::map<void*, size_t> live_;
  std::set<void*> freed_;
};

}  // namespace
}  // namespace gpumem

using namespace gpumem;  // NOLINT: the fuzzer entry points are global

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  world = new World;
  world->dir = absl::StrCat("/tmp/gpumemd-cabi-fuzz-", getpid());
  std::filesystem::create_directories(world->dir);
  // Leave nothing behind (the process ends with its threads running).
  atexit([] { std::error_code e; std::filesystem::remove_all(world->dir, e); });
  CommandLine flags;
  flags.socket = world->dir + "/gpumemd.sock";
  flags.sim_devices = "2x128MiB";
  flags.slab_size = "8MiB";
  flags.ledger = "none";
  flags.tenant_socket_dir = world->dir + "/tenants";
  flags.empty_slab_release_seconds = 0.1;
  absl::StatusOr<Settings> settings = ResolveSettings(flags, "", v1::DaemonConfig());
  Check(settings.ok(), "settings: " + settings.status().ToString());
  world->daemon = std::make_unique<Daemon>(
      flags, *std::move(settings),
      std::make_unique<google::protobuf::TextFormat::ParseInfoTree>());
  absl::Status started = world->daemon->Start();
  Check(started.ok(), "daemon: " + started.ToString());
  setenv("GPUMEM_LEASE_SIZE", "2MiB", 1);
  setenv("GPUMEM_IDLE_RELEASE_MS", "100000", 1);
  world->client = gpumem_connect((world->dir + "/gpumemd.sock").c_str());
  Check(world->client != nullptr, "connect");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1024) return 0;
  Bytes in(data, size);
  Run run(world->client);
  while (!in.empty()) run.Step(in);
  run.End();
  return 0;
}
