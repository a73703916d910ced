#!/usr/bin/env bash
# Start-up of tenants and the ledger: the example tenants file works; a bad
# tenant config, a corrupt ledger, an unusable ledger path and a ledger
# another daemon holds are start-up errors (exit 1) that name the file, the
# line, SQLite's message or the other daemon's pid; the ledger directory is
# created; --ledger=none says so; a ledger whose disk is full still starts.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
GPUMEMD=$1
CTL=$2
TENANTS=$3

dir=$(mktemp -d /tmp/gpumemd-ledger-XXXXXX)
expect_start_error() {  # WHAT PATTERN ARGS...
  local what=$1 pattern=$2; shift 2
  set +e
  "$GPUMEMD" --socket="$dir/s.sock" "$@" 2>"$dir/err"
  local rc=$?
  set -e
  cat "$dir/err"
  [ "$rc" = 1 ] || fail "$what: exit $rc"
  grep -q -- "$pattern" "$dir/err" || fail "$what: no \"$pattern\" in the message"
  [ ! -e "$dir/s.sock" ] || fail "$what: a socket was created"
}

# The example tenants file, and a ledger in a directory that does not exist yet.
start_daemon "$GPUMEMD" --config="$TENANTS" --ledger="$dir/new/sub/ledger.db"
[ -f "$dir/new/sub/ledger.db" ] || fail "the ledger directory was not created"
"$CTL" --socket="$SOCK" tenants --json >"$WORKDIR/tenants.json"
json_check "$WORKDIR/tenants.json" \
  'sorted(t["name"] for t in j["tenants"]) == ["inference", "shared", "training"]'
json_check "$WORKDIR/tenants.json" \
  '[t for t in j["tenants"] if t["name"] == "inference"][0]["quota"]["total_bytes"] == str(24 << 30)'
"$CTL" --socket="$SOCK" alloc 1MiB >/dev/null
"$CTL" --socket="$SOCK" ledger >"$WORKDIR/ledger.txt"
grep -q "ALLOCATE .*tenant=shared" "$WORKDIR/ledger.txt" || { cat "$WORKDIR/ledger.txt"; fail "no ALLOCATE line"; }
# The session ends when the daemon sees gpumemctl gone, asynchronously.
session_end_logged() {
  "$CTL" --socket="$SOCK" ledger >"$WORKDIR/ledger.txt" &&
    grep -q "SESSION_END .*tenant=shared" "$WORKDIR/ledger.txt"
}
eventually 60 session_end_logged || { cat "$WORKDIR/ledger.txt"; fail "no SESSION_END line within 60 s"; }
# A second daemon may not use the same ledger.
expect_start_error "second daemon on one ledger" "ledger $dir/new/sub/ledger.db is in use by another gpumemd (pid $DAEMON_PID)" \
  --ledger="$dir/new/sub/ledger.db"
stop_daemon

# A ledger whose disk is full (the page limit: not even its schema fits)
# does not stop the start: the daemon serves, holds the events and the
# config's quotas, and says the ledger is failing. Made 0600 under umask 000.
(umask 000; start_daemon "$GPUMEMD" --config="$TENANTS" --ledger="$dir/full/ledger.db" --ledger_max_pages=1
 grep -q "LEDGER WRITE FAILED at start: ledger $dir/full/ledger.db" "$WORKDIR/daemon.log" || fail "no failing line at start"
 "$CTL" --socket="$SOCK" alloc 1MiB >/dev/null || fail "a daemon with a full ledger disk does not serve"
 "$CTL" --socket="$SOCK" stats --json >"$WORKDIR/stats.json"
 json_check "$WORKDIR/stats.json" 'j["ledger"]["failing"] is True and "full" in j["ledger"]["last_error"]'
 [ "$(stat -c %a "$dir/full/ledger.db")" = 600 ] || fail "ledger mode $(stat -c %a "$dir/full/ledger.db") under umask 000"
 stop_daemon)

start_daemon "$GPUMEMD" --ledger=none
grep -q "ledger off (--ledger=none)" "$WORKDIR/daemon.log" || fail "--ledger=none is not announced"
set +e
"$CTL" --socket="$SOCK" ledger 2>"$WORKDIR/err"
rc=$?
set -e
[ "$rc" = 1 ] || fail "ledger with --ledger=none: exit $rc"
grep -q "FAILED_PRECONDITION.*ledger is off" "$WORKDIR/err" || fail "ledger off message"
stop_daemon


printf 'tenant { name: "a" uids: 7 }\ntenant {\n  name: "b"\n  uids: 7\n}\n' >"$dir/dup.textproto"
expect_start_error "uid under two tenants" "dup.textproto:4: uid 7 is listed by tenant \"a\" and by tenant \"b\"" \
  --config="$dir/dup.textproto" --ledger=none
printf 'tenant {\n  name: "a"\n  quota { device { device: "9" bytes: "1GiB" } }\n}\n' >"$dir/dev.textproto"
expect_start_error "unknown device" "dev.textproto:3: .*no device \"9\"" \
  --config="$dir/dev.textproto" --ledger=none
head -c 8192 /dev/urandom >"$dir/corrupt.db"
expect_start_error "corrupt ledger" "ledger $dir/corrupt.db: file is not a database" \
  --ledger="$dir/corrupt.db"
echo x >"$dir/plainfile"
expect_start_error "unusable ledger path" "ledger $dir/plainfile/ledger.db: cannot create directory" \
  --ledger="$dir/plainfile/ledger.db"
rm -rf "$dir"
echo PASS
