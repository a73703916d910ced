#!/usr/bin/env bash
# tests/gpu/run in CI: its flags and refusals, then every check against the
# fake driver, from a folder laid out as tests/gpu/pack lays it out (the
# programs Bazel built here, run with this machine's libraries), with a PATH
# that has no bazel (run builds nothing) and the fake nvidia-smi. The JSON
# must list every check; none may fail, and only those that cannot run on
# the fake (OpenMP offload, PyTorch and its allocator benchmark, and the
# tenant check outside root) may be skipped.
set -euo pipefail
run=$1 gpumemd=$2 gpumemctl=$3 share=$4 bench=$5 checks=$6 lib=$7 fake=$8 smi=$9 omp=${10}
header=${11}
source tests/client/sanitizer_env.sh
sanitizer_env "$lib"
# Copies, under /tmp: the tenant check runs one program as uid 65534.
work=$(mktemp -d /tmp/gpumemd-gpurun-XXXXXX)
chmod 0755 "$work"
rm_bin=$(command -v rm)
trap '"$rm_bin" -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/lib" "$work/fake" "$work/path"
for p in "$gpumemd" "$gpumemctl" "$share" "$bench" "$checks"; do
  cp -L "$p" "$work/bin/"
done
cp "$lib" "$work/lib/libgpumem.so.1"
ln -s libgpumem.so.1 "$work/lib/libgpumem.so"
cp "$fake" "$work/fake/libcuda.so.1"
mkdir -p "$work/drv"  # a driver only LD_LIBRARY_PATH names (below)
cp "$fake" "$work/drv/libcuda.so.1"
gcc $SANITIZER_CFLAGS -std=c11 -fopenmp -foffload=disable -I"$(dirname "$header")" "$omp" -o "$work/bin/omp_shards" \
  -L"$work/lib" -lgpumem
cp "$smi" "$work/path/nvidia-smi"
chmod +x "$work/path/nvidia-smi"
# Only what run needs: python3, the fake nvidia-smi; no bazel, no compiler.
ln -s /usr/bin/python3 "$work/path/python3"
for tool in env sh bash date cat grep sed seq sleep kill mktemp; do ln -s "$(command -v $tool)" "$work/path/$tool"; done
export PATH=$work/path
export LD_PRELOAD=${SANITIZER_PRELOAD}
fail() { echo "FAIL: $*" >&2; exit 1; }

# Refusals: no --bin, a folder that is not one, no driver without --fake.
rc=0; "$run" >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "run without --bin: exit $rc"
rc=0; out=$("$run" --bin=/nonexistent 2>&1) || rc=$?
[ "$rc" = 2 ] && [[ "$out" == *"tests/gpu/pack"* ]] || fail "run --bin=/nonexistent: exit $rc: $out"
rc=0; out=$("$run" --bin="$work" 2>&1) || rc=$?
[ "$rc" = 2 ] && [[ "$out" == *"no libcuda.so.1"* ]] || fail "run without a driver: exit $rc: $out"

# libcuda.so.1 where only LD_LIBRARY_PATH says (a directory ldconfig does not
# know): found, printed first, and used: the driver check runs on it.
rc=0
out=$(LD_LIBRARY_PATH="$work/drv" FAKE_CUDA_DEVICES=1x1GiB OUT="$work/probe" \
      "$run" --bin="$work" --only=driver --json 2>&1 >/dev/null) || rc=$?
[[ "$out" == *"from LD_LIBRARY_PATH: $work/drv"* ]] || fail "libcuda from LD_LIBRARY_PATH not named: $out"
python3 - "$work/probe/checks.jsonl" "$work/drv" <<'PY' || fail "checks.jsonl of the driver-only run"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["check"] for l in lines][:2] == ["libcuda", "driver"], lines
assert lines[0]["dirs"][-1] == sys.argv[2], lines[0]
assert lines[1]["result"] == "pass", lines[1]
PY

# --only=torchbench: the driver, gpumemd's start, the benchmark (skipped
# here: the fake driver runs no kernels, and torch may be absent) and the
# fake driver's verdict; nothing else.
rc=0
"$run" --bin="$work" --fake --json --only=torchbench >"$work/only.json" 2>"$work/only.err" || rc=$?
[ "$rc" = 0 ] || { cat "$work/only.err"; fail "run --fake --only=torchbench: exit $rc"; }
python3 - "$work/only.json" <<'PY' || fail "run --fake --only=torchbench"
import json, sys
checks = json.load(open(sys.argv[1]))["checks"]
assert list(checks) == ["driver", "start", "torchbench", "violations"], list(checks)
assert checks["torchbench"]["result"] == "skip", checks["torchbench"]
print("only=torchbench: %s" % checks["torchbench"]["detail"])
PY

start=$(date +%s)
rc=0
OUT="$work/out" "$run" --bin="$work" --fake --json --keep >"$work/out.json" 2>"$work/err" || rc=$?
echo "run --fake: exit $rc in $(( $(date +%s) - start )) s"
cat "$work/out.json"
[ -s "$work/out.json" ] || { cat "$work/err"; fail "run --fake printed no JSON"; }
python3 - "$work/out.json" "$rc" "$work/out/checks.jsonl" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rc = int(sys.argv[2])
want = ["driver", "start", "uuids", "granularity", "share_vmm", "share_ipc", "driver_free",
        "bench", "zeros", "fill", "stream_free", "contexts", "fork", "restart", "kill", "omp",
        "torch", "torchbench", "violations"]
checks = j["checks"]
missing = [c for c in want if c not in checks]
assert not missing, "missing checks: %s" % missing
# The tenant check needs root and setuid (skipped where it cannot).
may_skip = {"omp", "torch", "torchbench", "zeros"}
bad = {k: v for k, v in checks.items()
       if v["result"] == "fail" or (v["result"] == "skip" and k not in may_skip)}
assert not bad, json.dumps(bad, indent=1)
assert rc == 0, "exit %d with no failed check" % rc
assert j["fake_driver"] is True and j["failed"] == []
# The allocator benchmark needs a GPU: skipped, saying why (no torch, or --fake).
tb = checks["torchbench"]
assert tb["result"] == "skip" and ("torch does not import" in tb["detail"] or
                                   "--fake" in tb["detail"]), tb
# The OpenMP example refused device memory without an offload device.
assert checks["omp"]["result"] == "skip" and "refused cleanly" in checks["omp"]["detail"], checks["omp"]
rows = {r["op"] for r in j["bench"]["rows"]}
assert any(op.startswith("gpumemd first map") for op in rows), rows
assert "first_map_added_us" in j["bench"]["client_cost"], j["bench"]
assert checks["fill"]["refused_by"] == "placement", checks["fill"]
# Every check also went to $OUT/checks.jsonl, one line each, as it finished.
lines = [json.loads(l) for l in open(sys.argv[3])]
assert [l["check"] for l in lines] == list(checks), ([l["check"] for l in lines], list(checks))
assert all(l["result"] == checks[l["check"]]["result"] for l in lines)
assert all(a["at_s"] <= b["at_s"] for a, b in zip(lines, lines[1:]))
print("PASS: %d checks in %.1f s" % (len(checks), j["seconds"]))
PY
