#!/usr/bin/env bash
# gpumemctl as a user runs it: stats (table and JSON), alloc with sizes and
# placement flags, --hold and free from another process, exit statuses, and
# the ledger line of stats (and top's warning) while the ledger file is away.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
GPUMEMD=$1
CTL=$2

start_daemon "$GPUMEMD" --sim_devices=4x4GiB --slab_size=256MiB --sim_topology=nvlink:0-1
ctl() { "$CTL" --socket="$SOCK" "$@"; }

ctl stats >"$WORKDIR/stats.txt"
grep -q "^backend: sim" "$WORKDIR/stats.txt" || fail "stats table has no backend line"
[ "$(grep -c '^[0-3] *GPU-' "$WORKDIR/stats.txt")" = 4 ] || { cat "$WORKDIR/stats.txt"; fail "stats table lacks 4 device rows"; }
grep -Eq '^ *0 +X +NV +SYS +SYS$' "$WORKDIR/stats.txt" || { cat "$WORKDIR/stats.txt"; fail "peer matrix row 0"; }
grep -Eq "^ledger $WORKDIR/ledger.db: ok, [0-9]+ events? committed, 0 held, 0 dropped, WAL [0-9]+ pages?\$" "$WORKDIR/stats.txt" || { cat "$WORKDIR/stats.txt"; fail "stats has no ledger ok line"; }

ctl stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'len(j["devices"]) == 4 and j["devices"][1]["total_bytes"] == str(4 << 30)'
uuid2=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["devices"][2]["uuid"])' "$WORKDIR/stats.json")

# Every size syntax of the issue, each on the device asked for.
for size in 4096 64KiB 1.5GiB 2G; do
  out=$(ctl alloc "$size" --gpus=3 2>/dev/null)
  grep -Eq '^[0-9]+ +3 +GPU-' <<<"$out" || { echo "$out"; fail "alloc $size --gpus=3"; }
done
out=$(ctl alloc 1MiB --gpus="$uuid2" 2>/dev/null)
grep -q "$uuid2" <<<"$out" || fail "alloc by uuid"
out=$(ctl alloc 8MiB --shards=4 2>/dev/null)
[ "$(grep -Ec '^[0-9]+ +[0-3] +GPU-' <<<"$out")" = 4 ] || { echo "$out"; fail "4 shards"; }
out=$(ctl alloc 1MiB --gpus=0,1,3 --policy=near:1 2>/dev/null)
grep -Eq '^[0-9]+ +1 +GPU-' <<<"$out" || { echo "$out"; fail "near:1 should pick device 1 itself"; }
out=$(ctl alloc 1MiB --gpus=0,3 --policy=near:1 2>/dev/null)
grep -Eq '^[0-9]+ +0 +GPU-' <<<"$out" || { echo "$out"; fail "near:1 should pick its NVLink peer 0"; }

# Without --hold everything went back when each gpumemctl exited (the
# daemon sees each session end by itself, asynchronously).
all_back() {
  ctl stats --json >"$WORKDIR/stats.json" &&
    json_ok "$WORKDIR/stats.json" 'all(d["used_bytes"] == "0" for d in j["devices"])'
}
eventually 60 all_back || { cat "$WORKDIR/stats.json"; fail "memory still used 60 s after every gpumemctl exited"; }

# --hold keeps it; another process frees it by id.
coproc HOLD { exec "$CTL" --socket="$SOCK" alloc 1.5GiB --gpus=1 --hold 2>/dev/null; }
read -r _header <&"${HOLD[0]}"
read -r id dev _rest <&"${HOLD[0]}"
[ "$dev" = 1 ] || fail "held allocation on device $dev"
ctl stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'j["devices"][1]["used_bytes"] == str(3 << 29) and j["devices"][1]["allocation_count"] == "1"'
# 1.5 GiB is bigger than a 256 MiB slab: a dedicated slab of exactly that size.
ctl stats --slabs >"$WORKDIR/slabs.txt"
grep -Eq '^1 +[0-9]+ +1\.50 GiB +1\.50 GiB +0 B +0 B +0\.000 +1 dedicated$' "$WORKDIR/slabs.txt" || { cat "$WORKDIR/slabs.txt"; fail "dedicated slab row"; }
[ "$(ctl free "$id")" = "freed $id" ] || fail "free $id"
ctl stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'j["devices"][1]["used_bytes"] == "0"'
kill -INT "$HOLD_PID"
wait "$HOLD_PID" || fail "gpumemctl --hold did not exit 0 on SIGINT"

# Exit statuses: 2 for usage, 1 for a refusal from the daemon.
expect_rc() {
  local want=$1; shift
  set +e; "$@" >"$WORKDIR/out" 2>&1; local rc=$?; set -e
  [ "$rc" = "$want" ] || { cat "$WORKDIR/out"; fail "$* exited $rc, want $want"; }
}
expect_rc 2 ctl alloc "12 parsecs"
expect_rc 2 ctl alloc 1MiB --gpus=0,,1
expect_rc 2 ctl alloc 1MiB --policy=sideways
expect_rc 2 ctl frobnicate
expect_rc 2 ctl free notanumber
expect_rc 1 ctl alloc 64GiB
grep -q "INVALID_ARGUMENT" "$WORKDIR/out" || fail "64GiB should be INVALID_ARGUMENT"
expect_rc 1 ctl alloc 1MiB --gpus=9
grep -q 'no device "9"' "$WORKDIR/out" || fail "unknown device not named"
expect_rc 1 ctl alloc 3GiB --gpus=0 --exclude=0
grep -q "RESOURCE_EXHAUSTED" "$WORKDIR/out" || fail "excluded-only should be RESOURCE_EXHAUSTED"
expect_rc 1 ctl free 424242
grep -q "NOT_FOUND" "$WORKDIR/out" || fail "free of unknown id"
expect_rc 1 "$CTL" --socket="$WORKDIR/nothing.sock" stats
grep -q "is the daemon running" "$WORKDIR/out" || fail "no hint when the daemon is down"

# The ledger file away: stats says FAILING with the error and what is held,
# top warns; once it is back, ok again with the outage's failed commits.
ledger_line() { ctl stats | grep '^ledger ' >"$WORKDIR/ledger.txt"; }
failing() { ledger_line && grep -Eq ': FAILING: .*; [1-9][0-9]* events? held in memory and retried, 0 dropped, [1-9][0-9]* failed commits?$' "$WORKDIR/ledger.txt"; }
mv "$WORKDIR/ledger.db" "$WORKDIR/aside.db"
ctl alloc 1MiB >/dev/null 2>&1
eventually 60 failing || { cat "$WORKDIR/ledger.txt"; fail "stats never said the ledger is failing"; }
grep -qF "ledger $WORKDIR/ledger.db: FAILING: ledger $WORKDIR/ledger.db was removed while gpumemd ran" "$WORKDIR/ledger.txt" || { cat "$WORKDIR/ledger.txt"; fail "the failing line does not name the file and why"; }
cat "$WORKDIR/ledger.txt"  # the test log shows a real line
ctl stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'j["ledger"]["failing"] is True and int(j["ledger"]["held_events"]) > 0 and "was removed" in j["ledger"]["last_error"]'
ctl top --plain --iterations=1 >"$WORKDIR/top.txt"
grep -Eq '^LEDGER FAILING: [1-9][0-9]* events? held in memory, 0 dropped; allocations are served: ledger ' "$WORKDIR/top.txt" || { cat "$WORKDIR/top.txt"; fail "top does not warn of the failing ledger"; }
mv "$WORKDIR/aside.db" "$WORKDIR/ledger.db"
written() { ledger_line && grep -Eq ': ok, [0-9]+ events? committed, 0 held, 0 dropped, WAL [0-9]+ pages?, [1-9][0-9]* failed commits?$' "$WORKDIR/ledger.txt"; }
eventually 60 written || { cat "$WORKDIR/ledger.txt"; fail "stats never said the ledger writes again"; }
cat "$WORKDIR/ledger.txt"
ctl top --plain --iterations=1 >"$WORKDIR/top.txt"
if grep -q LEDGER "$WORKDIR/top.txt"; then cat "$WORKDIR/top.txt"; fail "top still warns"; fi

stop_daemon

start_daemon "$GPUMEMD" --sim_devices=1x1GiB --ledger=none
ctl stats >"$WORKDIR/stats.txt"
grep -qx 'ledger: off (--ledger=none): no events are recorded' "$WORKDIR/stats.txt" || { cat "$WORKDIR/stats.txt"; fail "stats with --ledger=none"; }
ctl stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'j["ledger"]["enabled"] is False and j["ledger"]["path"] == ""'
stop_daemon
echo PASS
