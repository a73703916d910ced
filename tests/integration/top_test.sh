#!/usr/bin/env bash
# gpumemctl top in a real terminal: tmux (Debian's) runs it against a loaded
# sim daemon (held memory, a quota, allocations and quota refusals going on)
# and the test reads the screen with capture-pane: device bars and figures,
# the tenant against its quota, the session holding the most, nonzero rates.
# Then the terminal is made too small (a message, no crash) and big again,
# the daemon is stopped (top says it is unreachable and keeps running) and
# started again on the same socket (top carries on and says it restarted),
# and `q` quits with status 0. Also: the plain mode through a pipe, and, as
# root, what uid nobody's top shows (device figures, not root's tenant or
# sessions).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
GPUMEMD=$1
CTL=$2

WORKDIR=$(mktemp -d /tmp/gpumemd-top-XXXXXX)
chmod 755 "$WORKDIR"
SOCK=$WORKDIR/gpumemd.sock
TMUX_SOCK=$WORKDIR/tmux.sock
DAEMON_PID=""
LOAD_PID=""
HOLD_PID=""
cleanup() {
  [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null || true
  [ -n "$HOLD_PID" ] && kill "$HOLD_PID" 2>/dev/null || true
  tmux -S "$TMUX_SOCK" kill-server 2>/dev/null || true
  [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORKDIR"
}
trap cleanup EXIT

daemon_up() {
  "$GPUMEMD" --socket="$SOCK" --ledger="$WORKDIR/ledger.db" --sim_devices=2x1GiB \
    --slab_size=64MiB 2>>"$WORKDIR/daemon.log" &
  DAEMON_PID=$!
  for _ in $(seq 200); do [ -S "$SOCK" ] && return 0; sleep 0.05; done
  fail "daemon did not start"
}
daemon_down() {
  kill -TERM "$DAEMON_PID"
  wait "$DAEMON_PID" || true
  DAEMON_PID=""
}
ctl() { "$CTL" --socket="$SOCK" "$@"; }
t() { tmux -S "$TMUX_SOCK" "$@"; }
screen() { t capture-pane -p -t top; }
# wait_screen DESCRIPTION GREP-E-PATTERN...: every pattern on the screen at once.
wait_screen() {
  local what=$1; shift
  for _ in $(seq 150); do
    local s ok=1
    s=$(screen 2>/dev/null || true)
    for p in "$@"; do grep -Eq -- "$p" <<<"$s" || { ok=0; break; }; done
    [ $ok = 1 ] && return 0
    sleep 0.1
  done
  echo "--- screen:" >&2; screen >&2 || true
  fail "top never showed $what"
}

daemon_up
ctl quota "uid-$(id -u)" --total=512MiB >/dev/null
coproc HOLD { exec "$CTL" --socket="$SOCK" alloc 300MiB --gpus=0 --hold 2>/dev/null; }
HOLD_PID=$HOLD_PID
read -r _header <&"${HOLD[0]}"
read -r _id _dev _rest <&"${HOLD[0]}"
# Load: allocations that come and go, and refusals for quota (300 + 400 > 512 MiB).
( while :; do
    "$CTL" --socket="$SOCK" alloc 1MiB --gpus=1 >/dev/null 2>&1 || true
    "$CTL" --socket="$SOCK" alloc 400MiB >/dev/null 2>&1 || true
  done ) &
LOAD_PID=$!

t -f /dev/null new-session -d -s top -x 120 -y 40 \
  "$CTL --socket=$SOCK top --interval=250ms; echo \"top-exit=\$?\" > $WORKDIR/top.rc; sleep 60"

wait_screen "the daemon's title" "sim daemon at $SOCK" "q quits"
# Device 0 holds the 300 MiB block: about 30% of its bar is used (#).
wait_screen "device rows" '^  0 \[#{10,}' '^  1 \[' 'USED POOLED RETAIN'
wait_screen "the tenant against its quota" "^uid-$(id -u) +[0-9.]+M +0 +512M +[0-9]+% "
wait_screen "the holding session first" '^SESSION' "^[0-9]+ +$HOLD_PID +$(id -u) +300M +1 "
# Each rate in a frame of its own: a frame's rates are over its interval
# (250 ms), and where a gpumemctl process takes longer than that (under ASan
# on a loaded machine, about 0.7 s a loop) the load's allocation and its
# refusal seldom fall in one interval.
wait_screen "an allocation rate" 'allocations/s [0-9]*[1-9][0-9.]*'
wait_screen "a quota refusal rate" 'quota [0-9]*[1-9][0-9.]*'
screen >"$WORKDIR/screen.txt"
echo "--- the loaded screen:"; cat "$WORKDIR/screen.txt"
[ "$(wc -L <"$WORKDIR/screen.txt")" -le 120 ] || fail "a line wider than the terminal"

# Too small, then big again.
t resize-window -t top -x 50 -y 10
wait_screen "the too-small message" 'this terminal is 50x10' 'at least 76x12'
t resize-window -t top -x 100 -y 30
wait_screen "the view after growing back" '^  0 \[#' "^uid-$(id -u) "

# The daemon goes away: top stays up and says so, keeping the last figures.
kill "$LOAD_PID"; wait "$LOAD_PID" 2>/dev/null || true; LOAD_PID=""
kill "$HOLD_PID"; wait "$HOLD_PID" 2>/dev/null || true; HOLD_PID=""
daemon_down
wait_screen "that the daemon is unreachable" 'DAEMON UNREACHABLE' 'figures below are from' '^  0 \['
[ ! -e "$WORKDIR/top.rc" ] || fail "top exited when the daemon went away: $(cat "$WORKDIR/top.rc")"
# It comes back: top carries on with the new daemon's figures.
daemon_up
wait_screen "the restarted daemon" 'daemon restarted' '^  0 \[\.+\] +0 '
wait_screen "rates again" 'allocations/s [0-9]'

t send-keys -t top q
for _ in $(seq 100); do [ -s "$WORKDIR/top.rc" ] && break; sleep 0.1; done
[ "$(cat "$WORKDIR/top.rc" 2>/dev/null)" = "top-exit=0" ] || fail "q: $(cat "$WORKDIR/top.rc" 2>/dev/null || echo 'top did not exit')"

# Plain mode through a pipe: whole views, no escape sequences.
ctl top --interval=100ms --iterations=2 | cat >"$WORKDIR/plain.txt"
[ "$(grep -c '^gpumemctl top - sim daemon' "$WORKDIR/plain.txt")" = 2 ] || { cat "$WORKDIR/plain.txt"; fail "plain: two views"; }
if grep -q $'\e' "$WORKDIR/plain.txt"; then fail "plain output has escape sequences"; fi
grep -q "q quits" "$WORKDIR/plain.txt" && fail "plain mode offers q"

# Bad input.
set +e
out=$(ctl top --interval=5ms 2>&1); rc=$?
set -e
[ $rc = 2 ] && grep -q "100ms to 1h" <<<"$out" || fail "--interval=5ms: rc $rc: $out"
set +e
out=$("$CTL" --socket="$WORKDIR/none.sock" top --iterations=1 2>&1); rc=$?
set -e
[ $rc = 0 ] && grep -q "DAEMON UNREACHABLE.*no socket at $WORKDIR/none.sock (is gpumemd running?)" <<<"$out" \
  || fail "no daemon: rc $rc: $out"

# Visibility: another uid sees device figures but not root's tenant or sessions.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  coproc HOLD2 { exec "$CTL" --socket="$SOCK" alloc 2MiB --gpus=1 --hold 2>/dev/null; }
  read -r _header <&"${HOLD2[0]}"
  read -r _line <&"${HOLD2[0]}"
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" --socket="$SOCK" top --iterations=1)
  grep -Eq '^  1 \[' <<<"$out" || { echo "$out"; fail "nobody sees no device rows"; }
  grep -q '^uid-0 ' <<<"$out" && { echo "$out"; fail "nobody sees root's tenant"; }
  grep -Eq "^[0-9]+ +$HOLD2_PID " <<<"$out" && { echo "$out"; fail "nobody sees root's session"; }
  grep -q "(no session you may see)" <<<"$out" || { echo "$out"; fail "nobody's empty session list"; }
  kill "$HOLD2_PID"; wait "$HOLD2_PID" 2>/dev/null || true
fi
echo PASS
