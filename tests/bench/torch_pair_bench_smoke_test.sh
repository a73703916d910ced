#!/usr/bin/env bash
# torch_pair_bench runs end to end over the fake driver: a cuda gpumemd over
# the fake for the PyTorch entry points, a sim gpumemd for the C ABI's pair,
# 1000 frees pending on a held-back stream. Checks the shape, and the one
# figure that does not depend on the machine's speed: a same-stream pair
# makes at most 2 driver calls (the free's capture check), whatever is
# pending.
set -euo pipefail
BENCH=$1 GPUMEMD=$2 FAKE=$3
export LD_LIBRARY_PATH=$(cd "$(dirname "$FAKE")" && pwd)
export FAKE_CUDA_DEVICES=1x1GiB
dir=$(mktemp -d /tmp/gpumemd-bench-XXXXXX)
"$GPUMEMD" --backend=cuda --socket="$dir/c" --ledger=none --state=none --slab_size=64MiB \
  2>"$dir/clog" &
cpid=$!
"$GPUMEMD" --backend=sim --sim_devices=1x1GiB --socket="$dir/s" --ledger=none --state=none \
  --slab_size=64MiB 2>"$dir/slog" &
spid=$!
trap 'kill $cpid $spid 2>/dev/null; wait $cpid $spid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [ -S "$dir/c" ] && [ -S "$dir/s" ] && break; sleep 0.05; done
[ -S "$dir/c" ] && [ -S "$dir/s" ] || { cat "$dir/clog" "$dir/slog"; exit 1; }
out=$(GPUMEMD_SOCKET="$dir/c" "$BENCH" --sim_socket="$dir/s" --rounds=2 --per_round=50 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys
j = json.loads(sys.argv[1])
assert j["pairs"] == 100 and j["pending_frees"] == 1000, j
assert j["torch_pair"]["p50_us"] > 0 and j["sim_pair"]["p50_us"] > 0, j
assert 0 <= j["driver_calls_per_torch_pair"] <= 2, j
assert j["reserved_bytes"]["max"] >= 1000 * 65536, j' "$out"
echo PASS
