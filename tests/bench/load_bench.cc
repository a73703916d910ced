// load_bench: gpumemd under load from many client processes, against the
// gRPC floor, side by side in one run.
//
//   bazel run -c opt //tests/bench:load_bench [-- --json] [--soak_seconds=60]
//
// It starts its own gpumemd (sim backend, 4 devices) and a FloorServer
// (floor_server.h: the same service and message shapes with canned answers)
// on private sockets. For each client count of --clients it runs, one after
// the other, floor and daemon over the stream and over unary: N client
// processes (this binary, --role=client), each doing warm Allocate+Free
// pairs of --size bytes for --seconds, all starting at the same instant.
// Per row: pairs/s, p50/p99/p999 µs per pair, errors, the server process's
// CPU per pair ("cpu us") and context switches of its threads per pair
// ("cs"), and for daemon rows the ratios to the floor row of the same
// transport and client count.
//
// Then:
//  - anatomy (--anatomy): one client, unary and stream, against a floor
//    whose connections come from gRPC's own listening port ("floor"), one
//    whose connections it accepts itself and hands over by fd as gpumemd
//    does ("floor_fd"), for unary one serving Allocate and Free async from
//    its completion queue ("floor_async"), and the daemon: where a unary
//    call's time goes.
//  - soak: 16 clients on the daemon's stream for --soak_seconds; the
//    daemon's RSS at the start (clients connected and warm) and at the end.
//  - scale (--scale_blocks > 0): a second daemon with --scale_devices
//    devices; GetStats p50/p99 empty and with --scale_blocks live 4 KiB
//    blocks (held by 4 filler processes), daemon RSS per live block, and the
//    time until the blocks are reclaimed once the fillers are killed.
// --baseline_daemon=PATH: a second gpumemd (an earlier build) is started
// beside the first with the same flags, and every load and anatomy row of
// "daemon" is followed by the same row against it ("baseline"), so a change
// is measured side by side in one run; the summary gives after/before for
// the 4-client stream pairs/s ratio to the floor and the 1-client stream
// p50 ratio. --baseline_first runs each baseline row before its daemon row
// (alternate it between runs so that neither side always goes first).
// --ledger_compare: instead of the above, the ledger's cost side by side: a
// second gpumemd with --ledger=none beside the first (ledger on, its file
// in the daemon's private directory), and for each client count
// --ledger_rounds rounds of one stream row against each ("daemon",
// "no_ledger"; the order alternates by round), section "ledger". Each row
// carries the 1-minute load average when it started (the machine may be
// shared). The summary gives, per count and round, on/off ratios of pairs/s,
// p999 and daemon CPU per pair, their spread over the rounds, and the same
// three pooled over all rounds (every pair's time in one p999, all CPU over
// all pairs): the figure to read on a shared machine. Then
// (--replay_seconds > 0) --soak_clients clients run on the ledger daemon for
// that long at full rate; the daemon is stopped and its ledger replayed:
// folding every event in order must give exactly the usage table (current,
// peak, byte-seconds, per tenant and device); the run fails otherwise.
// With --baseline_daemon both daemons of --ledger_compare are that binary
// (an earlier build's ledger cost, for before/after).
// Every daemon runs with the installed defaults (1 GiB slabs, 30 s empty
// slab release, no lock-order checking) except the flags a row's label
// names; --daemon_flags adds to all load rows.
// --json prints everything as one JSON object instead of tables.
#include <dirent.h>
#include <sqlite3.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/lib/cpp/stream_transport.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "server/ledger/usage_account.h"
#include "tests/bench/floor_server.h"
#include "tests/integration/daemon_fixture.h"

ABSL_FLAG(std::string, clients, "1,4,16,64", "client process counts");
ABSL_FLAG(double, seconds, 3, "measured seconds per row");
ABSL_FLAG(double, soak_seconds, 60, "seconds of the 16-client soak (0: none)");
ABSL_FLAG(int, soak_clients, 16, "client processes of the soak");
ABSL_FLAG(uint64_t, size, 64 << 10, "bytes per allocation");
ABSL_FLAG(bool, anatomy, true, "also time one client against each server shape");
ABSL_FLAG(uint64_t, scale_blocks, 0,
          "live blocks of the scale section (0: skip it; the issue's figure is 1000000)");
ABSL_FLAG(int, scale_devices, 64, "simulated devices of the scale section");
ABSL_FLAG(int, stream_threads, 1, "the daemon's --stream_threads");
ABSL_FLAG(std::string, daemon_flags, "",
          "extra gpumemd flags for the load rows, space-separated (e.g. --ledger=none)");
ABSL_FLAG(std::string, baseline_daemon, "",
          "another gpumemd binary to measure beside this one (rows \"baseline\")");
ABSL_FLAG(bool, baseline_first, false,
          "with --baseline_daemon: each baseline row before its daemon row");
ABSL_FLAG(bool, ledger_compare, false,
          "measure ledger on against --ledger=none instead (see the file's comment)");
ABSL_FLAG(int, ledger_rounds, 3, "--ledger_compare: rounds per client count");
ABSL_FLAG(double, replay_seconds, 0,
          "--ledger_compare: then run this long at full rate and replay the ledger (0: skip)");
ABSL_FLAG(bool, json, false, "print JSON");
// Internal: how this binary runs as a child of itself.
ABSL_FLAG(std::string, role, "driver",
          "driver | floor | floor_fd | floor_async | client | filler");
ABSL_FLAG(std::string, target, "", "client/filler: the server's socket");
ABSL_FLAG(std::string, transport, "stream", "client: stream | unary");
ABSL_FLAG(std::string, out, "", "client: file for the per-pair samples");
ABSL_FLAG(std::string, go_file, "", "client: holds the start time once all are ready");
ABSL_FLAG(uint64_t, count, 0, "filler: blocks to allocate and hold");

namespace gpumem {
using client::StreamTransport;
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch()).count();
}

std::shared_ptr<grpc::Channel> Dial(const std::string& socket) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(),
                                   args);
}

// ---- client role -------------------------------------------------------

// One Allocate+Free pair over the chosen transport.
class PairRunner {
 public:
  PairRunner(const std::string& socket, bool stream)
      : stub_(v1::GpuMemory::NewStub(Dial(socket))) {
    if (stream) stream_ = std::make_unique<StreamTransport>(stub_.get());
    alloc_.set_size_bytes(absl::GetFlag(FLAGS_size));
  }

  // Empty on success, else the first failure's words.
  std::string Pair() {
    uint64_t id = 0;
    if (stream_ != nullptr) {
      absl::StatusOr<v1::AllocateResponse> a = stream_->Allocate(alloc_);
      if (!a.ok()) return a.status().ToString();
      id = a->allocations(0).id();
      v1::FreeRequest f;
      f.set_id(id);
      absl::StatusOr<v1::FreeResponse> r = stream_->Free(f);
      return r.ok() ? "" : r.status().ToString();
    }
    v1::AllocateResponse a;
    {
      grpc::ClientContext ctx;
      grpc::Status s = stub_->Allocate(&ctx, alloc_, &a);
      if (!s.ok()) return absl::StrCat("Allocate: ", s.error_code(), " ", s.error_message());
    }
    if (a.allocations_size() == 0) return "Allocate: no allocation";
    v1::FreeRequest f;
    f.set_id(a.allocations(0).id());
    v1::FreeResponse r;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Free(&ctx, f, &r);
    return s.ok() ? "" : absl::StrCat("Free: ", s.error_code(), " ", s.error_message());
  }

  StreamTransport* stream() { return stream_.get(); }

 private:
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
  std::unique_ptr<StreamTransport> stream_;
  v1::AllocateRequest alloc_;
};

// Waits for the driver's go file and returns the start time it holds.
int64_t WaitForGo(const std::string& path) {
  for (;;) {
    std::ifstream in(path);
    int64_t start = 0;
    if (in >> start) return start;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int RunClient() {
  PairRunner runner(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_transport) == "stream");
  for (int i = 0; i < 100; ++i) {  // warm: channel, stream, slabs
    std::string e = runner.Pair();
    if (!e.empty()) {
      printf("failed warm-up: %s\n", e.c_str());
      return 1;
    }
  }
  printf("ready\n");
  fflush(stdout);
  const int64_t start = WaitForGo(absl::GetFlag(FLAGS_go_file));
  const int64_t end = start + static_cast<int64_t>(absl::GetFlag(FLAGS_seconds) * 1e9);
  while (NowNs() < start) {
  }
  std::vector<float> us;
  us.reserve(1 << 16);
  uint64_t errors = 0;
  std::string first_error;
  for (int64_t t0 = NowNs(); t0 < end;) {
    std::string e = runner.Pair();
    int64_t t1 = NowNs();
    if (e.empty()) {
      us.push_back(static_cast<float>((t1 - t0) / 1e3));
    } else if (errors++ == 0) {
      first_error = e;
    }
    t0 = t1;
  }
  FILE* f = fopen(absl::GetFlag(FLAGS_out).c_str(), "wb");
  if (f == nullptr || fwrite(us.data(), sizeof(float), us.size(), f) != us.size()) {
    printf("failed to write samples\n");
    return 1;
  }
  fclose(f);
  printf("done %zu %llu %s\n", us.size(), static_cast<unsigned long long>(errors),
         first_error.c_str());
  fflush(stdout);
  return 0;
}

// ---- filler role (scale section) ----------------------------------------

int RunFiller() {
  auto stub = v1::GpuMemory::NewStub(Dial(absl::GetFlag(FLAGS_target)));
  StreamTransport stream(stub.get());
  v1::AllocateRequest req;
  req.set_size_bytes(4096);
  uint64_t errors = 0;
  const uint64_t count = absl::GetFlag(FLAGS_count);
  for (uint64_t i = 0; i < count; ++i) {
    if (!stream.Allocate(req).ok()) ++errors;
  }
  printf("filled %llu %llu\n", static_cast<unsigned long long>(count - errors),
         static_cast<unsigned long long>(errors));
  fflush(stdout);
  pause();  // holds the blocks until killed
  return 0;
}

// ---- driver -------------------------------------------------------------

using testing::ProcessCpuSeconds;

// Context switches (voluntary + involuntary) of all of a process's threads.
uint64_t ProcessSwitches(pid_t pid) {
  uint64_t total = 0;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(absl::StrCat(tasks, "/", e->d_name, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      uint64_t n = 0;
      const size_t colon = line.find(':');
      if (colon != std::string::npos && absl::EndsWith(line.substr(0, colon), "ctxt_switches") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(colon + 1)), &n)) {
        total += n;
      }
    }
  }
  closedir(d);
  return total;
}

// Resident set of a process, bytes.
uint64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    uint64_t kb = 0;
    if (line.rfind("VmRSS:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(
                             absl::StripSuffix(line.substr(6), "kB")), &kb)) {
      return kb * 1024;
    }
  }
  return 0;
}

double Quantile(const std::vector<float>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[static_cast<size_t>(q * (sorted.size() - 1))];
}

struct Row {
  std::string section = "load";  // load | anatomy | soak
  std::string target;            // floor | floor_fd | floor_async | daemon | baseline
  std::string transport;         // stream | unary
  int clients = 0;
  uint64_t pairs = 0, errors = 0;
  std::string first_error;
  double seconds = 0, pairs_per_s = 0, p50 = 0, p99 = 0, p999 = 0;
  double cpu_us_per_pair = 0;  // of the server process
  double switches_per_pair = 0;  // of the server process's threads
  uint64_t rss_start = 0, rss_end = 0;
  // Daemon rows: ratio to the floor row of the same transport and count.
  double x_floor_pairs = 0, x_floor_p50 = 0;
  double load1 = 0;  // the 1-minute load average when the row started
  double cpu_seconds = 0;      // of the server process, over the row
  double writer_cpu_seconds = 0;  // of its ledger writer thread (gpumemd-ledger)
  std::vector<float> samples;  // µs per pair, sorted (ledger rows only)
};

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

class Driver {
 public:
  explicit Driver(std::string self) : self_(std::move(self)), dir_(testing::MakeTempDir()) {}

  // N client processes against `socket` (served by process `server`).
  Row RunPhase(const std::string& target, const std::string& socket, pid_t server,
               const std::string& transport, int n, double seconds) {
    Row row;
    row.target = target;
    row.transport = transport;
    row.clients = n;
    row.seconds = seconds;
    row.load1 = LoadAverage();
    const std::string go = absl::StrCat(dir_, "/go-", ++phase_);
    std::vector<std::unique_ptr<testing::ChildProcess>> kids;
    std::vector<std::string> outs;
    for (int i = 0; i < n; ++i) {
      outs.push_back(absl::StrCat(dir_, "/samples-", phase_, "-", i));
      kids.push_back(std::make_unique<testing::ChildProcess>(std::vector<std::string>{
          self_, "--role=client", "--target=" + socket, "--transport=" + transport,
          "--out=" + outs.back(), "--go_file=" + go,
          absl::StrCat("--seconds=", seconds), absl::StrCat("--size=", absl::GetFlag(FLAGS_size))}));
    }
    for (auto& k : kids) {
      std::string line = k->ReadLine(120000);
      if (line != "ready") {
        row.errors += 1;
        if (row.first_error.empty()) row.first_error = "client not ready: " + line;
      }
    }
    const int64_t start = NowNs() + 20'000'000;
    {
      std::ofstream tmp(go + ".tmp");
      tmp << start << "\n";
    }
    rename((go + ".tmp").c_str(), go.c_str());
    while (NowNs() < start) std::this_thread::sleep_for(std::chrono::microseconds(200));
    const double cpu0 = ProcessCpuSeconds(server);
    const double writer0 = ProcessCpuSeconds(server, "gpumemd-ledger");
    const uint64_t switches0 = ProcessSwitches(server);
    row.rss_start = RssBytes(server);
    std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)));
    const double cpu1 = ProcessCpuSeconds(server);
    const double writer1 = ProcessCpuSeconds(server, "gpumemd-ledger");
    const uint64_t switches1 = ProcessSwitches(server);
    row.rss_end = RssBytes(server);
    std::vector<float> all;
    for (size_t i = 0; i < kids.size(); ++i) {
      std::string line = kids[i]->ReadLine(static_cast<int>(seconds * 1000) + 60000);
      std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      uint64_t errs = 0;
      if (f.size() < 3 || f[0] != "done" || !absl::SimpleAtoi(f[2], &errs)) {
        row.errors += 1;
        if (row.first_error.empty()) row.first_error = "client failed: " + line;
        continue;
      }
      row.errors += errs;
      if (errs > 0 && row.first_error.empty() && f.size() > 3) row.first_error = f[3];
      std::ifstream in(outs[i], std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      size_t k = bytes.size() / sizeof(float);
      size_t at = all.size();
      all.resize(at + k);
      memcpy(all.data() + at, bytes.data(), k * sizeof(float));
      unlink(outs[i].c_str());
      kids[i]->Wait();
    }
    unlink(go.c_str());
    std::sort(all.begin(), all.end());
    if (keep_samples_) row.samples = all;
    row.pairs = all.size();
    row.pairs_per_s = all.size() / seconds;
    row.p50 = Quantile(all, 0.5);
    row.p99 = Quantile(all, 0.99);
    row.p999 = Quantile(all, 0.999);
    row.cpu_seconds = cpu1 - cpu0;
    row.writer_cpu_seconds = writer1 - writer0;
    if (!all.empty()) {
      row.cpu_us_per_pair = (cpu1 - cpu0) * 1e6 / all.size();
      row.switches_per_pair = static_cast<double>(switches1 - switches0) / all.size();
    }
    return row;
  }

  const std::string& dir() const { return dir_; }
  const std::string& self() const { return self_; }
  // Rows keep their samples (for figures pooled over rounds).
  void KeepSamples(bool keep) { keep_samples_ = keep; }

 private:
  std::string self_;
  std::string dir_;
  int phase_ = 0;
  bool keep_samples_ = false;
};

struct ScaleFigures {
  uint64_t blocks = 0, errors = 0;
  int devices = 0;
  double fill_seconds = 0;
  double stats_p50_empty_ms = 0, stats_p99_empty_ms = 0;
  double stats_p50_full_ms = 0, stats_p99_full_ms = 0;
  uint64_t rss_empty = 0, rss_full = 0;
  double bytes_per_block = 0;
  double reclaim_seconds = 0;
};

std::pair<double, double> TimeGetStats(v1::GpuMemory::Stub* stub, int n) {
  std::vector<float> ms;
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    auto t0 = Clock::now();
    if (!stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok()) continue;
    ms.push_back(std::chrono::duration<float, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {Quantile(ms, 0.5), Quantile(ms, 0.99)};
}

uint64_t LiveAllocations(v1::GpuMemory::Stub* stub) {
  grpc::ClientContext ctx;
  v1::GetStatsResponse resp;
  if (!stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok()) return ~0ull;
  uint64_t n = 0;
  for (const auto& d : resp.devices()) n += d.allocation_count();
  return n;
}

bool RunScale(const Driver& driver, ScaleFigures* out) {
  const uint64_t blocks = absl::GetFlag(FLAGS_scale_blocks);
  const int devices = absl::GetFlag(FLAGS_scale_devices);
  // Not the defaults, and said so in the section's label: 256 MiB slabs and
  // empty slabs kept for an hour, so that the section's figures (GetStats
  // over a million live blocks, RSS per block, the reclaim after the fillers
  // are killed) are not mixed with slab creation and release.
  testing::DaemonProcess daemon({absl::StrCat("--sim_devices=", devices, "x16GiB"),
                                 "--slab_size=256MiB", "--empty_slab_release_seconds=3600",
                                 "--mutex_deadlock_detection=false"});
  if (!daemon.Start()) return false;
  auto stub = v1::GpuMemory::NewStub(Dial(daemon.socket()));
  out->blocks = blocks;
  out->devices = devices;
  TimeGetStats(stub.get(), 20);  // warm
  std::tie(out->stats_p50_empty_ms, out->stats_p99_empty_ms) = TimeGetStats(stub.get(), 200);
  out->rss_empty = RssBytes(daemon.pid());
  constexpr int kFillers = 4;
  std::vector<std::unique_ptr<testing::ChildProcess>> fillers;
  auto t0 = Clock::now();
  for (int i = 0; i < kFillers; ++i) {
    uint64_t share = blocks / kFillers + (i < static_cast<int>(blocks % kFillers) ? 1 : 0);
    fillers.push_back(std::make_unique<testing::ChildProcess>(std::vector<std::string>{
        driver.self(), "--role=filler", "--target=" + daemon.socket(),
        absl::StrCat("--count=", share)}));
  }
  for (auto& f : fillers) {
    std::vector<std::string> w = absl::StrSplit(f->ReadLine(1800000), ' ');
    uint64_t errs = 1;
    if (w.size() != 3 || w[0] != "filled" || !absl::SimpleAtoi(w[2], &errs)) errs = 1;
    out->errors += errs;
  }
  out->fill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::tie(out->stats_p50_full_ms, out->stats_p99_full_ms) = TimeGetStats(stub.get(), 200);
  out->rss_full = RssBytes(daemon.pid());
  if (blocks > 0) {
    out->bytes_per_block =
        (static_cast<double>(out->rss_full) - static_cast<double>(out->rss_empty)) / blocks;
  }
  auto k0 = Clock::now();
  for (auto& f : fillers) f->Kill(SIGKILL);
  for (auto& f : fillers) f->Wait();
  while (LiveAllocations(stub.get()) != 0 &&
         Clock::now() - k0 < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out->reclaim_seconds = std::chrono::duration<double>(Clock::now() - k0).count();
  return daemon.Stop() == 0;
}

std::string Json(const std::vector<Row>& rows, const ScaleFigures* scale) {
  std::vector<std::string> items;
  for (const Row& r : rows) {
    items.push_back(absl::StrFormat(
        "{\"section\":\"%s\",\"target\":\"%s\",\"transport\":\"%s\",\"clients\":%d,"
        "\"pairs\":%d,\"errors\":%d,\"seconds\":%.2f,\"pairs_per_s\":%.1f,"
        "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"server_cpu_us_per_pair\":%.2f,"
        "\"server_switches_per_pair\":%.2f,\"rss_start_bytes\":%d,\"rss_end_bytes\":%d,\"x_floor_pairs_per_s\":%.3f,"
        "\"x_floor_p50\":%.3f,\"load1\":%.2f}",
        r.section, r.target, r.transport, r.clients, r.pairs, r.errors, r.seconds,
        r.pairs_per_s, r.p50, r.p99, r.p999, r.cpu_us_per_pair, r.switches_per_pair, r.rss_start, r.rss_end,
        r.x_floor_pairs, r.x_floor_p50, r.load1));
  }
  std::string s = absl::StrCat("{\"rows\":[", absl::StrJoin(items, ","), "]");
  if (scale != nullptr) {
    absl::StrAppendFormat(
        &s,
        ",\"scale\":{\"daemon_flags\":\"--slab_size=256MiB --empty_slab_release_seconds=3600\","
        "\"devices\":%d,\"live_blocks\":%d,\"errors\":%d,\"fill_seconds\":%.1f,"
        "\"get_stats_empty_p50_ms\":%.3f,\"get_stats_empty_p99_ms\":%.3f,"
        "\"get_stats_p50_ms\":%.3f,\"get_stats_p99_ms\":%.3f,\"rss_empty_bytes\":%d,"
        "\"rss_full_bytes\":%d,\"rss_bytes_per_live_block\":%.1f,\"reclaim_seconds\":%.3f}",
        scale->devices, scale->blocks, scale->errors, scale->fill_seconds,
        scale->stats_p50_empty_ms, scale->stats_p99_empty_ms, scale->stats_p50_full_ms,
        scale->stats_p99_full_ms, scale->rss_empty, scale->rss_full, scale->bytes_per_block,
        scale->reclaim_seconds);
  }
  return s + "}";
}

void PrintRow(const Row& r) {
  printf("%-8s %-11s %-6s %4d %10.0f %8.1f %8.1f %9.1f %7llu %8.1f %6.2f", r.section.c_str(),
         r.target.c_str(), r.transport.c_str(), r.clients, r.pairs_per_s, r.p50, r.p99,
         r.p999, static_cast<unsigned long long>(r.errors), r.cpu_us_per_pair,
         r.switches_per_pair);
  if ((r.target == "daemon" || r.target == "baseline") && r.x_floor_pairs > 0) {
    printf("   %5.2fx %5.2fx", r.x_floor_pairs, r.x_floor_p50);
  }
  printf("\n");
  if (!r.first_error.empty()) printf("         first error: %s\n", r.first_error.c_str());
}


// ---- ledger on against off ----------------------------------------------

// Folds every event of the ledger file at `path` in order and compares the
// result with its usage table, row by row, exactly. Empty when equal, else
// what differs. A tenant whose churn past the ledger's cap was folded into
// `retained` (pairs counted, not stored as events: in a run this short,
// nothing else is retained) has its current bytes compared exactly and its
// peak, byte-seconds and last update as at least the replayed ones: the
// folded pairs add to those, and no event says by how much.
std::string ReplayLedger(const std::string& path, uint64_t* events, size_t* rows) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return "cannot open " + path;
  }
  std::string problem;
  ledger::UsageAccount replayed;
  sqlite3_stmt* q = nullptr;
  sqlite3_prepare_v2(db, "SELECT time_ns, kind, tenant, device, bytes FROM events ORDER BY seq",
                     -1, &q, nullptr);
  *events = 0;
  while (q != nullptr && sqlite3_step(q) == SQLITE_ROW) {
    ledger::LedgerEvent e;
    e.time_ns = sqlite3_column_int64(q, 0);
    auto kind = ledger::KindFromName(reinterpret_cast<const char*>(sqlite3_column_text(q, 1)));
    if (!kind) {
      problem = "an event of unknown kind";
      break;
    }
    e.kind = *kind;
    e.tenant = reinterpret_cast<const char*>(sqlite3_column_text(q, 2));
    e.device = sqlite3_column_int(q, 3);
    e.bytes = sqlite3_column_int64(q, 4);
    replayed.Apply(e);
    ++*events;
  }
  sqlite3_finalize(q);
  std::set<std::string> folded;
  sqlite3_prepare_v2(db, "SELECT DISTINCT tenant FROM retained", -1, &q, nullptr);
  while (q != nullptr && sqlite3_step(q) == SQLITE_ROW) {
    folded.insert(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)));
  }
  sqlite3_finalize(q);
  std::map<ledger::UsageAccount::Key, ledger::UsageRow> stored;
  sqlite3_prepare_v2(db, "SELECT tenant, device, current_bytes, peak_bytes, byte_seconds, "
                     "updated_ns FROM usage", -1, &q, nullptr);
  while (q != nullptr && sqlite3_step(q) == SQLITE_ROW) {
    ledger::UsageRow r;
    r.current_bytes = sqlite3_column_int64(q, 2);
    r.peak_bytes = sqlite3_column_int64(q, 3);
    r.byte_seconds = sqlite3_column_double(q, 4);
    r.updated_ns = sqlite3_column_int64(q, 5);
    stored[{reinterpret_cast<const char*>(sqlite3_column_text(q, 0)),
            sqlite3_column_int(q, 1)}] = r;
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  *rows = stored.size();
  if (!problem.empty()) return problem;
  if (stored.size() != replayed.rows().size()) {
    return absl::StrCat(stored.size(), " usage rows stored, ", replayed.rows().size(),
                        " from the events");
  }
  for (const auto& [key, want] : replayed.rows()) {
    auto it = stored.find(key);
    if (it == stored.end()) return absl::StrCat("no usage row for ", key.first, "/", key.second);
    const ledger::UsageRow& got = it->second;
    const bool differs =
        folded.count(key.first) != 0
            ? got.current_bytes != want.current_bytes || got.peak_bytes < want.peak_bytes ||
                  got.byte_seconds < want.byte_seconds || got.updated_ns < want.updated_ns
            : got.current_bytes != want.current_bytes || got.peak_bytes != want.peak_bytes ||
                  got.byte_seconds != want.byte_seconds || got.updated_ns != want.updated_ns;
    if (differs) {
      return absl::StrFormat(
          "%s/%d: stored current %d peak %d byte-seconds %.17g, replayed %d %d %.17g",
          key.first, key.second, got.current_bytes, got.peak_bytes, got.byte_seconds,
          want.current_bytes, want.peak_bytes, want.byte_seconds);
    }
  }
  return "";
}

struct Spread {
  double lo = 0, hi = 0;
  void Add(double v, bool first) {
    if (first || v < lo) lo = v;
    if (first || v > hi) hi = v;
  }
};

int RunLedgerCompare(Driver& driver, const std::vector<std::string>& args, bool json) {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  testing::DaemonProcess on(args);
  std::vector<std::string> off_args = args;
  off_args.push_back("--ledger=none");
  testing::DaemonProcess off(off_args);
  if (const std::string b = absl::GetFlag(FLAGS_baseline_daemon); !b.empty()) {
    on.SetBinary(b);  // an earlier build's ledger cost
    off.SetBinary(b);
  }
  if (!on.Start() || !off.Start()) {
    fprintf(stderr, "load_bench: a daemon did not start:\n%s%s", on.Log().c_str(),
            off.Log().c_str());
    return 1;
  }
  std::vector<int> counts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_clients), ',')) {
    int v = 0;
    if (absl::SimpleAtoi(c, &v) && v > 0) counts.push_back(v);
  }
  if (!json) {
    printf("%-8s %-11s %-6s %4s %10s %8s %8s %9s %7s %8s %6s\n", "section", "target", "via",
           "N", "pairs/s", "p50 us", "p99 us", "p999 us", "errors", "cpu us", "cs");
  }
  std::vector<Row> rows;
  std::vector<std::string> ratios_json, pooled_json;
  std::vector<std::string> summary;
  const int rounds = std::max(1, absl::GetFlag(FLAGS_ledger_rounds));
  driver.KeepSamples(true);
  for (int c : counts) {
    Spread pairs, p999, cpu;
    // Pooled over the rounds: every pair's time, all CPU over all pairs.
    std::vector<float> on_all, off_all;
    double on_cpu = 0, off_cpu = 0, on_writer = 0, off_writer = 0;
    for (int r = 0; r < rounds; ++r) {
      Row d, n;
      auto run_on = [&] {
        d = driver.RunPhase("daemon", on.socket(), on.pid(), "stream", c, seconds);
      };
      auto run_off = [&] {
        n = driver.RunPhase("no_ledger", off.socket(), off.pid(), "stream", c, seconds);
      };
      if (r % 2 == 0) {
        run_on();
        run_off();
      } else {
        run_off();
        run_on();
      }
      on_all.insert(on_all.end(), d.samples.begin(), d.samples.end());
      off_all.insert(off_all.end(), n.samples.begin(), n.samples.end());
      on_cpu += d.cpu_seconds;
      off_cpu += n.cpu_seconds;
      on_writer += d.writer_cpu_seconds;
      off_writer += n.writer_cpu_seconds;
      for (Row* x : {&d, &n}) {
        x->section = "ledger";
        x->samples.clear();
        if (!json) PrintRow(*x);
        rows.push_back(*x);
      }
      if (!json) printf("         load %.2f / %.2f\n", d.load1, n.load1);
      const double xp = n.pairs_per_s > 0 ? d.pairs_per_s / n.pairs_per_s : 0;
      const double x999 = n.p999 > 0 ? d.p999 / n.p999 : 0;
      const double xcpu = n.cpu_us_per_pair > 0 ? d.cpu_us_per_pair / n.cpu_us_per_pair : 0;
      pairs.Add(xp, r == 0);
      p999.Add(x999, r == 0);
      cpu.Add(xcpu, r == 0);
      ratios_json.push_back(absl::StrFormat(
          "{\"clients\":%d,\"round\":%d,\"pairs_per_s\":%.3f,\"p999\":%.3f,"
          "\"cpu_per_pair\":%.3f,\"load1\":%.2f}",
          c, r, xp, x999, xcpu, d.load1));
      summary.push_back(absl::StrFormat(
          "ledger on/off, %d stream client(s), round %d: pairs/s %.3fx, p999 %.3fx, "
          "daemon cpu/pair %.3fx (load %.2f)",
          c, r + 1, xp, x999, xcpu, d.load1));
    }
    summary.push_back(absl::StrFormat(
        "ledger on/off, %d stream client(s), spread over %d rounds: pairs/s %.3f-%.3fx, "
        "p999 %.3f-%.3fx, daemon cpu/pair %.3f-%.3fx",
        c, rounds, pairs.lo, pairs.hi, p999.lo, p999.hi, cpu.lo, cpu.hi));
    std::sort(on_all.begin(), on_all.end());
    std::sort(off_all.begin(), off_all.end());
    const double pooled_pairs =
        off_all.empty() ? 0 : static_cast<double>(on_all.size()) / off_all.size();
    const double pooled_999 = Quantile(off_all, 0.999) > 0
                                  ? Quantile(on_all, 0.999) / Quantile(off_all, 0.999)
                                  : 0;
    const double pooled_cpu = on_all.empty() || off_cpu <= 0
                                  ? 0
                                  : (on_cpu / on_all.size()) / (off_cpu / off_all.size());
    summary.push_back(absl::StrFormat(
        "ledger on/off, %d stream client(s), all %d rounds pooled: pairs/s %.3fx, "
        "p999 %.3fx (%.1f / %.1f us), daemon cpu/pair %.3fx (%.2f / %.2f us)",
        c, rounds, pooled_pairs, pooled_999, Quantile(on_all, 0.999), Quantile(off_all, 0.999),
        pooled_cpu, on_all.empty() ? 0 : on_cpu * 1e6 / on_all.size(),
        off_all.empty() ? 0 : off_cpu * 1e6 / off_all.size()));
    summary.push_back(absl::StrFormat(
        "  of which the ledger writer thread: %.2f / %.2f us per pair; the rest %.2f / %.2f us",
        on_all.empty() ? 0 : on_writer * 1e6 / on_all.size(),
        off_all.empty() ? 0 : off_writer * 1e6 / off_all.size(),
        on_all.empty() ? 0 : (on_cpu - on_writer) * 1e6 / on_all.size(),
        off_all.empty() ? 0 : (off_cpu - off_writer) * 1e6 / off_all.size()));
    pooled_json.push_back(absl::StrFormat(
        "{\"clients\":%d,\"rounds\":%d,\"pairs_per_s\":%.3f,\"p999\":%.3f,"
        "\"cpu_per_pair\":%.3f,\"on_cpu_us_per_pair\":%.3f,\"off_cpu_us_per_pair\":%.3f,"
        "\"on_writer_us_per_pair\":%.3f}",
        c, rounds, pooled_pairs, pooled_999, pooled_cpu,
        on_all.empty() ? 0 : on_cpu * 1e6 / on_all.size(),
        off_all.empty() ? 0 : off_cpu * 1e6 / off_all.size(),
        on_all.empty() ? 0 : on_writer * 1e6 / on_all.size()));
  }
  off.Stop();
  std::string replay_json;
  int failed = 0;
  const double replay = absl::GetFlag(FLAGS_replay_seconds);
  if (replay > 0) {
    Row s = driver.RunPhase("daemon", on.socket(), on.pid(), "stream",
                            absl::GetFlag(FLAGS_soak_clients), replay);
    s.section = "replay";
    if (!json) PrintRow(s);
    rows.push_back(s);
  }
  const std::string ledger_path = on.dir() + "/ledger.db";
  if (on.Stop() != 0) failed = 1;
  if (replay > 0) {
    uint64_t events = 0;
    size_t usage_rows = 0;
    const std::string diff = ReplayLedger(ledger_path, &events, &usage_rows);
    if (!diff.empty()) failed = 1;
    replay_json = absl::StrFormat(
        ",\"replay\":{\"seconds\":%.1f,\"events\":%d,\"usage_rows\":%d,\"equal\":%s,"
        "\"difference\":\"%s\"}",
        replay, events, usage_rows, diff.empty() ? "true" : "false", diff);
    summary.push_back(absl::StrFormat(
        "replay after %.0f s at full rate: %d events folded in order give the %d usage rows "
        "%s",
        replay, events, usage_rows, diff.empty() ? "exactly" : "NOT: " + diff));
  }
  if (json) {
    std::string j = Json(rows, nullptr);
    j.pop_back();  // the closing brace
    printf("%s,\"ledger_ratios\":[%s],\"ledger_pooled\":[%s]%s}\n", j.c_str(),
           absl::StrJoin(ratios_json, ",").c_str(), absl::StrJoin(pooled_json, ",").c_str(),
           replay_json.c_str());
  } else {
    for (const std::string& line : summary) printf("%s\n", line.c_str());
  }
  return failed;
}

int RunDriver() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  Driver driver(self);
  const bool json = absl::GetFlag(FLAGS_json);
  const double seconds = absl::GetFlag(FLAGS_seconds);

  // As installed (slab size, empty slab release and the rest at their
  // defaults; the fixture's lock-order checking off), on 4 simulated devices.
  std::vector<std::string> daemon_args = {
      "--sim_devices=4x16GiB",
      absl::StrCat("--stream_threads=", absl::GetFlag(FLAGS_stream_threads)),
      "--mutex_deadlock_detection=false"};
  for (absl::string_view f :
       absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ' ', absl::SkipEmpty())) {
    daemon_args.emplace_back(f);
  }
  if (absl::GetFlag(FLAGS_ledger_compare)) return RunLedgerCompare(driver, daemon_args, json);
  testing::DaemonProcess daemon(daemon_args);
  if (!daemon.Start()) {
    fprintf(stderr, "load_bench: daemon did not start:\n%s", daemon.Log().c_str());
    return 1;
  }
  const std::string baseline_path = absl::GetFlag(FLAGS_baseline_daemon);
  std::unique_ptr<testing::DaemonProcess> baseline;
  if (!baseline_path.empty()) {
    baseline = std::make_unique<testing::DaemonProcess>(daemon_args);
    baseline->SetBinary(baseline_path);
    if (!baseline->Start()) {
      fprintf(stderr, "load_bench: baseline daemon did not start:\n%s",
              baseline->Log().c_str());
      return 1;
    }
  }
  // The row against the daemon, and the same against the baseline.
  auto daemon_rows = [&](const std::string& section, const char* transport, int n) {
    std::vector<Row> out;
    auto run_daemon = [&] {
      out.push_back(
          driver.RunPhase("daemon", daemon.socket(), daemon.pid(), transport, n, seconds));
      out.back().section = section;
    };
    auto run_baseline = [&] {
      if (baseline == nullptr) return;
      out.push_back(driver.RunPhase("baseline", baseline->socket(), baseline->pid(), transport,
                                    n, seconds));
      out.back().section = section;
    };
    if (absl::GetFlag(FLAGS_baseline_first)) {
      run_baseline();
      run_daemon();
    } else {
      run_daemon();
      run_baseline();
    }
    return out;
  };
  const std::string floor_socket = driver.dir() + "/floor.sock";
  const std::string floor_fd_socket = driver.dir() + "/floor-fd.sock";
  const std::string floor_async_socket = driver.dir() + "/floor-async.sock";
  testing::ChildProcess floor({driver.self(), "--role=floor", "--target=" + floor_socket});
  testing::ChildProcess floor_fd(
      {driver.self(), "--role=floor_fd", "--target=" + floor_fd_socket});
  testing::ChildProcess floor_async(
      {driver.self(), "--role=floor_async", "--target=" + floor_async_socket});
  if (floor.ReadLine() != "ready" || floor_fd.ReadLine() != "ready" ||
      floor_async.ReadLine() != "ready") {
    fprintf(stderr, "load_bench: floor server did not start\n");
    return 1;
  }
  if (!json) {
    printf("%-8s %-11s %-6s %4s %10s %8s %8s %9s %7s %8s %6s   %s\n", "section", "target",
           "via", "N", "pairs/s", "p50 us", "p99 us", "p999 us", "errors", "cpu us",
           "cs", "x floor: pairs/s, p50");
  }
  std::vector<Row> rows;
  auto emit = [&](Row r) {
    if (r.target == "daemon" || r.target == "baseline") {
      for (const Row& f : rows) {
        if (f.section == r.section && f.target == "floor" && f.transport == r.transport &&
            f.clients == r.clients && f.pairs_per_s > 0 && f.p50 > 0) {
          r.x_floor_pairs = r.pairs_per_s / f.pairs_per_s;
          r.x_floor_p50 = r.p50 / f.p50;
        }
      }
    }
    if (!json) PrintRow(r);
    fflush(stdout);
    rows.push_back(r);
  };

  std::vector<int> counts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_clients), ',')) {
    int v = 0;
    if (absl::SimpleAtoi(c, &v) && v > 0) counts.push_back(v);
  }
  for (int c : counts) {
    for (const char* transport : {"stream", "unary"}) {
      emit(driver.RunPhase("floor", floor_socket, floor.pid(), transport, c, seconds));
      for (Row& r : daemon_rows("load", transport, c)) emit(r);
    }
  }
  if (absl::GetFlag(FLAGS_anatomy)) {
    for (const char* transport : {"unary", "stream"}) {
      for (int round = 0; round < 1; ++round) {
        Row a = driver.RunPhase("floor", floor_socket, floor.pid(), transport, 1, seconds);
        a.section = "anatomy";
        emit(a);
        Row b = driver.RunPhase("floor_fd", floor_fd_socket, floor_fd.pid(), transport, 1,
                                seconds);
        b.section = "anatomy";
        emit(b);
        if (transport == std::string("unary")) {
          Row c = driver.RunPhase("floor_async", floor_async_socket, floor_async.pid(),
                                  transport, 1, seconds);
          c.section = "anatomy";
          emit(c);
        }
        for (Row& r : daemon_rows("anatomy", transport, 1)) emit(r);
      }
    }
  }
  const double soak = absl::GetFlag(FLAGS_soak_seconds);
  if (soak > 0) {
    Row s = driver.RunPhase("daemon", daemon.socket(), daemon.pid(), "stream",
                            absl::GetFlag(FLAGS_soak_clients), soak);
    s.section = "soak";
    emit(s);
    if (!json) {
      printf("soak: daemon RSS %.1f MiB at the start, %.1f MiB after %.0f s: %+.3f%%\n",
             s.rss_start / 1048576.0, s.rss_end / 1048576.0, soak,
             s.rss_start ? 100.0 * (double(s.rss_end) - double(s.rss_start)) / s.rss_start
                         : 0.0);
    }
  }
  if (baseline != nullptr && !json) {
    // after/before of the two figures a refactor must keep.
    auto find = [&](const char* target, int n) -> const Row* {
      for (const Row& r : rows) {
        if (r.section == "load" && r.target == target && r.transport == "stream" &&
            r.clients == n) {
          return &r;
        }
      }
      return nullptr;
    };
    const Row* d4 = find("daemon", 4);
    const Row* b4 = find("baseline", 4);
    const Row* d1 = find("daemon", 1);
    const Row* b1 = find("baseline", 1);
    if (d4 != nullptr && b4 != nullptr && b4->x_floor_pairs > 0) {
      printf("after/before: 4-client stream pairs/s x floor %.3f / %.3f = %.3f\n",
             d4->x_floor_pairs, b4->x_floor_pairs, d4->x_floor_pairs / b4->x_floor_pairs);
    }
    if (d1 != nullptr && b1 != nullptr && b1->x_floor_p50 > 0) {
      printf("after/before: 1-client stream p50 x floor %.3f / %.3f = %.3f\n",
             d1->x_floor_p50, b1->x_floor_p50, d1->x_floor_p50 / b1->x_floor_p50);
    }
  }
  if (baseline != nullptr) baseline->Stop();
  for (testing::ChildProcess* f : {&floor, &floor_fd, &floor_async}) f->Kill(SIGTERM);
  for (testing::ChildProcess* f : {&floor, &floor_fd, &floor_async}) f->Wait();
  const int stopped = daemon.Stop();

  ScaleFigures scale;
  bool have_scale = false;
  if (absl::GetFlag(FLAGS_scale_blocks) > 0) {
    have_scale = RunScale(driver, &scale);
    if (!json) {
      printf("scale (not the defaults: --slab_size=256MiB --empty_slab_release_seconds=3600): "
             "%d devices, %llu live blocks (%llu errors, filled in %.1f s)\n",
             scale.devices, static_cast<unsigned long long>(scale.blocks),
             static_cast<unsigned long long>(scale.errors), scale.fill_seconds);
      printf("scale: GetStats p50/p99 %.3f/%.3f ms empty, %.3f/%.3f ms with the blocks\n",
             scale.stats_p50_empty_ms, scale.stats_p99_empty_ms, scale.stats_p50_full_ms,
             scale.stats_p99_full_ms);
      printf("scale: daemon RSS %.1f MiB empty, %.1f MiB with the blocks: %.0f bytes per "
             "live block; reclaimed %.3f s after the holders were killed\n",
             scale.rss_empty / 1048576.0, scale.rss_full / 1048576.0, scale.bytes_per_block,
             scale.reclaim_seconds);
    }
  }
  if (json) printf("%s\n", Json(rows, have_scale ? &scale : nullptr).c_str());
  rmdir(driver.dir().c_str());
  if (stopped != 0) {
    fprintf(stderr, "load_bench: daemon exited with %d\n", stopped);
    return 1;
  }
  if (absl::GetFlag(FLAGS_scale_blocks) > 0 && !have_scale) return 1;
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "floor" || role == "floor_fd" || role == "floor_async") {
    using gpumem::bench::FloorAccept;
    using gpumem::bench::FloorUnary;
    return gpumem::bench::RunFloorServer(
        absl::GetFlag(FLAGS_target),
        role == "floor_fd" ? FloorAccept::kOwnAccept : FloorAccept::kGrpcPort,
        role == "floor_async" ? FloorUnary::kAsync : FloorUnary::kSync);
  }
  if (role == "client") return gpumem::RunClient();
  if (role == "filler") return gpumem::RunFiller();
  return gpumem::RunDriver();
}
