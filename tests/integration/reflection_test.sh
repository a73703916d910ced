#!/usr/bin/env bash
# The daemon as grpcurl users see it, through a real reflection client
# (buf curl, installed by tools/install-deps): list the services, call
# GetStats and the health check by name, get a precise error back.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
GPUMEMD=$1
BUF=${GPUMEMD_BUF:-/usr/local/lib/gpumemd-tools/bin/buf}
[ -x "$BUF" ] || fail "buf not found at $BUF: run tools/install-deps"

start_daemon "$GPUMEMD" --sim_devices=4x2GiB
curl_args=(curl --protocol grpc --http2-prior-knowledge --unix-socket "$SOCK")

services=$("$BUF" "${curl_args[@]}" --list-services http://localhost) || fail "buf could not list services"
echo "$services"
grep -qx "gpumem.v1.GpuMemory" <<<"$services" || fail "GpuMemory not listed"
grep -qx "grpc.health.v1.Health" <<<"$services" || fail "health service not listed"

methods=$("$BUF" "${curl_args[@]}" --list-methods http://localhost)
for m in Allocate Free GetStats GetSession; do
  grep -qx "gpumem.v1.GpuMemory/$m" <<<"$methods" || fail "method $m not listed"
done

"$BUF" "${curl_args[@]}" -d '{}' http://localhost/gpumem.v1.GpuMemory/GetStats >"$WORKDIR/stats.json"
# buf prints lowerCamelCase names (grpcurl prints the proto names); the
# fields are present even when zero.
json_check "$WORKDIR/stats.json" 'len(j["devices"]) == 4 and all(k in d for d in j["devices"] for k in ("index", "uuid", "totalBytes", "usedBytes", "freeBytes"))'
json_check "$WORKDIR/stats.json" '[d["index"] for d in j["devices"]] == [0, 1, 2, 3] and j["devices"][3]["totalBytes"] == str(2 << 30) and j["devices"][0]["usedBytes"] == "0"'

"$BUF" "${curl_args[@]}" -d '{}' http://localhost/grpc.health.v1.Health/Check >"$WORKDIR/health.json"
json_check "$WORKDIR/health.json" 'j["status"] == "SERVING"'

set +e
"$BUF" "${curl_args[@]}" -d '{"size_bytes": "4096", "placement": {"devices": ["7"]}}' \
  http://localhost/gpumem.v1.GpuMemory/Allocate >"$WORKDIR/err.json" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] || fail "Allocate on a missing device succeeded"
grep -q "invalid_argument" "$WORKDIR/err.json" || { cat "$WORKDIR/err.json"; fail "not INVALID_ARGUMENT"; }
grep -q 'no device \\"7\\"' "$WORKDIR/err.json" || { cat "$WORKDIR/err.json"; fail "message does not name the device"; }

# The daemon is still serving, and a real allocation made over reflection
# is freed when buf's process exits.
"$BUF" "${curl_args[@]}" -d '{"size_bytes": "1048576"}' http://localhost/gpumem.v1.GpuMemory/Allocate >"$WORKDIR/alloc.json"
json_check "$WORKDIR/alloc.json" 'j["allocations"][0]["sizeBytes"] == "1048576"'
all_back() {
  "$BUF" "${curl_args[@]}" -d '{}' http://localhost/gpumem.v1.GpuMemory/GetStats >"$WORKDIR/stats.json" &&
    json_ok "$WORKDIR/stats.json" 'all(d["usedBytes"] == "0" for d in j["devices"])'
}
eventually 60 all_back || { cat "$WORKDIR/stats.json"; fail "memory still used 60 s after buf exited"; }

stop_daemon
echo "PASS"
