#!/usr/bin/env bash
# The Python benchmark runs end to end and prints its JSON rows.
set -euo pipefail
bench=$1 gpumemd=$2 lib=$3
source tests/client/sanitizer_env.sh
sanitizer_env "$lib"
out=$(LD_PRELOAD=$SANITIZER_PRELOAD /usr/bin/python3 "$bench" "$gpumemd" "$lib" --rounds=1 --pairs=2000 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert [r["op"] for r in j["rows"]] == ["C ABI pair (ctypes)", "gpumem package pair"]; assert all(r["ns_per_pair"] > 0 for r in j["rows"])' "$out"
