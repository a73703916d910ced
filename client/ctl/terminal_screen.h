// TerminalScreen: the full-screen terminal of `gpumemctl top`, over ncurses
// (Debian's libncursesw: terminfo knows each terminal's escape sequences,
// SIGWINCH becomes a resize key, and only what changed is redrawn).
//
// Guarantees: while a TerminalScreen lives the terminal is in cbreak, no
// echo, cursor hidden mode on the alternate screen; its destructor puts it
// back as it was (also when the program ends by returning from a signal-
// interrupted wait). Lines are drawn as given, clipped to the screen. Its
// own file because curses.h defines macros (OK, ERR, timeout, erase) that
// clash with gRPC and Abseil names: nothing else includes it.
// Not thread-safe; at most one at a time.
#ifndef GPUMEMD_CLIENT_CTL_TERMINAL_SCREEN_H_
#define GPUMEMD_CLIENT_CTL_TERMINAL_SCREEN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpumem {
namespace client {

class TerminalScreen {
 public:
  // FAILED_PRECONDITION when stdin/stdout is not a terminal ncurses can
  // drive (unknown TERM).
  static absl::StatusOr<std::unique_ptr<TerminalScreen>> Open();
  ~TerminalScreen();
  TerminalScreen(const TerminalScreen&) = delete;
  TerminalScreen& operator=(const TerminalScreen&) = delete;

  // Columns and rows now.
  void Size(int* width, int* height) const;
  void Draw(const std::vector<std::string>& lines);

  enum class Key { kNone, kQuit, kResize, kOther };
  // The next key within `timeout_ms` (kNone: none came, or a signal
  // interrupted the wait). 'q' and 'Q' are kQuit.
  Key Wait(int timeout_ms);

 private:
  explicit TerminalScreen(void* screen) : screen_(screen) {}
  void* screen_;  // SCREEN*
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_CTL_TERMINAL_SCREEN_H_
