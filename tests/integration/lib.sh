# Shared by the shell tests: start a daemon on a private socket, stop it,
# and fail with a message.
fail() {
  echo "FAIL: $*" >&2
  if [ -n "${WORKDIR:-}" ] && [ -s "$WORKDIR/daemon.log" ]; then
    echo "--- daemon log:" >&2
    cat "$WORKDIR/daemon.log" >&2
  fi
  exit 1
}

# start_daemon BINARY ARGS...: sets DAEMON_PID, SOCK, WORKDIR. The ledger is
# $WORKDIR/ledger.db unless ARGS give --ledger.
start_daemon() {
  local bin=$1; shift
  WORKDIR=$(mktemp -d /tmp/gpumemd-sh-XXXXXX)
  SOCK=$WORKDIR/gpumemd.sock
  "$bin" --socket="$SOCK" --ledger="$WORKDIR/ledger.db" "$@" 2>"$WORKDIR/daemon.log" &
  DAEMON_PID=$!
  for _ in $(seq 200); do [ -S "$SOCK" ] && return 0; sleep 0.05; done
  fail "daemon did not start"
}

stop_daemon() {
  kill -TERM "$DAEMON_PID"
  local rc=0
  wait "$DAEMON_PID" || rc=$?
  [ "$rc" = 0 ] || fail "daemon exited with $rc"
  [ ! -e "$SOCK" ] || fail "daemon left its socket behind"
  rm -rf "$WORKDIR"
}

# eventually SECONDS COMMAND...: reruns COMMAND every 50 ms until it
# succeeds (returns 0) or SECONDS have passed (returns 1): for a result the
# daemon produces asynchronously (a session's end, a release). The caller
# fails loudly on 1; SECONDS bound a hang, generous for sanitizer builds.
eventually() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.05
  done
}

# json_ok FILE PYTHON-EXPRESSION: evaluates the expression with `j` bound to
# the parsed JSON; returns 0 if it is true, 1 if not (does not fail the test).
json_ok() {
  /usr/bin/python3 -c 'import json,sys
j = json.load(open(sys.argv[1]))
ok = eval(sys.argv[2])
sys.exit(0 if ok else 1)' "$1" "$2"
}

# json_check FILE PYTHON-EXPRESSION: as json_ok, but fails the test (printing
# the file) if the expression is false.
json_check() {
  json_ok "$1" "$2" || { cat "$1" >&2; fail "JSON check failed: $2"; }
}
