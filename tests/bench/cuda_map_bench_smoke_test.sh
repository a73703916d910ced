#!/usr/bin/env bash
# cuda_map_bench runs end to end over the fake driver, with a cuda gpumemd
# over the same fake, and prints every row (figures not checked).
set -euo pipefail
BENCH=$1 GPUMEMD=$2 FAKE=$3
export LD_LIBRARY_PATH=$(cd "$(dirname "$FAKE")" && pwd)
export FAKE_CUDA_DEVICES=1x1GiB
dir=$(mktemp -d /tmp/gpumemd-bench-XXXXXX)
"$GPUMEMD" --backend=cuda --socket="$dir/s" --ledger="$dir/ledger.db" --slab_size=64MiB 2>"$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [ -S "$dir/s" ] && break; sleep 0.05; done
[ -S "$dir/s" ] || { cat "$dir/log"; exit 1; }
out=$("$BENCH" --rounds=2 --per_round=5 --slab_size=16777216 --socket="$dir/s" --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys
j = json.loads(sys.argv[1])
ops = [r["op"] for r in j["rows"]]
assert len(ops) == 12, ops
assert ops[2].startswith("VMM open") and ops[4].startswith("IPC open"), ops
assert ops[6].startswith("gpumemd Allocate") and ops[8].startswith("gpumemd first map"), ops
assert ops[10].startswith("gpumem_malloc") and ops[11].startswith("gpumem_free"), ops
assert all(r["n"] == 10 and r["p50_us"] > 0 for r in j["rows"])
c = j["client_cost"]
assert c["first_map_us"] > 0 and c["warm_cached_alloc_us"] > 0, c' "$out"
echo PASS
