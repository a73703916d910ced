// chaos_soak: a real gpumemd under chaos for a given time, then the books
// are checked. (tests/soak/README.md: what it does, how to run it long.)
//
// What happens, at random times, while worker clients (soak_client
// --mode=worker: random sizes, placements, shards, waits and lifetimes,
// through the C ABI's caching pool and the C++ client, of three uids, so
// three tenants) and slab-holding attackers (--mode=attack: shrink, grow,
// seal the slab's fd, keep it after the block is freed) run:
//  - a client is SIGKILLed and a new one started in its place;
//  - the config is rewritten with other quotas and limits and the daemon
//    reloads it (SIGHUP);
//  - the ledger's filesystem fills up (a tmpfs this program mounts, sized a
//    few MiB: a filler file takes what is left, then goes; the ledger
//    itself fills it, then the tmpfs is grown). Without the right to mount,
//    the daemon's --ledger_max_pages makes SQLite answer "database or disk
//    is full" instead, raised at each restart. The summary says which.
//  - the daemon is killed (SIGKILL) under load and started again on the
//    same socket, ledger and state file (--restart_check=survive, the
//    default): what it kept carries over for every process that still
//    runs, the clients' libraries reconnect and re-present their blocks and
//    give back their slabs' fds, and the check after the restart (see
//    SurvivesRestart below) proves it allocation by allocation, from the
//    dead daemon's state file, the ledger's events and each worker's own
//    counts. --restart_check=close runs the daemon with --state=none: the
//    new daemon must close exactly the allocations the ledger had live.
//
// Each daemon instance goes through: start; warm-up (--warmup); quiesce (every client
// killed; the baseline: fds, threads, RSS); chaos; quiesce (the checks);
// a little more load; kill -9 (or, for the last one, SIGTERM and a clean
// exit). At each quiesce point:
//  - 0 bytes leaked: every device's used and retained bytes are 0;
//  - the ledger: integrity_check ok, its events replay consistently to its
//    live table and usage table, and nothing is live (the final state);
//  - the daemon's fds and threads are back to its baseline, its RSS within
//    1% of it.
// Continuously: no client sees a corrupted block, an unexpected status or a
// slab it could change; no tenant holds more than its quota (beyond what a
// lowering reload left it holding); the daemon never dies on its own; each
// reload is applied; after a kill -9 (survive) no allocation of a running
// process is closed but those the restart could not keep (a slab no running
// process had open), no worker loses a block it mapped, each notices the
// restart once, and every block's pattern is intact when it is freed; or
// (close) the new daemon closes exactly the allocations the ledger had
// live.
//
// Exit status 0 when there was no violation. --json prints the summary as
// one JSON object too.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "server/state/durable_state.h"
#include "tests/soak/ledger_check.h"

ABSL_FLAG(absl::Duration, duration, absl::Minutes(1), "how long the chaos lasts");
ABSL_FLAG(absl::Duration, instance, absl::Minutes(2),
          "how long one daemon instance lives (each then gets kill -9)");
ABSL_FLAG(absl::Duration, first_instance, absl::ZeroDuration(),
          "how long the first instance lives (0: --instance); make it long to judge RSS");
ABSL_FLAG(absl::Duration, rss_min_warmup, absl::Minutes(2),
          "RSS growth is judged only for instances warmed up this long: before, the "
          "ledger's SQLite page cache (2 MiB by default) is still filling as the file "
          "grows, which is not a leak; it is reported either way");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(30),
          "chaos before each instance's baseline (at most 40% of the instance): the "
          "daemon's caches (SQLite's page cache, allocator arenas) fill meanwhile");
ABSL_FLAG(int, workers, 6, "worker clients at a time");
ABSL_FLAG(int, attackers, 2, "slab-holding attackers at a time");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(double, kill_per_sec, 1.0, "client SIGKILLs per second (mean)");
ABSL_FLAG(double, reload_per_sec, 0.1, "config reloads per second (mean)");
ABSL_FLAG(double, fill_per_sec, 0.03, "ledger filesystem fills per second (mean)");
ABSL_FLAG(double, worker_ops_per_sec, 100, "requests per second of each worker");
ABSL_FLAG(std::string, restart_check, "survive",
          "survive: allocations of processes that still run outlive a daemon kill -9 "
          "(the daemon keeps its state file); close: the daemon runs with --state=none and "
          "a restart must close exactly what the ledger had live");
ABSL_FLAG(absl::Duration, restore_grace, absl::Seconds(4),
          "survive: the daemon's --restore_grace_seconds (how long clients have to come "
          "back); the check after a restart waits it out");
ABSL_FLAG(std::string, ledger_fs, "auto", "auto | tmpfs | pages");
ABSL_FLAG(std::string, gpumemd, "", "the daemon binary (default: from the runfiles)");
ABSL_FLAG(std::string, client, "", "soak_client (default: from the runfiles)");
ABSL_FLAG(std::vector<std::string>, daemon_args, {},
          "more daemon flags, comma-separated (experiments; later flags win)");
ABSL_FLAG(bool, json, false, "also print the summary as JSON");
ABSL_FLAG(bool, keep_dir, false, "keep the work directory (logs, ledger)");

namespace gpumem {
namespace soak {
namespace {

using client::Client;

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string Runfile(const std::string& rel) {
  const char* dir = getenv("RUNFILES_DIR");
  if (dir == nullptr) dir = getenv("TEST_SRCDIR");
  std::string base = dir != nullptr ? std::string(dir) : "";
  if (base.empty()) {
    // Run by hand: next to this binary's runfiles.
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) base = std::string(self, n) + ".runfiles";
  }
  return base + "/gpumemd/" + rel;
}

int CountEntries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

int64_t RssKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      int64_t kib = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib;
    }
  }
  return -1;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A child process whose stdout lines are read without blocking.
class Child {
 public:
  Child(const std::vector<std::string>& argv, uid_t uid, const std::string& stderr_path) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return;
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(p[1], 1);
      const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (err >= 0) dup2(err, 2);
      const int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      if (uid != 0 && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(126);
      execv(args[0], args.data());
      _exit(127);
    }
    close(p[1]);
    out_ = p[0];
    fcntl(out_, F_SETFL, O_NONBLOCK);
  }
  ~Child() {
    Kill();
    if (out_ >= 0) close(out_);
  }
  pid_t pid() const { return pid_; }
  // Lines written since the last call.
  std::vector<std::string> Lines() {
    std::vector<std::string> out;
    char buf[8192];
    for (;;) {
      const ssize_t n = out_ >= 0 ? read(out_, buf, sizeof(buf)) : -1;
      if (n <= 0) break;
      partial_.append(buf, n);
    }
    size_t nl;
    while ((nl = partial_.find('\n')) != std::string::npos) {
      out.push_back(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
    return out;
  }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  // Exited on its own?
  bool Exited(int* status) {
    if (pid_ <= 0) return false;
    if (waitpid(pid_, status, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string partial_;
};

struct Totals {
  uint64_t ops = 0, allocs = 0, refused = 0, waited = 0, lost = 0, errors = 0, corrupt = 0;
  // The library's view of restarts: the C++ Client's count, the C ABI
  // pool's generation (1 + its restarts), the bytes the pool lost.
  uint64_t restarts = 0, generation = 0, lost_bytes = 0, cxx = 0;
  bool seen = false;  // a stats line came
};

// One client process and the last figures it printed.
struct ClientProc {
  std::unique_ptr<Child> child;
  bool attacker = false;
  Totals last;
};

// A client process as the check after a kill -9 sees it.
struct ClientAtKill {
  pid_t pid = 0;
  bool attacker = false;
  uint64_t start_ticks = 0;  // /proc/PID/stat field 22: tells a reused pid apart
  Totals last;               // its last figures before the kill
};

// /proc/PID/stat's start time (field 22), 0 if it cannot be read.
uint64_t StartTicks(pid_t pid) {
  const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  uint64_t ticks = 0;
  // After the command: field 3 is f[0], so field 22 is f[19].
  return f.size() > 19 && absl::SimpleAtoi(f[19], &ticks) ? ticks : 0;
}

// What the check after a kill -9 expects of the next daemon.
class RestartCheck {
 public:
  virtual ~RestartCheck() = default;
  // The daemon is dead (SIGKILL, reaped); `clients` are the client processes
  // running now (none is killed until Verify has run).
  virtual void Killed(const std::string& ledger, const std::vector<ClientAtKill>& clients) = 0;
  // After the restart (the new daemon serves, its stderr so far is `log`):
  // the violations found, none when it holds.
  virtual std::vector<std::string> Verify(const std::string& log) = 0;
  // What the restarts came to, for the summary ("" for nothing to say).
  virtual std::string Figures() const { return ""; }
};

// --restart_check=close (the daemon with --state=none): the next start
// closes every allocation the ledger had live.
class ClosesLiveAllocations : public RestartCheck {
 public:
  void Killed(const std::string& ledger, const std::vector<ClientAtKill>&) override {
    live_ = LiveRows(ledger);
  }
  std::vector<std::string> Verify(const std::string& log) override {
    const std::string want = absl::StrCat(live_, " allocation(s) live at the last unclean stop "
                                               "closed with DAEMON_RESTART");
    if (absl::StrContains(log, want)) return {};
    return {absl::StrCat("after kill -9 the ledger had ", live_,
                         " live allocation(s); the new daemon did not say \"", want, "\"")};
  }

 private:
  int64_t live_ = 0;
};

// --restart_check=survive: what the dead daemon's state file kept lives on
// for every process that still runs. At the kill the check reads the state
// file (a sparse copy, opened as the next daemon opens it: the original is
// left untouched for it) and the ledger; after the restart and the grace
// time it reads the ledger's events since the kill and its live table, and
// judges each allocation the state file kept (its owner: the session record
// and the pid's start time, so a reused pid is not taken for it):
//  - owner gone (killed by the chaos just before the daemon, whose session
//    end the dead daemon had not recorded): closed with DAEMON_RESTART
//    "its process ended while the daemon was down" if the ledger knew it,
//    and not live after the restart either way;
//  - owner a running worker: never SESSION_END; DAEMON_RESTART only "its
//    slab's handle did not come back" (no running process had the slab open
//    to give its fd back: no fd store outside systemd; only blocks never
//    mapped can be on such a slab, and the worker counts each as lost when
//    its Free answers NOT_FOUND: Soak::CheckClientsCameBack matches the two
//    counts exactly, and a worker calls any loss of a mapped block an
//    error); FREE "not re-presented" at most 2 per worker (the one call it
//    can have in flight, sharded in two, whose answer the dead daemon never
//    sent); else it survived (still live, or freed by its client since);
//  - owner a running attacker: anything but a DAEMON_RESTART for a gone
//    process or a SESSION_END (it never maps through the library, so its
//    blocks' slabs come back only if a worker has them open).
// And every allocation the ledger had live but the state file did not (it
// ended just before the kill; its event was lost with the daemon's last
// batch) is closed with FREE. The new daemon's restart line must say the
// ledger had as many open as the ledger's live table at the kill, and as
// many closed with DAEMON_RESTART as the events say; one DAEMON_RESUMED.
class SurvivesRestart : public RestartCheck {
 public:
  SurvivesRestart(std::string state_path, std::string work_dir, absl::Duration grace)
      : state_path_(std::move(state_path)), work_dir_(std::move(work_dir)), grace_(grace) {}

  void Killed(const std::string& ledger, const std::vector<ClientAtKill>& clients) override {
    ledger_ = ledger;
    last_seq_ = LastSeq(ledger);
    ledger_live_ = LiveIds(ledger);
    snapshot_ = state::Snapshot();
    read_problem_.clear();
    const std::string copy = work_dir_ + "/state-at-kill";
    const std::string cmd =
        absl::StrCat("cp --sparse=always '", state_path_, "' '", copy, "'");
    if (system(cmd.c_str()) != 0) {
      read_problem_ = "cannot copy the state file " + state_path_;
      return;
    }
    chmod(copy.c_str(), 0600);
    std::string note;
    absl::StatusOr<std::unique_ptr<state::DurableState>> opened =
        state::DurableState::Open(copy, &snapshot_, &note);
    if (!opened.ok() || !snapshot_.adopted) {
      read_problem_ = absl::StrCat("the state file at the kill: ",
                                   opened.ok() ? note : opened.status().ToString());
    }
    opened = absl::UnknownError("closed");
    std::filesystem::remove(copy);
    running_.clear();
    for (const ClientAtKill& c : clients) running_[c.pid] = c;
  }

  std::vector<std::string> Verify(const std::string& log) override {
    std::vector<std::string> bad;
    if (!read_problem_.empty()) return {read_problem_};
    ++restarts_;
    // The grace time, then FinishRestore at the daemon's next maintenance
    // tick (1 s), then the ledger's writer (100 ms).
    absl::SleepFor(grace_ + absl::Seconds(3));
    std::vector<std::string> resumed;
    const std::map<uint64_t, Ending> ended = EndingsAfter(ledger_, last_seq_, &resumed);
    const std::vector<uint64_t> live_now = LiveIds(ledger_);
    const std::set<uint64_t> live_after(live_now.begin(), live_now.end());
    const std::set<uint64_t> live_at_kill(ledger_live_.begin(), ledger_live_.end());
    if (resumed.size() != 1) {
      bad.push_back(absl::StrCat(resumed.size(), " DAEMON_RESUMED events after the restart"));
    }
    std::map<uint64_t, const state::SessionRecord*> sessions;
    for (const state::SessionRecord& r : snapshot_.sessions) sessions[r.id] = &r;
    std::map<uint64_t, std::set<uint64_t>> holders;  // slab -> sessions
    for (const state::HolderRecord& r : snapshot_.holders) holders[r.slab_id].insert(r.session);
    // Whose is a session: a running worker's or attacker's, or gone.
    enum class Owner { kGone, kWorker, kAttacker, kOther };
    auto owner = [&](uint64_t session, pid_t* pid) {
      auto s = sessions.find(session);
      if (s == sessions.end()) return Owner::kGone;
      *pid = s->second->pid;
      auto c = running_.find(s->second->pid);
      if (c == running_.end()) {
        // The soak itself (its admin Client) is a running process too.
        return s->second->pid == getpid() && StartTicks(getpid()) == s->second->start_ticks
                   ? Owner::kOther
                   : Owner::kGone;
      }
      if (c->second.start_ticks != s->second->start_ticks) return Owner::kGone;
      return c->second.attacker ? Owner::kAttacker : Owner::kWorker;
    };
    size_t closed_at_start = 0;  // DAEMON_RESTART events of ids the ledger had live
    std::map<pid_t, int> unclaimed;
    handle_closures_.clear();
    std::set<uint64_t> in_state;
    for (const state::AllocationRecordData& a : snapshot_.allocations) {
      in_state.insert(a.id);
      pid_t pid = 0;
      const Owner o = owner(a.session, &pid);
      auto e = ended.find(a.id);
      const bool known = live_at_kill.count(a.id) != 0;
      const std::string what = absl::StrCat("allocation ", a.id, " (session ", a.session,
                                            ", pid ", pid, ", slab ", a.slab_id, ")");
      if (e != ended.end() && e->second.kind == "DAEMON_RESTART" && known &&
          absl::StrContains(e->second.detail, "process ended")) {
        ++closed_at_start;
      }
      if (o == Owner::kGone) {
        ++gone_closed_;
        if (live_after.count(a.id) != 0) {
          bad.push_back(what + " of a process that is gone is still live after the restart");
        } else if (known && (e == ended.end() || e->second.kind != "DAEMON_RESTART" ||
                             !absl::StrContains(e->second.detail, "process ended"))) {
          bad.push_back(absl::StrCat(what, " of a process that is gone ended with ",
                                     e == ended.end() ? "nothing" : e->second.kind + " \"" +
                                         e->second.detail + "\"",
                                     ", not DAEMON_RESTART for its process"));
        }
        continue;
      }
      if (e == ended.end()) {
        ++survived_;
        if (live_after.count(a.id) == 0 && known) {
          bad.push_back(what + " is neither live nor ended after the restart");
        }
        continue;
      }
      const Ending& end = e->second;
      if (end.kind == "SESSION_END" ||
          (end.kind == "DAEMON_RESTART" && absl::StrContains(end.detail, "process ended"))) {
        bad.push_back(absl::StrCat(what, " of a running process ended with ", end.kind, " \"",
                                   end.detail, "\""));
      } else if (end.kind == "DAEMON_RESTART") {
        if (!absl::StrContains(end.detail, "slab's handle did not come back")) {
          bad.push_back(absl::StrCat(what, " of a running process closed: \"", end.detail,
                                     "\""));
        } else if (o == Owner::kWorker) {
          ++handle_closures_[pid];
          ++handle_closed_;
          for (uint64_t h : holders[a.slab_id]) {
            pid_t holder_pid = 0;
            if (owner(h, &holder_pid) == Owner::kWorker) {
              ++handle_closed_held_;  // see CheckClientsCameBack: judged by the client
              break;
            }
          }
        } else {
          ++handle_closed_;
        }
      } else if (end.kind == "FREE" && absl::StrContains(end.detail, "not re-presented")) {
        ++unclaimed_;
        if (o == Owner::kWorker && ++unclaimed[pid] > 2) {
          bad.push_back(absl::StrCat("pid ", pid, ", a running worker, had ", unclaimed[pid],
                                     " allocations not re-presented (one call in flight "
                                     "makes at most 2)"));
        }
      } else {
        ++survived_;  // and freed by its client since
      }
    }
    // Live in the ledger, not in the state file: ended just before the kill.
    for (uint64_t id : ledger_live_) {
      if (in_state.count(id) != 0) continue;
      ++ended_before_;
      auto e = ended.find(id);
      if (e == ended.end() || e->second.kind != "FREE") {
        bad.push_back(absl::StrCat("allocation ", id, ", live in the ledger but not in the "
                                   "state file at the kill, ended with ",
                                   e == ended.end() ? "nothing" : e->second.kind,
                                   " after the restart, not FREE"));
      }
    }
    const std::string want = absl::StrCat("the ledger had ", ledger_live_.size(),
                                          " open, closed ", closed_at_start,
                                          " with DAEMON_RESTART");
    if (!absl::StrContains(log, "gpumemd: restart: ") || !absl::StrContains(log, want)) {
      const size_t at = log.find("gpumemd: restart: ");
      bad.push_back(absl::StrCat("the new daemon's restart line does not say \"", want, "\": ",
                                 at == std::string::npos ? "(none)" : log.substr(at, 400)));
    }
    return bad;
  }

  // Blocks of running worker `pid` closed because their slab's handle did
  // not come back, at the last restart.
  int HandleClosures(pid_t pid) const {
    auto it = handle_closures_.find(pid);
    return it == handle_closures_.end() ? 0 : it->second;
  }

  std::string Figures() const override {
    return absl::StrCat("restarts checked ", restarts_, ": allocations survived ", survived_,
                        ", closed with their process gone ", gone_closed_,
                        ", closed with no holder giving their slab's fd back ", handle_closed_,
                        " (a holder recorded but not giving it: ", handle_closed_held_,
                        "), not re-presented ", unclaimed_, ", ended just before the kill ",
                        ended_before_);
  }
  std::string Json() const {
    return absl::StrCat("\"restarts_checked\":", restarts_, ",\"survived\":", survived_,
                        ",\"closed_process_gone\":", gone_closed_, ",\"closed_no_handle\":",
                        handle_closed_, ",\"not_represented\":", unclaimed_);
  }

 private:
  const std::string state_path_, work_dir_;
  const absl::Duration grace_;
  std::string ledger_;
  int64_t last_seq_ = 0;
  std::vector<uint64_t> ledger_live_;
  state::Snapshot snapshot_;
  std::string read_problem_;
  std::map<pid_t, ClientAtKill> running_;
  std::map<pid_t, int> handle_closures_;
  uint64_t restarts_ = 0, survived_ = 0, gone_closed_ = 0, handle_closed_ = 0,
           handle_closed_held_ = 0, unclaimed_ = 0, ended_before_ = 0;
};

class Soak {
 public:
  Soak() : rng_(absl::GetFlag(FLAGS_seed)) {}

  int Main() {
    const std::string mode = absl::GetFlag(FLAGS_restart_check);
    if (mode != "survive" && mode != "close") {
      fprintf(stderr, "chaos_soak: --restart_check is survive or close, not %s\n", mode.c_str());
      return 2;
    }
    survive_ = mode == "survive";
    if (!Setup()) return 2;
    if (survive_) {
      auto check = std::make_unique<SurvivesRestart>(state_, dir_,
                                                     absl::GetFlag(FLAGS_restore_grace));
      survives_ = check.get();
      restart_check_ = std::move(check);
    } else {
      restart_check_ = std::make_unique<ClosesLiveAllocations>();
    }
    const absl::Time end = absl::Now() + absl::GetFlag(FLAGS_duration);
    bool last = false;
    while (!last) {
      const absl::Duration length =
          instances_ == 0 && absl::GetFlag(FLAGS_first_instance) > absl::ZeroDuration()
              ? absl::GetFlag(FLAGS_first_instance)
              : absl::GetFlag(FLAGS_instance);
      const absl::Time instance_end = std::min(end, absl::Now() + length);
      last = instance_end >= end - absl::Seconds(5);
      RunInstance(last ? end : instance_end, last);
    }
    Summary();
    Teardown();
    return violations_.empty() ? 0 : 1;
  }

 private:
  // ---- setup ----
  bool Setup() {
    char tmpl[] = "/tmp/gpumemd-soak-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);
    socket_ = dir_ + "/gpumemd.sock";
    state_ = dir_ + "/gpumemd.state";
    config_ = dir_ + "/gpumemd.textproto";
    log_ = dir_ + "/gpumemd.log";
    gpumemd_ = absl::GetFlag(FLAGS_gpumemd).empty() ? Runfile("server/gpumemd")
                                                    : absl::GetFlag(FLAGS_gpumemd);
    const std::string client = absl::GetFlag(FLAGS_client).empty()
                                   ? Runfile("tests/soak/soak_client")
                                   : absl::GetFlag(FLAGS_client);
    // Other uids cannot enter root's runfiles: a copy next to the socket.
    client_ = dir_ + "/soak_client";
    std::error_code e;
    std::filesystem::copy_file(client, client_, e);
    if (e) {
      fprintf(stderr, "chaos_soak: cannot copy %s: %s\n", client.c_str(), e.message().c_str());
      return false;
    }
    chmod(client_.c_str(), 0755);
    root_ = geteuid() == 0;
    uids_ = root_ ? std::vector<uid_t>{0, 65534, 65533} : std::vector<uid_t>{geteuid()};
    // The ledger's small filesystem.
    ledger_dir_ = dir_ + "/ledgerfs";
    std::filesystem::create_directories(ledger_dir_);
    chmod(ledger_dir_.c_str(), 0755);
    const std::string want = absl::GetFlag(FLAGS_ledger_fs);
    if (want != "pages" &&
        mount("tmpfs", ledger_dir_.c_str(), "tmpfs", 0,
              absl::StrCat("size=", tmpfs_bytes_).c_str()) == 0) {
      tmpfs_ = true;
      ledger_fs_ = absl::StrCat("tmpfs of ", tmpfs_bytes_ / kMiB, " MiB, grown when full");
    } else if (want == "tmpfs") {
      fprintf(stderr, "chaos_soak: cannot mount a tmpfs: %s\n", strerror(errno));
      return false;
    } else {
      ledger_fs_ = absl::StrCat("no mount (", want == "pages" ? "--ledger_fs=pages" : strerror(errno),
                                "): SQLite's page limit (--ledger_max_pages), raised at "
                                "each restart");
    }
    ledger_ = ledger_dir_ + "/ledger.db";
    WriteConfig();
    fprintf(stderr, "chaos_soak: work directory %s; ledger on %s\n", dir_.c_str(),
            ledger_fs_.c_str());
    return true;
  }

  void Teardown() {
    clients_.clear();
    if (daemon_ != nullptr) daemon_->Kill();
    if (tmpfs_) umount2(ledger_dir_.c_str(), MNT_DETACH);
    if (!absl::GetFlag(FLAGS_keep_dir)) {
      std::error_code e;
      std::filesystem::remove_all(dir_, e);
    } else {
      fprintf(stderr, "chaos_soak: kept %s\n", dir_.c_str());
    }
  }

  double Uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool Chance(double per_sec, absl::Duration tick) {
    return Uniform(0, 1) < per_sec * absl::ToDoubleSeconds(tick);
  }

  void Violation(const std::string& what) {
    fprintf(stderr, "chaos_soak: VIOLATION: %s\n", what.c_str());
    violations_.push_back(what);
  }

  // ---- config ----
  void WriteConfig() {
    // Quotas between a quarter of one device and more than both.
    auto size = [&](uint64_t lo, uint64_t hi) {
      return absl::StrCat((lo + Pick(static_cast<int>(hi - lo + 1))) * 64, "MiB");
    };
    std::string text = absl::StrCat(
        "tenant { name: \"ops\" uids: 0 priority: ", Pick(3),
        " quota { total_bytes: \"", size(4, 40), "\" } max_waiting_requests: ", 2 + Pick(64),
        " }\n");
    if (root_) {
      absl::StrAppend(&text, "tenant { name: \"nobody\" uids: 65534 quota { total_bytes: \"",
                      size(4, 40), "\" device { device: \"0\" bytes: \"", size(2, 16),
                      "\" } max_allocations: ", 200 + Pick(2000), " } }\n",
                      "tenant { name: \"b\" uids: 65533 max_sessions: ", 4 + Pick(8),
                      " quota { total_bytes: \"", size(4, 40), "\" } }\n");
    }
    absl::StrAppend(&text, "default_tenant: \"ops\"\nreclaim_wait_ms: ", 50 + Pick(400),
                    "\nwait_bypass_limit: ", 1 + Pick(16), "\nwait_reserve_ms: ", 100 + Pick(2000),
                    "\npool { empty_slab_release_seconds: ", 0.5 + Uniform(0, 2), " }\n");
    std::ofstream(config_ + ".new") << text;
    std::filesystem::rename(config_ + ".new", config_);
  }

  // ---- the daemon ----
  bool StartDaemon() {
    std::vector<std::string> argv = {gpumemd_, "--socket=" + socket_, "--config=" + config_,
                                      "--ledger=" + ledger_, "--sim_devices=2x1GiB",
                                      "--slab_size=64MiB", "--stream_backend_threads=2",
                                      "--tenant_socket_dir=" + dir_ + "/tenants"};
    if (!tmpfs_) argv.push_back(absl::StrCat("--ledger_max_pages=", max_pages_));
    if (survive_) {
      argv.push_back("--state=" + state_);
      argv.push_back(absl::StrCat("--restore_grace_seconds=",
                                  absl::ToInt64Seconds(absl::GetFlag(FLAGS_restore_grace))));
    } else {
      argv.push_back("--state=none");
    }
    for (const std::string& a : absl::GetFlag(FLAGS_daemon_args)) argv.push_back(a);
    log_offset_ = ReadAll(log_).size();
    daemon_ = std::make_unique<Child>(argv, 0, log_);
    for (int i = 0; i < 1000; ++i) {
      struct stat st;
      if (stat(socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
          absl::StrContains(NewLog(), "serving")) {
        absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_);
        if (c.ok()) {
          admin_ = *std::move(c);
          return true;
        }
      }
      int status;
      if (daemon_->Exited(&status)) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    Violation("the daemon did not start: " + NewLog().substr(0, 2000));
    return false;
  }

  std::string NewLog() {
    const std::string all = ReadAll(log_);
    return all.size() > log_offset_ ? all.substr(log_offset_) : "";
  }

  bool DaemonAlive() {
    int status = 0;
    if (daemon_ != nullptr && daemon_->Exited(&status)) {
      Violation(absl::StrCat("the daemon died on its own (status ", status,
                             "); log: ", NewLog().substr(NewLog().size() > 3000 ? NewLog().size() - 3000 : 0)));
      daemon_.reset();
      return false;
    }
    return daemon_ != nullptr;
  }

  // ---- clients ----
  void StartClient(bool attacker) {
    ClientProc c;
    c.attacker = attacker;
    const uid_t uid = uids_[Pick(static_cast<int>(uids_.size()))];
    std::vector<std::string> argv = {client_, "--socket=" + socket_};
    if (attacker) {
      argv.push_back("--mode=attack");
      argv.push_back(absl::StrCat("--size=", (1 + Pick(8)) * kMiB));
    } else {
      argv.push_back("--mode=worker");
      argv.push_back(absl::StrCat("--seed=", rng_()));
      argv.push_back(absl::StrCat("--ops_per_sec=", absl::GetFlag(FLAGS_worker_ops_per_sec)));
      argv.push_back(survive_ ? "--restart=survive" : "--restart=close");
    }
    c.child = std::make_unique<Child>(argv, uid, dir_ + "/clients.log");
    clients_.push_back(std::move(c));
  }

  // Up to the configured numbers (clients that lived through a daemon
  // restart count).
  void StartClients() {
    int workers = 0, attackers = 0;
    for (const ClientProc& c : clients_) (c.attacker ? attackers : workers)++;
    for (int i = workers; i < absl::GetFlag(FLAGS_workers); ++i) StartClient(false);
    for (int i = attackers; i < absl::GetFlag(FLAGS_attackers); ++i) StartClient(true);
  }

  void Absorb(ClientProc& c) {
    for (const std::string& line : c.child->Lines()) {
      if (absl::StartsWith(line, "stats ")) {
        Totals t;
        for (absl::string_view kv : absl::StrSplit(line.substr(6), ' ')) {
          std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
          uint64_t v = 0;
          if (!absl::SimpleAtoi(p.second, &v)) continue;
          if (p.first == "ops") t.ops = v;
          if (p.first == "allocs") t.allocs = v;
          if (p.first == "refused") t.refused = v;
          if (p.first == "waited") t.waited = v;
          if (p.first == "lost") t.lost = v;
          if (p.first == "errors") t.errors = v;
          if (p.first == "corrupt") t.corrupt = v;
          if (p.first == "restarts") t.restarts = v;
          if (p.first == "generation") t.generation = v;
          if (p.first == "lost_bytes") t.lost_bytes = v;
          if (p.first == "cxx") t.cxx = v;
        }
        t.seen = true;
        c.last = t;
      } else if (absl::StartsWith(line, "CORRUPT") || absl::StartsWith(line, "VIOLATION")) {
        Violation("client: " + line);
      } else if (absl::StartsWith(line, "ERROR")) {
        client_errors_.push_back(line);
        // Only a client's first connect may fail (a daemon that is not back
        // yet); in close mode, a request's connection to it as well.
        if (!absl::StartsWith(line, "ERROR connect ") &&
            (survive_ || !absl::StrContains(line, "connect"))) {
          Violation("client: " + line);
        }
      } else if (absl::StartsWith(line, "attack ")) {
        ++attacks_;
      }
    }
  }

  void Retire(ClientProc& c) {
    Absorb(c);
    c.child->Kill();
    Absorb(c);
    totals_.ops += c.last.ops;
    totals_.allocs += c.last.allocs;
    totals_.refused += c.last.refused;
    totals_.waited += c.last.waited;
    totals_.lost += c.last.lost;
    totals_.errors += c.last.errors;
    totals_.corrupt += c.last.corrupt;
  }

  void KillAllClients() {
    for (ClientProc& c : clients_) Retire(c);
    clients_.clear();
  }

  // ---- the ledger's filesystem ----
  uint64_t FreeBytes() {
    struct statvfs v;
    if (statvfs(ledger_dir_.c_str(), &v) != 0) return 0;
    return uint64_t{v.f_bavail} * v.f_frsize;
  }

  void GrowTmpfs() {
    tmpfs_bytes_ += 16 * kMiB;
    if (mount("tmpfs", ledger_dir_.c_str(), "tmpfs", MS_REMOUNT,
              absl::StrCat("size=", tmpfs_bytes_).c_str()) != 0) {
      Violation(absl::StrCat("cannot grow the ledger's tmpfs: ", strerror(errno)));
    }
  }

  void FillStart() {
    if (!tmpfs_ || filling_) return;
    std::ofstream f(ledger_dir_ + "/filler", std::ios::binary);
    std::string block(64 * 1024, 'x');
    while (f.write(block.data(), block.size())) {
      if (FreeBytes() < block.size()) break;
    }
    f.close();
    filling_ = true;
    fill_until_ = absl::Now() + absl::Seconds(Uniform(2, 6));
    ++fills_;
  }

  void FillStop() {
    if (!filling_) return;
    std::filesystem::remove(ledger_dir_ + "/filler");
    filling_ = false;
  }

  // The ledger fills the fs by itself: held full a few seconds, then grown.
  void WatchLedgerFs(absl::Time now) {
    if (!tmpfs_) return;
    if (filling_ && now >= fill_until_) FillStop();
    if (!filling_ && FreeBytes() < 256 * 1024) {
      if (full_since_ == absl::InfinitePast()) {
        full_since_ = now;
        ++fills_;
      } else if (now - full_since_ > absl::Seconds(3)) {
        GrowTmpfs();
        full_since_ = absl::InfinitePast();
      }
    }
  }

  // ---- checks ----
  // Every client killed; waits for the daemon to show nothing held, and
  // its empty slabs released (each is an fd of the daemon's).
  bool Quiesce(const std::string& when) {
    KillAllClients();
    FillStop();
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    uint64_t used = 0, retained = 0, pooled = 0;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::GetStatsResponse> s = admin_->GetStats();
      if (s.ok()) {
        used = retained = pooled = 0;
        for (const v1::DeviceStats& d : s->devices()) {
          used += d.used_bytes();
          retained += d.retained_bytes();
          pooled += d.pooled_bytes();
        }
        if (used == 0 && retained == 0 && pooled == 0) break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ++quiesces_;
    if (used != 0 || retained != 0 || pooled != 0) {
      Violation(absl::StrCat(when, ": ", used, " bytes used, ", retained, " retained and ",
                             pooled, " in empty slabs 15 s after every client was killed"));
      return false;
    }
    return true;
  }

  // The ledger once it has caught up (nothing live), checked.
  void CheckLedgerNow(const std::string& when, bool expect_empty) {
    if (tmpfs_ && FreeBytes() < 1 * kMiB) GrowTmpfs();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (expect_empty && LiveRows(ledger_) != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    LedgerReport r = CheckLedger(ledger_);
    ++ledger_checks_;
    ledger_events_ = r.events;
    gaps_ = r.gaps;
    lost_events_ = r.lost_events;
    if (!r.exact()) {
      Violation(absl::StrCat(when, ": the ledger dropped ", r.lost_events,
                             " events (more were held than it may hold)"));
    }
    if (!r.ok()) {
      Violation(absl::StrCat(when, ": ledger: integrity ", r.integrity, "; ",
                             absl::StrJoin(r.problems, "; ")));
    }
    if (expect_empty && r.exact() && (r.replay_live != 0 || r.live_rows != 0)) {
      Violation(absl::StrCat(when, ": ledger replay has ", r.replay_live, " live, live table ",
                             r.live_rows, "; the final state has none"));
    }
  }

  struct Baseline {
    int fds = 0;
    int threads = 0;
    int64_t rss_kib = 0;
    std::map<std::string, int> thread_names;  // comm -> count, at the last sample
    std::map<std::string, int> fd_kinds;      // readlink target kind -> count
    // gRPC's timer manager: it starts another "grpc_global_timer" thread
    // whenever every one it has is running timer callbacks at once, and
    // stops them only at shutdown (gRPC's iomgr/timer_manager.cc), so their
    // count is the high-water mark of timer callbacks run at once, not a
    // leak. Judged apart: at most kMaxGrpcTimerThreads.
    int TimerThreads() const {
      auto it = thread_names.find("grpc_global_tim");  // comm is 15 chars
      return it == thread_names.end() ? 0 : it->second;
    }
    // Every other thread: must come back to the baseline.
    int OwnThreads() const { return threads - TimerThreads(); }
  };
  static constexpr int kMaxGrpcTimerThreads = 8;
  static std::map<std::string, int> ThreadNames(pid_t pid) {
    std::map<std::string, int> out;
    const std::string dir = absl::StrCat("/proc/", pid, "/task");
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return out;
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::string comm = ReadAll(dir + "/" + e->d_name + "/comm");
      while (!comm.empty() && comm.back() == '\n') comm.pop_back();
      ++out[comm];
    }
    closedir(d);
    return out;
  }
  static std::map<std::string, int> FdKinds(pid_t pid) {
    std::map<std::string, int> out;
    const std::string dir = absl::StrCat("/proc/", pid, "/fd");
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return out;
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[512];
      const ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      std::string t = n > 0 ? std::string(target, n) : "?";
      t = t.substr(0, t.find(':'));  // socket:[123] -> socket
      ++out[t.substr(0, t.find_last_of('/') == std::string::npos ? t.size() : t.size())];
    }
    closedir(d);
    return out;
  }
  static std::string Diff(const std::map<std::string, int>& a, const std::map<std::string, int>& b) {
    std::vector<std::string> parts;
    std::map<std::string, int> all = a;
    for (const auto& [k, v] : b) all[k];
    for (const auto& [k, v] : all) {
      const int x = a.count(k) ? a.at(k) : 0, y = b.count(k) ? b.at(k) : 0;
      if (x != y) parts.push_back(absl::StrCat(k, " ", x, "->", y));
    }
    return absl::StrJoin(parts, ", ");
  }
  // The least of a few samples over 2 s: gRPC starts and ends threads of
  // its own now and then.
  Baseline Measure() {
    Baseline b{1 << 30, 1 << 30, 0};
    const pid_t pid = daemon_->pid();
    for (int i = 0; i < 5; ++i) {
      absl::SleepFor(absl::Milliseconds(400));
      b.fds = std::min(b.fds, CountEntries(absl::StrCat("/proc/", pid, "/fd")));
      b.threads = std::min(b.threads, CountEntries(absl::StrCat("/proc/", pid, "/task")));
    }
    b.thread_names = ThreadNames(pid);
    b.fd_kinds = FdKinds(pid);
    b.rss_kib = RssKiB(pid);
    return b;
  }

  // Quotas: no tenant above its quota, beyond what it held when a reload
  // lowered it (that may only come down).
  void CheckQuotas() {
    absl::StatusOr<v1::GetStatsResponse> s = admin_->GetStats();
    if (!s.ok()) return;
    for (const v1::TenantStats& t : s->tenants()) {
      if (!t.has_quota() || !t.quota().has_total_bytes()) continue;
      uint64_t& floor = quota_floor_[t.name()];
      if (t.used_bytes() > std::max(t.quota().total_bytes(), floor)) {
        Violation(absl::StrCat("tenant ", t.name(), " holds ", t.used_bytes(),
                               " bytes, above its quota ", t.quota().total_bytes()));
      }
      floor = std::min(floor, t.used_bytes());
    }
  }

  void Reload() {
    WriteConfig();
    const size_t before = CountOf(NewLog(), "gpumemd: reloaded ");
    kill(daemon_->pid(), SIGHUP);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      if (CountOf(NewLog(), "gpumemd: reloaded ") > before) {
        ++reloads_;
        // What each tenant holds once the new quotas are in force may stay
        // above a lowered one (while above, it can only come down).
        absl::StatusOr<v1::GetStatsResponse> s = admin_->GetStats();
        if (s.ok()) {
          for (const v1::TenantStats& t : s->tenants()) quota_floor_[t.name()] = t.used_bytes();
        }
        return;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    Violation("a reload was not applied within 5 s: " + NewLog().substr(NewLog().size() > 500 ? NewLog().size() - 500 : 0));
  }

  static size_t CountOf(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  // ---- one daemon instance ----
  void Chaos(absl::Time until) {
    const absl::Duration tick = absl::Milliseconds(50);
    absl::Time next_poll = absl::Now();
    while (absl::Now() < until) {
      absl::SleepFor(tick);
      if (!DaemonAlive()) return;
      for (ClientProc& c : clients_) Absorb(c);
      const absl::Time now = absl::Now();
      if (Chance(absl::GetFlag(FLAGS_kill_per_sec), tick) && !clients_.empty()) {
        const size_t i = Pick(static_cast<int>(clients_.size()));
        const bool attacker = clients_[i].attacker;
        Retire(clients_[i]);
        clients_.erase(clients_.begin() + i);
        ++kills_;
        StartClient(attacker);
      }
      if (Chance(absl::GetFlag(FLAGS_reload_per_sec), tick)) Reload();
      if (Chance(absl::GetFlag(FLAGS_fill_per_sec), tick)) FillStart();
      WatchLedgerFs(now);
      if (now >= next_poll) {
        CheckQuotas();
        if (absl::StrContains(NewLog(), "LEDGER WRITE FAILED")) ledger_full_seen_ = true;
        next_poll = now + absl::Seconds(1);
      }
    }
  }

  void RunInstance(absl::Time until, bool last) {
    if (!StartDaemon()) return;
    if (instances_ > 0) {
      for (const std::string& bad : restart_check_->Verify(NewLog())) Violation(bad);
      if (survives_ != nullptr) CheckClientsCameBack();
    }
    ++instances_;
    // Warm-up, then the baseline with nothing held.
    StartClients();
    const absl::Duration warmup =
        std::min(absl::GetFlag(FLAGS_warmup), (until - absl::Now()) * 0.4);
    Chaos(absl::Now() + warmup);
    if (!DaemonAlive()) return;
    Quiesce("baseline");
    absl::SleepFor(absl::Milliseconds(500));
    const Baseline base = Measure();
    // Chaos until a little before the instance's end.
    StartClients();
    Chaos(until - absl::Seconds(8));
    if (!DaemonAlive()) return;
    if (Quiesce("end of instance " + std::to_string(instances_))) {
      absl::SleepFor(absl::Milliseconds(500));
      Baseline now = Measure();
      // Connections and threads end asynchronously after the quiesce: more
      // samples, over up to 10 s, before a count above the baseline is
      // called a leak (a leaked fd or thread stays).
      for (int i = 0; i < 40 && (now.fds > base.fds || now.OwnThreads() > base.OwnThreads());
           ++i) {
        absl::SleepFor(absl::Milliseconds(250));
        now = Measure();
      }
      const double growth = base.rss_kib > 0
                                ? static_cast<double>(now.rss_kib - base.rss_kib) / base.rss_kib
                                : 0;
      rss_growth_max_ = std::max(rss_growth_max_, growth);
      fd_delta_max_ = std::max(fd_delta_max_, now.fds - base.fds);
      thread_delta_max_ = std::max(thread_delta_max_, now.OwnThreads() - base.OwnThreads());
      timer_threads_max_ = std::max(timer_threads_max_, now.TimerThreads());
      last_baseline_ = base;
      last_end_ = now;
      if (now.fds > base.fds) {
        Violation(absl::StrCat("daemon fds ", now.fds, " above the baseline ", base.fds, " (",
                               Diff(base.fd_kinds, now.fd_kinds), ")"));
      }
      if (now.OwnThreads() > base.OwnThreads()) {
        Violation(absl::StrCat("daemon threads ", now.threads, " above the baseline ",
                               base.threads, " (", Diff(base.thread_names, now.thread_names),
                               ")"));
      }
      if (now.TimerThreads() > kMaxGrpcTimerThreads) {
        Violation(absl::StrCat("daemon has ", now.TimerThreads(),
                               " gRPC timer threads, more than ", kMaxGrpcTimerThreads,
                               " (timer callbacks blocked at once)"));
      }
      const bool judged = warmup >= absl::GetFlag(FLAGS_rss_min_warmup);
      rss_judged_ = rss_judged_ || judged;
      if (judged) rss_growth_judged_max_ = std::max(rss_growth_judged_max_, growth);
      if (judged && growth >= 0.01) {
        Violation(absl::StrCat("daemon RSS grew ", growth * 100, "% (", base.rss_kib, " -> ",
                               now.rss_kib, " KiB) after a warm-up of ",
                               absl::FormatDuration(warmup)));
      }
      CheckLedgerNow("end of instance " + std::to_string(instances_), /*expect_empty=*/true);
    }
    if (last) {
      // A clean stop: SIGTERM, exit 0, and the ledger as it is left.
      kill(daemon_->pid(), SIGTERM);
      int status = 0;
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (!daemon_->Exited(&status) && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        Violation(absl::StrCat("the daemon's clean stop exited with status ", status));
      }
      daemon_.reset();
      CheckLedgerNow("after the clean stop", /*expect_empty=*/true);
      return;
    }
    // Some load, then kill -9 under it.
    StartClients();
    Chaos(absl::Now() + absl::Seconds(std::max(2.0, Uniform(3, 7))));
    if (!DaemonAlive()) return;
    FillStop();  // the next start writes its DAEMON_RESTART events
    kill(daemon_->pid(), SIGKILL);
    daemon_->Kill();
    daemon_.reset();
    admin_.reset();
    ++restarts_;
    // What the ledger and the state file had when the daemon died, and who
    // runs: no client is killed until the next daemon's check is done.
    at_kill_.clear();
    for (ClientProc& c : clients_) {
      Absorb(c);
      at_kill_.push_back({c.child->pid(), c.attacker, StartTicks(c.child->pid()), c.last});
    }
    restart_check_->Killed(ledger_, at_kill_);
    CheckLedgerNow("after kill -9", /*expect_empty=*/false);
    max_pages_ += 4096;
    // The clients keep running: they find the daemon gone and reconnect.
  }

  // Survive: every worker that ran through the kill noticed the restart
  // (the C ABI pool's generation one up, the C++ Client's restarts too if it
  // had one) and lost exactly the blocks the daemon closed for a slab whose
  // fd no one gave back (raw blocks it never mapped; it reports any other
  // loss itself, as an ERROR). Waits for their figures up to 20 s.
  void CheckClientsCameBack() {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    std::vector<std::string> wrong;
    for (;;) {
      wrong.clear();
      for (ClientProc& c : clients_) Absorb(c);
      for (const ClientAtKill& k : at_kill_) {
        if (k.attacker || !k.last.seen) continue;
        const ClientProc* now = nullptr;
        for (const ClientProc& c : clients_) {
          if (c.child->pid() == k.pid) now = &c;
        }
        if (now == nullptr) continue;
        const int closed = survives_->HandleClosures(k.pid);
        const Totals& t = now->last;
        if (t.generation != k.last.generation + 1 ||
            (k.last.cxx != 0 && t.restarts != k.last.restarts + 1) ||
            t.lost != k.last.lost + closed || t.lost_bytes != 0) {
          wrong.push_back(absl::StrCat(
              "pid ", k.pid, ": pool generation ", k.last.generation, " -> ", t.generation,
              ", Client restarts ", k.last.restarts, " -> ", t.restarts, ", lost ", k.last.lost,
              " -> ", t.lost, " (the daemon closed ", closed,
              " of its blocks for their slab's fd), pool lost bytes ", t.lost_bytes));
        }
      }
      if (wrong.empty() || absl::Now() > deadline) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
    for (const std::string& w : wrong) Violation("after the restart, worker " + w);
    clients_checked_ += at_kill_.size();
  }

  void Summary() {
    KillAllClients();
    const uint64_t violations = violations_.size();
    printf("chaos soak: %s, %d worker(s) and %d attacker(s) at a time, ledger on %s\n",
           absl::FormatDuration(absl::GetFlag(FLAGS_duration)).c_str(),
           absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_attackers), ledger_fs_.c_str());
    printf("  requests %lu, allocations %lu, refused %lu, waiting requests %lu, lost to "
           "restarts %lu\n",
           totals_.ops, totals_.allocs, totals_.refused, totals_.waited, totals_.lost);
    printf("  client SIGKILLs %lu, attacks %lu, reloads %lu, ledger fills %lu%s, daemon kill -9 "
           "and restart %lu, daemon instances %lu\n",
           kills_, attacks_, reloads_, fills_,
           ledger_full_seen_ ? " (the daemon reported failed ledger writes)" : "", restarts_,
           instances_);
    printf("  quiesce checks %lu, ledger checks %lu (last: %lu events, %lu write outages "
           "recorded, %lu events dropped)\n",
           quiesces_, ledger_checks_, ledger_events_, gaps_, lost_events_);
    printf("  daemon at quiesce points: fds %+d, threads %+d (worst over instances; gRPC "
           "timer threads apart, at most %d), RSS growth "
           "%.3f%% (worst), %s; last instance fds %d -> %d, threads %d -> %d, RSS %ld -> %ld "
           "KiB\n",
           fd_delta_max_, thread_delta_max_, timer_threads_max_, rss_growth_max_ * 100,
           rss_judged_ ? absl::StrFormat("%.3f%% where judged (warm-up >= %s)",
                                         rss_growth_judged_max_ * 100,
                                         absl::FormatDuration(absl::GetFlag(FLAGS_rss_min_warmup)))
                             .c_str()
                       : "not judged (no instance warmed up long enough)",
           last_baseline_.fds,
           last_end_.fds, last_baseline_.threads, last_end_.threads,
           static_cast<long>(last_baseline_.rss_kib), static_cast<long>(last_end_.rss_kib));
    if (survives_ != nullptr) {
      printf("  survival: %s; client processes through a restart %lu\n",
             survives_->Figures().c_str(), clients_checked_);
    }
    printf("  invariant violations %lu\n", violations);
    for (const std::string& v : violations_) printf("    %s\n", v.c_str());
    if (absl::GetFlag(FLAGS_json)) {
      printf("{\"seconds\":%.0f,\"requests\":%lu,\"allocations\":%lu,\"refused\":%lu,"
             "\"lost\":%lu,\"client_kills\":%lu,\"attacks\":%lu,\"reloads\":%lu,"
             "\"ledger_fills\":%lu,\"daemon_restarts\":%lu,\"quiesce_checks\":%lu,"
             "\"ledger_checks\":%lu,\"fd_delta_max\":%d,\"thread_delta_max\":%d,"
             "\"grpc_timer_threads_max\":%d,"
             "\"rss_growth_max\":%.5f,\"rss_judged\":%s,\"violations\":%lu,"
             "\"ledger_fs\":\"%s\",\"restart_check\":\"%s\"%s%s,"
             "\"last_fds\":[%d,%d],\"last_threads\":[%d,%d],\"last_rss_kib\":[%ld,%ld]}\n",
             absl::ToDoubleSeconds(absl::GetFlag(FLAGS_duration)), totals_.ops, totals_.allocs,
             totals_.refused, totals_.lost, kills_, attacks_, reloads_, fills_, restarts_,
             quiesces_, ledger_checks_, fd_delta_max_, thread_delta_max_, timer_threads_max_,
             rss_growth_max_,
             rss_judged_ ? "true" : "false", violations, tmpfs_ ? "tmpfs" : "pages",
             survive_ ? "survive" : "close", survives_ != nullptr ? "," : "",
             survives_ != nullptr ? survives_->Json().c_str() : "", last_baseline_.fds,
             last_end_.fds, last_baseline_.threads, last_end_.threads,
             static_cast<long>(last_baseline_.rss_kib), static_cast<long>(last_end_.rss_kib));
    }
    fflush(stdout);
  }

  std::mt19937_64 rng_;
  std::string dir_, socket_, config_, log_, gpumemd_, client_, ledger_dir_, ledger_, ledger_fs_;
  bool root_ = false;
  std::vector<uid_t> uids_;
  bool tmpfs_ = false;
  uint64_t tmpfs_bytes_ = 4 * kMiB;
  int64_t max_pages_ = 2048;
  size_t log_offset_ = 0;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<Client> admin_;
  std::vector<ClientProc> clients_;
  std::unique_ptr<RestartCheck> restart_check_;
  bool survive_ = true;
  SurvivesRestart* survives_ = nullptr;  // restart_check_, in survive mode
  std::string state_;
  std::vector<ClientAtKill> at_kill_;
  uint64_t clients_checked_ = 0;
  std::map<std::string, uint64_t> quota_floor_;
  bool filling_ = false;
  absl::Time fill_until_;
  absl::Time full_since_ = absl::InfinitePast();
  bool ledger_full_seen_ = false;
  Totals totals_;
  std::vector<std::string> client_errors_;
  std::vector<std::string> violations_;
  uint64_t kills_ = 0, attacks_ = 0, reloads_ = 0, fills_ = 0, restarts_ = 0, instances_ = 0,
           quiesces_ = 0, ledger_checks_ = 0, ledger_events_ = 0, gaps_ = 0, lost_events_ = 0;
  int fd_delta_max_ = 0, thread_delta_max_ = 0, timer_threads_max_ = 0;
  double rss_growth_max_ = 0, rss_growth_judged_max_ = 0;
  bool rss_judged_ = false;
  Baseline last_baseline_, last_end_;
};

}  // namespace
}  // namespace soak
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  return gpumem::soak::Soak().Main();
}
