// See gpumemctl_top.h. TerminalScreen (ncurses) drives the terminal; the
// view itself is plain lines from TopView, so the plain mode and the tests
// see the same text.
#include "client/ctl/gpumemctl_top.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "client/ctl/terminal_screen.h"
#include "client/ctl/top_view.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace client {
namespace {

volatile sig_atomic_t stop_requested = 0;

void OnStopSignal(int) { stop_requested = 1; }

// SIGINT and SIGTERM end the loop (no SA_RESTART: a wait in getch or a
// sleep returns at once). ncurses leaves handlers that are not SIG_DFL alone.
void CatchStopSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Waits until `deadline` or until stop() is true, in short steps.
void SleepUntil(absl::Time deadline, const std::function<bool()>& stop) {
  while (!stop()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    absl::SleepFor(std::min(left, absl::Milliseconds(50)));
  }
}

class GrpcStatsSource {
 public:
  GrpcStatsSource(std::string socket_path, absl::Duration timeout)
      : socket_path_(std::move(socket_path)), timeout_(timeout) {}

  absl::StatusOr<v1::GetStatsResponse> operator()() {
    struct stat st;
    if (stat(socket_path_.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      stub_.reset();
      return absl::UnavailableError(
          absl::StrCat("no socket at ", socket_path_, " (is gpumemd running?)"));
    }
    if (stub_ == nullptr) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
      // A channel of its own, not one of gRPC's pooled (maybe dead) ones.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      stub_ = v1::GpuMemory::NewStub(grpc::CreateCustomChannel(
          "unix:" + socket_path_, grpc::InsecureChannelCredentials(), args));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    v1::GetStatsResponse resp;
    grpc::Status s = stub_->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    if (!s.ok()) {
      stub_.reset();  // the next refresh connects afresh
      if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no answer within ", absl::FormatDuration(timeout_), " at ", socket_path_));
      }
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return resp;
  }

 private:
  const std::string socket_path_;
  const absl::Duration timeout_;
  std::unique_ptr<v1::GpuMemory::Stub> stub_;
};

void Refresh(TopView& view, const StatsSource& source) {
  absl::StatusOr<v1::GetStatsResponse> stats = source();
  const absl::Time now = absl::Now();
  if (stats.ok()) {
    view.Update(*std::move(stats), now);
  } else {
    view.Unreachable(stats.status(), now);
  }
}

int RunInteractive(const TopOptions& o, const StatsSource& source) {
  absl::StatusOr<std::unique_ptr<TerminalScreen>> screen = TerminalScreen::Open();
  if (!screen.ok()) {
    std::cerr << "gpumemctl top: " << screen.status().message() << "; use --plain\n";
    return 1;
  }
  TopView view(o.socket_path, o.interval);
  auto draw = [&] {
    int w = 0, h = 0;
    (*screen)->Size(&w, &h);
    (*screen)->Draw(view.Render(w, h));
  };
  bool quit = false;
  for (int done = 0; !quit && !stop_requested;) {
    const absl::Time deadline = absl::Now() + o.interval;
    Refresh(view, source);
    draw();
    if (o.iterations > 0 && ++done >= o.iterations) break;
    while (!quit && !stop_requested) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) break;
      switch ((*screen)->Wait(static_cast<int>(std::min<int64_t>(ms, 1000)))) {
        case TerminalScreen::Key::kQuit: quit = true; break;
        case TerminalScreen::Key::kResize: draw(); break;  // the last answer, no new call
        default: break;
      }
    }
  }
  return 0;  // the screen's destructor restores the terminal
}

}  // namespace

StatsSource DaemonStatsSource(const std::string& socket_path, absl::Duration timeout) {
  auto source = std::make_shared<GrpcStatsSource>(socket_path, timeout);
  return [source] { return (*source)(); };
}

int RunPlainTop(const TopOptions& o, const StatsSource& source, std::ostream& out,
                const std::function<bool()>& stop) {
  TopView view(o.socket_path, o.interval);
  for (int done = 0; !stop();) {
    const absl::Time deadline = absl::Now() + o.interval;
    Refresh(view, source);
    for (const std::string& line : view.RenderAll(o.plain_width)) out << line << "\n";
    out << "\n";
    out.flush();
    if (o.iterations > 0 && ++done >= o.iterations) break;
    SleepUntil(deadline, stop);
  }
  return 0;
}

int RunTop(const TopOptions& options) {
  TopOptions o = options;
  if (o.socket_path.empty()) o.socket_path = DefaultSocketPath();
  if (o.interval < absl::Milliseconds(100) || o.interval > absl::Hours(1)) {
    std::cerr << "gpumemctl: --interval wants a duration from 100ms to 1h, like 1s or 500ms\n";
    return 2;
  }
  if (const char* cols = std::getenv("COLUMNS")) {
    int c;
    if (absl::SimpleAtoi(cols, &c) && c >= 40 && c <= 1000) o.plain_width = c;
  }
  CatchStopSignals();
  // A daemon that does not answer within 2 s shows as unreachable (and q
  // is read again at least that often).
  StatsSource source = DaemonStatsSource(o.socket_path, absl::Seconds(2));
  if (o.plain || !isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO)) {
    return RunPlainTop(o, source, std::cout, [] { return stop_requested != 0; });
  }
  return RunInteractive(o, source);
}

}  // namespace client
}  // namespace gpumem
