// restart_client: a client process that keeps working while its daemon is
// killed and restarted under it (tests/restart/restart_test.cc).
//
//   --mode=work  allocates blocks of random sizes, fills each with a pattern
//                of its own (its id and this process's seed), frees random
//                ones after checking every byte, again and again.
//   --mode=fill  allocates 1 MiB blocks until its tenant's quota refuses,
//                prints "FULL <blocks> <bytes>", then keeps freeing one and
//                taking it back, checking that one more is still refused.
// Both print "CONNECTED" once connected, and time every call. After each
// daemon restart the library came through (Client::restarts), every live
// block is checked in full and it prints
//   RESUMED <restarts> blocks=<n> bytes=<b> lost=<l> pause_ms=<longest call
//   since the last RESUMED line>
// and carries on. It stops when --stop_file exists: checks every block,
// prints "RANGES slab:offset:size,..." (what it holds), waits for
// <stop_file>.free, frees everything (every Free must succeed) and prints
// "DONE allocs=<a> frees=<f>".
// Anything wrong (a byte, a lost block, a failed Free, an unexpected
// refusal) prints "ERROR <what>" and exits 1.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(std::string, mode, "work", "work | fill");
ABSL_FLAG(std::string, stop_file, "", "stop when this file exists");
ABSL_FLAG(uint64_t, seed, 1, "pattern seed");
ABSL_FLAG(int, max_blocks, 24, "work: most blocks held at once");
ABSL_FLAG(uint64_t, max_size, 2 << 20, "work: largest block");

namespace gpumem {
namespace {

using client::Buffer;
using client::Client;

struct Held {
  Buffer buffer;
};

uint64_t Word(uint64_t seed, uint64_t id, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (id << 20) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

[[noreturn]] void Die(const std::string& what) {
  printf("ERROR %s\n", what.c_str());
  fflush(stdout);
  _exit(1);
}

void Fill(const Buffer& b, uint64_t seed) {
  uint64_t* w = static_cast<uint64_t*>(b.data());
  for (uint64_t i = 0; i < b.size() / 8; ++i) w[i] = Word(seed, b.id(), i);
}

void Check(const Buffer& b, uint64_t seed) {
  const uint64_t* w = static_cast<const uint64_t*>(b.data());
  for (uint64_t i = 0; i < b.size() / 8; ++i) {
    if (w[i] != Word(seed, b.id(), i)) {
      Die(absl::StrCat("block ", b.id(), " (slab ", b.allocation().slab_id(), " offset ",
                       b.allocation().offset(), ") byte ", i * 8, " changed"));
    }
  }
}

int Run() {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  const bool fill = absl::GetFlag(FLAGS_mode) == "fill";
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) Die(absl::StrCat("connect: ", c.status().ToString()));
  printf("CONNECTED\n");
  fflush(stdout);
  Client& client = **c;
  std::atomic<uint64_t> lost{0};
  client.OnRestart([&lost](const Client::RestartReport& r) { lost += r.lost.size(); });

  std::mt19937_64 rng(seed);
  std::vector<Held> held;
  uint64_t allocs = 0, frees = 0, reported = 0;
  absl::Duration longest;
  auto timed = [&longest](auto&& call) {
    const absl::Time t = absl::Now();
    auto r = call();
    longest = std::max(longest, absl::Now() - t);
    return r;
  };
  auto allocate = [&](uint64_t size) -> absl::StatusOr<Buffer> {
    return timed([&] { return client.Allocate(size); });
  };
  auto free_at = [&](size_t i) {
    Check(held[i].buffer, seed);
    const uint64_t id = held[i].buffer.id();
    absl::Status s = timed([&] { return held[i].buffer.Free(); });
    if (!s.ok()) Die(absl::StrCat("free of ", id, ": ", s.ToString()));
    held.erase(held.begin() + static_cast<long>(i));
    ++frees;
  };
  auto stopped = [&stop_file] {
    struct stat st;
    return !stop_file.empty() && stat(stop_file.c_str(), &st) == 0;
  };

  if (fill) {
    for (;;) {
      absl::StatusOr<Buffer> b = allocate(1 << 20);
      if (!b.ok()) {
        if (b.status().code() != absl::StatusCode::kResourceExhausted) {
          Die(absl::StrCat("fill: ", b.status().ToString()));
        }
        break;
      }
      Fill(*b, seed);
      held.push_back({*std::move(b)});
      ++allocs;
    }
    printf("FULL %zu %zu\n", held.size(), held.size() << 20);
    fflush(stdout);
  }

  while (!stopped()) {
    if (client.restarts() > reported) {
      reported = client.restarts();
      uint64_t bytes = 0;
      for (const Held& h : held) {
        Check(h.buffer, seed);
        bytes += h.buffer.size();
      }
      if (lost.load() != 0) Die(absl::StrCat(lost.load(), " block(s) lost at a restart"));
      printf("RESUMED %zu blocks=%zu bytes=%zu lost=%zu pause_ms=%.1f\n",
             static_cast<size_t>(reported), held.size(), static_cast<size_t>(bytes),
             static_cast<size_t>(lost.load()), absl::ToDoubleMilliseconds(longest));
      fflush(stdout);
      longest = absl::ZeroDuration();
    }
    if (fill) {
      // At its quota: one block given back and taken again; one more never.
      if (!held.empty()) free_at(rng() % held.size());
      absl::StatusOr<Buffer> again = allocate(1 << 20);
      if (!again.ok()) Die(absl::StrCat("fill: retake refused: ", again.status().ToString()));
      Fill(*again, seed);
      held.push_back({*std::move(again)});
      ++allocs;
      absl::StatusOr<Buffer> extra = allocate(1 << 20);
      if (extra.ok() || extra.status().code() != absl::StatusCode::kResourceExhausted) {
        Die(absl::StrCat("fill: past its quota: ", extra.status().ToString()));
      }
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    const bool grow = held.size() < static_cast<size_t>(absl::GetFlag(FLAGS_max_blocks)) &&
                      (held.empty() || rng() % 10 < 6);
    if (grow) {
      const uint64_t size = 4096 * (1 + rng() % (absl::GetFlag(FLAGS_max_size) / 4096));
      absl::StatusOr<Buffer> b = allocate(size);
      if (!b.ok()) {
        if (b.status().code() == absl::StatusCode::kResourceExhausted) continue;
        Die(absl::StrCat("allocate: ", b.status().ToString()));
      }
      Fill(*b, seed);
      held.push_back({*std::move(b)});
      ++allocs;
    } else {
      free_at(rng() % held.size());
    }
  }
  std::vector<std::string> ranges;
  for (const Held& h : held) {
    Check(h.buffer, seed);
    const v1::Allocation& a = h.buffer.allocation();
    ranges.push_back(absl::StrCat(a.slab_id(), ":", a.offset(), ":", a.size_bytes()));
  }
  printf("RANGES %s\n", absl::StrJoin(ranges, ",").c_str());
  fflush(stdout);
  // The test compares the daemon's figures with every client's first.
  const std::string go = stop_file + ".free";
  for (struct stat st; stat(go.c_str(), &st) != 0;) absl::SleepFor(absl::Milliseconds(5));
  while (!held.empty()) free_at(held.size() - 1);
  printf("DONE allocs=%zu frees=%zu\n", static_cast<size_t>(allocs),
         static_cast<size_t>(frees));
  fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
