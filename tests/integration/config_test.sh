#!/usr/bin/env bash
# The example config starts a daemon with what it says; flags override it;
# a malformed config is refused with exit status 1.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
GPUMEMD=$1
CTL=$2
CONFIG=$3

start_daemon "$GPUMEMD" --config="$CONFIG"
"$CTL" --socket="$SOCK" stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'len(j["devices"]) == 4 and j["devices"][0]["total_bytes"] == str(16 << 30)'
json_check "$WORKDIR/stats.json" 'j["devices"][0]["peers"] == ["PEER_LINK_SELF", "PEER_LINK_NVLINK", "PEER_LINK_HOST", "PEER_LINK_HOST"]'
stop_daemon

start_daemon "$GPUMEMD" --config="$CONFIG" --sim_devices=2x1GiB --sim_topology=nvlink:0-1
"$CTL" --socket="$SOCK" stats --json >"$WORKDIR/stats.json"
json_check "$WORKDIR/stats.json" 'len(j["devices"]) == 2'
stop_daemon

dir=$(mktemp -d /tmp/gpumemd-cfg-XXXXXX)
echo 'backend: "sim" slab_size: 7' >"$dir/bad.textproto"
set +e
"$GPUMEMD" --config="$dir/bad.textproto" --socket="$dir/s.sock" --ledger=none 2>"$dir/err"
rc=$?
"$GPUMEMD" --config="$dir/missing.textproto" --socket="$dir/s.sock" --ledger=none 2>>"$dir/err"
rc2=$?
set -e
cat "$dir/err"
[ "$rc" = 1 ] || fail "malformed config: exit $rc"
[ "$rc2" = 1 ] || fail "missing config: exit $rc2"
grep -q "not a valid gpumem.v1.DaemonConfig" "$dir/err" || fail "malformed config message"
grep -q "cannot read config" "$dir/err" || fail "missing config message"
rm -rf "$dir"
echo PASS
