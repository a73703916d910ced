// ring_bench: what a call through the shared-memory request ring (issue 40)
// costs, beside the floors it is built from, measured in one run.
//
// Each row is a round trip between this process and a fork()ed peer over
// shared memory, timed one call at a time on the steady clock:
//   futex floor     a word in a MAP_SHARED page; each side sleeps in
//                   FutexWait until the other stores its turn and wakes it
//                   (two wakes, two sleeps per round trip)
//   spin floor      the same word, both sides spinning (yielding the core
//                   after 50 us without an answer): the least a round trip
//                   between two processes can cost
//   ring            RingSubmitter::Call against a peer serving the ring with
//                   a RingPoller (one worker, default spin) and an echo
//                   handler, calls back to back (the worker is still
//                   spinning when the next request comes)
//   ring, asleep    the same with --sleep_us between calls, so the worker has
//                   gone back to epoll_wait: the doorbell's eventfd, the
//                   worker's wake-up and the poller's turn are all in the call
// Per row: p50 and p99 microseconds, the peer's CPU per call (its CPU clock
// over the whole series), and p50 over the futex floor's p50. Payloads are
// --payload bytes each way. Without --pin the scheduler places both sides:
// on a loaded machine they often share one core, and each spinning side
// then waits out its spin (50 us) before the other runs. --pin puts this
// process on the first allowed CPU and the peer on the second.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "client/lib/ring/ring_submitter.h"
#include "common/ring/futex.h"
#include "common/ring/request_ring.h"
#include "server/ring/ring_poller.h"
#include "server/ring/ring_reader.h"

ABSL_FLAG(int, calls, 20000, "timed round trips per row (back to back)");
ABSL_FLAG(int, asleep_calls, 2000, "timed round trips of the asleep row");
ABSL_FLAG(int, sleep_us, 200, "pause between calls in the asleep row");
ABSL_FLAG(int, payload, 64, "bytes each way through the ring");
ABSL_FLAG(bool, json, false, "print JSON");
ABSL_FLAG(bool, pin, false, "this process on the first allowed CPU, the peer on the second");

namespace gpumem {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string op;
  std::vector<double> us;
  double peer_cpu_us_per_call = 0;
  double p50 = 0, p99 = 0;
};

// With --pin, the calling thread (and the threads it starts later) on the
// `nth` CPU this process may use (0 or 1).
void PinTo(int nth) {
  if (!absl::GetFlag(FLAGS_pin)) return;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != nth) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof(one), &one);
    return;
  }
}

double CpuSeconds(pid_t pid) {
  clockid_t clock;
  struct timespec ts;
  if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &ts) != 0) return 0;
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Reaps a peer; a peer that did not exit cleanly (a sanitizer's report in
// the smoke test, say) fails the run.
void Reap(pid_t peer, const std::string& op) {
  int status = 0;
  if (waitpid(peer, &status, 0) != peer || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: the peer process did not exit cleanly (status %d)\n", op.c_str(),
            status);
    exit(1);
  }
}

void Summarize(Row* row) {
  std::sort(row->us.begin(), row->us.end());
  row->p50 = row->us[row->us.size() / 2];
  row->p99 = row->us[static_cast<size_t>(0.99 * (row->us.size() - 1))];
}

// A word in a fresh MAP_SHARED page (shared with children forked later).
std::atomic<uint32_t>* SharedWord() {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return new (p) std::atomic<uint32_t>(0);
}

// Ping-pong through one word: 1 is the peer's turn, 2 ours, 3 stop. The
// waits sleep in the kernel (futex) or spin.
constexpr uint32_t kPing = 1, kPong = 2, kStop = 3;

// Spinning yields the core after 50 us without an answer: on an idle
// machine the answer comes long before; on a loaded one a spinner that
// never yields could wait out the other side's whole time slice.
template <bool kSpin>
void AwaitWord(std::atomic<uint32_t>* word, uint32_t want_a, uint32_t want_b) {
  const Clock::time_point yield_after = Clock::now() + std::chrono::microseconds(50);
  for (;;) {
    const uint32_t v = word->load(std::memory_order_acquire);
    if (v == want_a || v == want_b) return;
    if (!kSpin) {
      FutexWait(word, v, absl::InfiniteDuration());
    } else if (Clock::now() < yield_after) {
      CpuRelax();
    } else {
      sched_yield();
    }
  }
}

template <bool kSpin>
Row PingPong(const char* op, int calls) {
  std::atomic<uint32_t>* word = SharedWord();
  const pid_t peer = fork();
  if (peer == 0) {
    PinTo(1);
    for (;;) {
      AwaitWord<kSpin>(word, kPing, kStop);
      if (word->load() == kStop) _exit(0);
      word->store(kPong, std::memory_order_release);
      if (!kSpin) FutexWakeAll(word);
    }
  }
  Row row{op};
  auto round_trip = [&] {
    word->store(kPing, std::memory_order_release);
    if (!kSpin) FutexWakeAll(word);
    AwaitWord<kSpin>(word, kPong, kPong);
  };
  for (int i = 0; i < calls / 10 + 10; ++i) round_trip();  // warm-up
  const double cpu0 = CpuSeconds(peer);
  for (int i = 0; i < calls; ++i) {
    const Clock::time_point t0 = Clock::now();
    round_trip();
    row.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  row.peer_cpu_us_per_call = (CpuSeconds(peer) - cpu0) * 1e6 / calls;
  word->store(kStop, std::memory_order_release);
  FutexWakeAll(word);
  Reap(peer, op);
  munmap(word, 4096);
  Summarize(&row);
  return row;
}

// A fork()ed peer serving `region` with a poller and an echo handler until
// `stop_pipe` closes. Forked before this process starts any thread.
pid_t StartRingPeer(RingRegion* region, int stop_pipe[2]) {
  const pid_t peer = fork();
  if (peer != 0) return peer;
  PinTo(1);
  close(stop_pipe[1]);
  RingReader reader(region);
  auto poller = RingPoller::Create(1);
  if (!poller.ok()) {
    fprintf(stderr, "ring peer: %s\n", poller.status().ToString().c_str());
    _exit(1);
  }
  auto added = (*poller)->Add(&reader, [](RingReader* r, RingRequest request) {
    r->Answer(request.slot, request.seq, absl::StatusCode::kOk, request.bytes).IgnoreError();
  });
  if (!added.ok()) _exit(1);
  char c;
  while (read(stop_pipe[0], &c, 1) > 0) {
  }
  (*poller)->Remove(&reader).IgnoreError();
  poller->reset();
  _exit(0);
}

Row RingCalls(const char* op, int calls, absl::Duration pause) {
  auto region = RingRegion::Create(64);
  if (!region.ok()) {
    fprintf(stderr, "%s\n", region.status().ToString().c_str());
    exit(1);
  }
  int stop_pipe[2];
  if (pipe(stop_pipe) != 0) exit(1);
  const pid_t peer = StartRingPeer(region->get(), stop_pipe);
  close(stop_pipe[0]);
  RingSubmitter submitter(region->get());
  const std::string request(absl::GetFlag(FLAGS_payload), 'r');
  Row row{op};
  auto call = [&] {
    auto answer = submitter.Call(1, request, absl::Seconds(30));
    if (!answer.ok() || answer->bytes != request) {
      fprintf(stderr, "%s: %s\n", op,
              answer.ok() ? "wrong answer" : answer.status().ToString().c_str());
      exit(1);
    }
  };
  for (int i = 0; i < calls / 10 + 10; ++i) call();  // warm-up
  // The peer's CPU over the whole series, so its spin after each answer
  // (in the pause, in the asleep row) is counted too.
  const double cpu0 = CpuSeconds(peer);
  for (int i = 0; i < calls; ++i) {
    if (pause > absl::ZeroDuration()) absl::SleepFor(pause);
    const Clock::time_point t0 = Clock::now();
    call();
    row.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  row.peer_cpu_us_per_call = (CpuSeconds(peer) - cpu0) * 1e6 / calls;
  close(stop_pipe[1]);
  Reap(peer, op);
  Summarize(&row);
  return row;
}

int Run() {
  const int calls = absl::GetFlag(FLAGS_calls);
  const int asleep_calls = absl::GetFlag(FLAGS_asleep_calls);
  const int sleep_us = absl::GetFlag(FLAGS_sleep_us);
  if (calls < 1 || asleep_calls < 1) return 1;
  PinTo(0);
  std::vector<Row> rows;
  rows.push_back(PingPong<false>("futex floor", calls));
  rows.push_back(PingPong<true>("spin floor", calls));
  rows.push_back(RingCalls("ring", calls, absl::ZeroDuration()));
  rows.push_back(RingCalls("ring, asleep", asleep_calls, absl::Microseconds(sleep_us)));
  const double futex = rows[0].p50;
  const unsigned cores = std::thread::hardware_concurrency();
  if (absl::GetFlag(FLAGS_json)) {
    printf("{\"cores\": %u, \"pinned\": %s, \"payload_bytes\": %d, \"sleep_us\": %d, "
           "\"rows\": [\n",
           cores, absl::GetFlag(FLAGS_pin) ? "true" : "false", absl::GetFlag(FLAGS_payload),
           sleep_us);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      printf("  {\"op\": \"%s\", \"n\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f, "
             "\"peer_cpu_us_per_call\": %.3f, \"x_futex_p50\": %.3f}%s\n",
             r.op.c_str(), r.us.size(), r.p50, r.p99, r.peer_cpu_us_per_call, r.p50 / futex,
             i + 1 < rows.size() ? "," : "");
    }
    printf("], \"ring_over_futex_p50\": %.3f, \"ring_asleep_over_futex_p50\": %.3f}\n",
           rows[2].p50 / futex, rows[3].p50 / futex);
  } else {
    printf("%-14s %7s %9s %9s %14s %12s\n", "round trip", "n", "p50 us", "p99 us",
           "peer cpu us", "x futex p50");
    for (const Row& r : rows) {
      printf("%-14s %7zu %9.2f %9.2f %14.2f %12.2f\n", r.op.c_str(), r.us.size(), r.p50, r.p99,
             r.peer_cpu_us_per_call, r.p50 / futex);
    }
    printf("(%u cores%s; %d B each way through the ring; asleep: %d us between calls)\n",
           cores, absl::GetFlag(FLAGS_pin) ? ", the two sides pinned to two of them" : "",
           absl::GetFlag(FLAGS_payload), sleep_us);
  }
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
