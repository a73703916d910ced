// See terminal_screen.h.
#include "client/ctl/terminal_screen.h"

#include <curses.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {

absl::StatusOr<std::unique_ptr<TerminalScreen>> TerminalScreen::Open() {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    return absl::FailedPreconditionError("stdin and stdout must be a terminal");
  }
  SCREEN* screen = newterm(nullptr, stdout, stdin);
  if (screen == nullptr) {
    const char* term = std::getenv("TERM");
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot drive this terminal (TERM=", term != nullptr ? term : "unset", ")"));
  }
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  return std::unique_ptr<TerminalScreen>(new TerminalScreen(screen));
}

TerminalScreen::~TerminalScreen() {
  endwin();
  delscreen(static_cast<SCREEN*>(screen_));
}

void TerminalScreen::Size(int* width, int* height) const {
  int h = 0, w = 0;
  getmaxyx(stdscr, h, w);
  *width = w;
  *height = h;
}

void TerminalScreen::Draw(const std::vector<std::string>& lines) {
  int w = 0, h = 0;
  Size(&w, &h);
  erase();
  for (size_t i = 0; i < lines.size() && static_cast<int>(i) < h; ++i) {
    mvaddnstr(static_cast<int>(i), 0, lines[i].c_str(), w);
  }
  refresh();
}

TerminalScreen::Key TerminalScreen::Wait(int timeout_ms) {
  timeout(timeout_ms);
  const int ch = getch();
  if (ch == ERR) return Key::kNone;
  if (ch == 'q' || ch == 'Q') return Key::kQuit;
  if (ch == KEY_RESIZE) return Key::kResize;
  return Key::kOther;
}

}  // namespace client
}  // namespace gpumem
