// The C ABI (gpumem.h) against a real daemon: the caching pool's bytes and
// figures, trim and idle release, bad input with its documented codes
// (double free, foreign pointer, size 0 / beyond any device, call after
// close, a fork() child on the parent's client), many threads, and a daemon
// restarted under a running client.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/include/gpumem.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace {

using gpumem::testing::DaemonProcess;

std::string StatsJson(gpumem_client* c) {
  char* j = nullptr;
  EXPECT_EQ(gpumem_stats_json(c, &j), GPUMEM_OK) << gpumem_last_error_message();
  std::string out = j != nullptr ? j : "";
  gpumem_string_free(j);
  return out;
}

// The number after "key": in the library's own (top-level, first) figures.
long long Field(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  size_t at = json.find(k);
  if (at == std::string::npos) return -1;
  return std::atoll(json.c_str() + at + k.size());
}

// used_bytes of daemon device 0 (printed as a string by the JSON printer).
// used_bytes summed over the daemon's devices (strings in protobuf's JSON).
long long DaemonUsed(gpumem_client* c) {
  std::string j = StatsJson(c);
  size_t at = j.find("\"devices\":", j.find("\"daemon\":"));
  const size_t end = j.find("\"sessions\":", at);
  long long sum = 0;
  while ((at = j.find("\"used_bytes\":\"", at)) < end) {
    at += 14;
    sum += std::atoll(j.c_str() + at);
  }
  return sum;
}

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("GPUMEM_PLACEMENT");
    setenv("GPUMEM_LEASE_SIZE", "8MiB", 1);
    setenv("GPUMEM_IDLE_RELEASE_MS", "60000", 1);
    setenv("GPUMEM_RECONNECT_MS", "10000", 1);
    ASSERT_TRUE(daemon_.Start()) << daemon_.Log();
  }
  gpumem_client* Connect() {
    gpumem_client* c = gpumem_connect(daemon_.socket().c_str());
    EXPECT_NE(c, nullptr) << gpumem_last_error_message();
    return c;
  }
  DaemonProcess daemon_{{"--sim_devices=2x1GiB"}};
};

TEST_F(CApiTest, CachedBlocksHoldTheirBytesAndAreChargedPerLease) {
  gpumem_client* c = Connect();
  std::vector<std::pair<unsigned char*, size_t>> blocks;
  std::mt19937 rng(1);
  for (int i = 0; i < 500; ++i) {
    size_t n = 1 + rng() % 200000;
    void* p = nullptr;
    ASSERT_EQ(gpumem_malloc(c, n, nullptr, &p), GPUMEM_OK) << gpumem_last_error_message();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    memset(p, i & 0xff, n);
    blocks.push_back({static_cast<unsigned char*>(p), n});
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t k = 0; k < blocks[i].second; k += 97) {
      ASSERT_EQ(blocks[i].first[k], i & 0xff) << "block " << i << " byte " << k;
    }
  }
  std::string j = StatsJson(c);
  const long long leased = Field(j, "leased_bytes");
  EXPECT_GT(Field(j, "in_use_bytes"), 0);
  EXPECT_GE(leased, Field(j, "in_use_bytes"));
  EXPECT_EQ(leased % (8 << 20), 0) << j;
  // The daemon sees whole leases: its used bytes are the leased bytes.
  EXPECT_EQ(DaemonUsed(c), leased) << j;
  for (auto& [p, n] : blocks) ASSERT_EQ(gpumem_free(c, p), GPUMEM_OK);
  j = StatsJson(c);
  EXPECT_EQ(Field(j, "in_use_bytes"), 0) << j;
  size_t released = 0;
  ASSERT_EQ(gpumem_trim(c, &released), GPUMEM_OK) << gpumem_last_error_message();
  EXPECT_EQ(static_cast<long long>(released), leased);
  j = StatsJson(c);
  EXPECT_EQ(Field(j, "leases"), 0) << j;
  EXPECT_EQ(Field(j, "cached_bytes"), 0) << j;
  EXPECT_EQ(DaemonUsed(c), 0) << j;
  EXPECT_EQ(gpumem_close(c), GPUMEM_OK);
}

TEST_F(CApiTest, LargeRequestsGoToTheDaemonAndPlacementIsHonoured) {
  gpumem_client* c = Connect();
  void* big = nullptr;
  ASSERT_EQ(gpumem_malloc_str(c, 100 << 20, "--gpus=1", &big), GPUMEM_OK)
      << gpumem_last_error_message();
  EXPECT_EQ(gpumem_device_of(c, big), 1);
  memset(big, 7, 100 << 20);
  void* small = nullptr;
  gpumem_placement where = {};
  where.gpus = "1";
  ASSERT_EQ(gpumem_malloc(c, 4096, &where, &small), GPUMEM_OK);
  EXPECT_EQ(gpumem_device_of(c, small), 1);
  std::string j = StatsJson(c);
  EXPECT_EQ(Field(j, "large_bytes"), 100 << 20) << j;
  EXPECT_EQ(gpumem_free(c, big), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, small), GPUMEM_OK);
  EXPECT_EQ(gpumem_malloc_str(c, 10, "--gpus=0 --bogus=1", &small), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gpumem_last_error_message()).find("bogus"), std::string::npos);
  EXPECT_EQ(gpumem_malloc_str(c, 10, "--gpus=7", &small), GPUMEM_E_INVALID_ARGUMENT)
      << gpumem_last_error_message();
  gpumem_close(c);
}

TEST_F(CApiTest, BadInputGetsDocumentedCodes) {
  gpumem_client* c = Connect();
  void* p = nullptr;
  EXPECT_EQ(gpumem_malloc(c, 0, nullptr, &p), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_EQ(gpumem_last_error(), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  // Beyond any device (the daemon's answer).
  EXPECT_EQ(gpumem_malloc(c, size_t{1} << 42, nullptr, &p), GPUMEM_E_INVALID_ARGUMENT)
      << gpumem_last_error_message();
  ASSERT_EQ(gpumem_malloc(c, 1000, nullptr, &p), GPUMEM_OK);
  EXPECT_EQ(gpumem_last_error(), GPUMEM_OK);
  // Host memory has no dma-buf.
  int fd = -1;
  size_t offset = 0;
  EXPECT_EQ(gpumem_export_dmabuf(c, p, 1000, &fd, &offset), GPUMEM_E_FAILED_PRECONDITION);
  EXPECT_NE(std::string(gpumem_last_error_message()).find("no dma-buf"), std::string::npos);
  EXPECT_EQ(fd, -1);
  // Interior pointer, then the real free, then a double free.
  EXPECT_EQ(gpumem_free(c, static_cast<char*>(p) + 256), GPUMEM_E_DOUBLE_FREE);
  EXPECT_EQ(gpumem_free(c, static_cast<char*>(p) + 8), GPUMEM_E_DOUBLE_FREE);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_E_DOUBLE_FREE);
  EXPECT_NE(std::string(gpumem_last_error_message()).find("double free"), std::string::npos);
  // Large block double free.
  void* big = nullptr;
  ASSERT_EQ(gpumem_malloc(c, 64 << 20, nullptr, &big), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, big), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, big), GPUMEM_E_FOREIGN_POINTER);
  // Foreign pointers: the stack, the heap, another client's block.
  int on_stack;
  EXPECT_EQ(gpumem_free(c, &on_stack), GPUMEM_E_FOREIGN_POINTER);
  void* heap = malloc(64);
  EXPECT_EQ(gpumem_free(c, heap), GPUMEM_E_FOREIGN_POINTER);
  free(heap);
  gpumem_client* other = Connect();
  void* theirs = nullptr;
  ASSERT_EQ(gpumem_malloc(other, 512, nullptr, &theirs), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, theirs), GPUMEM_E_FOREIGN_POINTER);
  EXPECT_EQ(gpumem_free(other, theirs), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, nullptr), GPUMEM_OK);  // like free(NULL)
  EXPECT_EQ(gpumem_malloc(c, 10, nullptr, nullptr), GPUMEM_E_INVALID_ARGUMENT);
  EXPECT_EQ(gpumem_malloc(nullptr, 10, nullptr, &p), GPUMEM_E_INVALID_ARGUMENT);
  // The pool still works after all of that.
  ASSERT_EQ(gpumem_malloc(c, 1000, nullptr, &p), GPUMEM_OK);
  memset(p, 1, 1000);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_OK);
  // Calls after close.
  ASSERT_EQ(gpumem_close(c), GPUMEM_OK);
  EXPECT_EQ(gpumem_malloc(c, 10, nullptr, &p), GPUMEM_E_CLOSED);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_E_CLOSED);
  EXPECT_EQ(gpumem_trim(c, nullptr), GPUMEM_E_CLOSED);
  EXPECT_EQ(gpumem_close(c), GPUMEM_E_CLOSED);
  EXPECT_STREQ(gpumem_status_name(gpumem_last_error()), "GPUMEM_E_CLOSED");
  gpumem_close(other);
}

TEST_F(CApiTest, ForkChildCannotUseTheParentsClient) {
  gpumem_client* c = Connect();
  void* p = nullptr;
  ASSERT_EQ(gpumem_malloc(c, 4096, nullptr, &p), GPUMEM_OK);
  memset(p, 0x5a, 4096);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    void* q = nullptr;
    int codes[4] = {gpumem_malloc(c, 4096, nullptr, &q), gpumem_free(c, p),
                    gpumem_trim(c, nullptr), gpumem_close(c)};
    (void)!write(pipefd[1], codes, sizeof(codes));
    _exit(0);
  }
  close(pipefd[1]);
  int codes[4] = {0, 0, 0, 0};
  ASSERT_EQ(read(pipefd[0], codes, sizeof(codes)), static_cast<ssize_t>(sizeof(codes)));
  close(pipefd[0]);
  int status;
  waitpid(pid, &status, 0);
  for (int code : codes) EXPECT_EQ(code, GPUMEM_E_FORKED);
  // The parent's block and client are untouched.
  EXPECT_EQ(static_cast<unsigned char*>(p)[4095], 0x5a);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_OK);
  ASSERT_EQ(gpumem_malloc(c, 4096, nullptr, &p), GPUMEM_OK);
  EXPECT_EQ(gpumem_free(c, p), GPUMEM_OK);
  gpumem_close(c);
}

TEST_F(CApiTest, ManyThreadsCrossThreadFreesAndRacingDoubleFrees) {
  gpumem_client* c = Connect();
  constexpr int kThreads = 8;
  std::atomic<int> errors{0};
  std::vector<std::vector<void*>> handoff(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < 4000; ++i) {
        if (live.size() < 40 && rng() % 3 != 0) {
          size_t n = 1 + rng() % (rng() % 8 == 0 ? 2000000 : 20000);
          void* p = nullptr;
          if (gpumem_malloc(c, n, nullptr, &p) != GPUMEM_OK) {
            ++errors;
            continue;
          }
          memset(p, t + 1, n < 512 ? n : 512);
          live.push_back({static_cast<unsigned char*>(p), n});
        } else if (!live.empty()) {
          auto [p, n] = live.back();
          live.pop_back();
          for (size_t k = 0; k < (n < 512 ? n : 512); ++k) {
            if (p[k] != t + 1) {
              ++errors;
              break;
            }
          }
          if (gpumem_free(c, p) != GPUMEM_OK) ++errors;
        }
      }
      for (auto& [p, n] : live) handoff[t].push_back(p);  // freed by another thread
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors.load(), 0);
  // Frees from other threads, two at a time on the same pointer: exactly one wins.
  ts.clear();
  std::atomic<int> ok{0}, double_free{0};
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&] {
      for (auto& v : handoff) {
        for (void* p : v) {
          int r = gpumem_free(c, p);
          if (r == GPUMEM_OK) ++ok;
          else if (r == GPUMEM_E_DOUBLE_FREE || r == GPUMEM_E_FOREIGN_POINTER) ++double_free;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  size_t total = 0;
  for (auto& v : handoff) total += v.size();
  EXPECT_EQ(ok.load(), static_cast<int>(total));
  EXPECT_EQ(double_free.load(), static_cast<int>(total));
  std::string j = StatsJson(c);
  EXPECT_EQ(Field(j, "in_use_bytes"), 0) << j;
  ASSERT_EQ(gpumem_trim(c, nullptr), GPUMEM_OK);
  EXPECT_EQ(DaemonUsed(c), 0) << StatsJson(c);
  gpumem_close(c);
}

// The daemon's figure `key` (a JSON string) for this process's session, -1
// when absent.
long long SessionField(gpumem_client* c, const std::string& key) {
  std::string j = StatsJson(c);
  size_t at = j.find("\"sessions\":", j.find("\"daemon\":"));
  if (at == std::string::npos) return -1;
  const std::string pid = "\"pid\":" + std::to_string(getpid());
  at = j.find(pid, at);
  if (at == std::string::npos) return -1;
  const size_t begin = j.rfind('{', at);
  const size_t end = j.find('}', at);
  const std::string k = "\"" + key + "\":\"";
  const size_t f = j.find(k, begin);
  if (f == std::string::npos || f > end) return -1;
  return std::atoll(j.c_str() + f + k.size());
}

TEST_F(CApiTest, DaemonShowsTheSessionsLeasedAndInUseBytes) {
  gpumem_client* c = Connect();
  void* p = nullptr;
  ASSERT_EQ(gpumem_malloc(c, 3000, nullptr, &p), GPUMEM_OK);
  const std::string own = StatsJson(c);
  const long long in_use = Field(own, "in_use_bytes");  // the library's own figure
  ASSERT_GE(in_use, 3000) << own;
  EXPECT_EQ(SessionField(c, "leased_bytes"), 8 << 20) << StatsJson(c);
  EXPECT_EQ(SessionField(c, "in_use_bytes"), in_use) << StatsJson(c);
  EXPECT_EQ(SessionField(c, "used_bytes"), 8 << 20) << StatsJson(c);
  ASSERT_EQ(gpumem_free(c, p), GPUMEM_OK);
  size_t freed = 0;
  ASSERT_EQ(gpumem_trim(c, &freed), GPUMEM_OK) << gpumem_last_error_message();
  EXPECT_EQ(freed, 8u << 20);
  EXPECT_EQ(SessionField(c, "used_bytes"), 0) << StatsJson(c);
  EXPECT_EQ(SessionField(c, "leased_bytes"), 0) << StatsJson(c);
  EXPECT_EQ(SessionField(c, "in_use_bytes"), 0) << StatsJson(c);
  gpumem_close(c);
}

TEST_F(CApiTest, EmptyLeasesGoBackAfterTheIdleTime) {
  setenv("GPUMEM_IDLE_RELEASE_MS", "200", 1);
  gpumem_client* c = Connect();
  std::thread([c] {
    void* p = nullptr;
    ASSERT_EQ(gpumem_malloc(c, 3000, nullptr, &p), GPUMEM_OK);
    ASSERT_EQ(gpumem_free(c, p), GPUMEM_OK);  // parked in this thread's cache
  }).join();
  void* p = nullptr;
  ASSERT_EQ(gpumem_malloc(c, 5000, nullptr, &p), GPUMEM_OK);
  ASSERT_EQ(gpumem_free(c, p), GPUMEM_OK);  // parked in the main thread's cache
  EXPECT_EQ(DaemonUsed(c), 8 << 20);
  long long used = -1;
  for (int i = 0; i < 200 && used != 0; ++i) {  // up to 10 s on a loaded machine
    usleep(50 * 1000);
    used = DaemonUsed(c);
  }
  EXPECT_EQ(used, 0) << StatsJson(c);
  gpumem_close(c);
}

TEST_F(CApiTest, DaemonRestartUnderARunningClient) {
  gpumem_client* c = Connect();
  void* small = nullptr;
  void* big = nullptr;
  void* small_cached = nullptr;
  ASSERT_EQ(gpumem_malloc(c, 4096, nullptr, &small), GPUMEM_OK);
  ASSERT_EQ(gpumem_malloc(c, 4096, nullptr, &small_cached), GPUMEM_OK);
  ASSERT_EQ(gpumem_free(c, small_cached), GPUMEM_OK);
  ASSERT_EQ(gpumem_malloc(c, 32 << 20, nullptr, &big), GPUMEM_OK);
  // A thread keeps allocating, writing and freeing throughout.
  std::atomic<bool> stop{false};
  std::atomic<int> ok_after{0}, bad{0};
  std::atomic<bool> restarted{false};
  struct Joiner {
    std::atomic<bool>* stop;
    std::thread* t;
    ~Joiner() {
      stop->store(true);
      if (t->joinable()) t->join();
    }
  };
  std::thread worker;
  Joiner joiner{&stop, &worker};
  worker = std::thread([&] {
    while (!stop.load()) {
      void* p = nullptr;
      int r = gpumem_malloc(c, 10000, nullptr, &p);
      if (r == GPUMEM_OK) {
        memset(p, 3, 10000);
        int f = gpumem_free(c, p);
        if (f == GPUMEM_OK && restarted.load()) ++ok_after;
        if (f != GPUMEM_OK && f != GPUMEM_E_LOST) ++bad;
      } else if (r != GPUMEM_E_UNAVAILABLE) {
        ++bad;
      }
    }
  });
  usleep(100 * 1000);
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  usleep(200 * 1000);
  memset(small, 1, 4096);  // still mapped (orphaned): writing does not crash
  ASSERT_TRUE(daemon_.Start()) << daemon_.Log();
  restarted.store(true);
  void* fresh = nullptr;
  ASSERT_EQ(gpumem_malloc(c, 4096, nullptr, &fresh), GPUMEM_OK) << gpumem_last_error_message();
  memset(fresh, 2, 4096);
  EXPECT_EQ(gpumem_free(c, small), GPUMEM_E_LOST) << gpumem_last_error_message() << daemon_.Log();
  EXPECT_NE(std::string(gpumem_last_error_message()).find("restarted"), std::string::npos);
  EXPECT_EQ(gpumem_free(c, big), GPUMEM_E_LOST);
  EXPECT_EQ(gpumem_free(c, small), GPUMEM_E_LOST);  // the range stays reserved
  EXPECT_EQ(gpumem_free(c, fresh), GPUMEM_OK);
  for (int i = 0; i < 400 && ok_after.load() < 10; ++i) usleep(25 * 1000);
  stop.store(true);
  if (worker.joinable()) worker.join();
  EXPECT_GE(ok_after.load(), 10);
  EXPECT_EQ(bad.load(), 0);
  std::string j = StatsJson(c);
  EXPECT_EQ(Field(j, "generation"), 2) << j;
  EXPECT_GE(Field(j, "lost_bytes"), (8 << 20) + (32 << 20)) << j;
  ASSERT_EQ(gpumem_trim(c, nullptr), GPUMEM_OK);
  EXPECT_EQ(DaemonUsed(c), 0) << StatsJson(c);
  gpumem_close(c);
}

}  // namespace
