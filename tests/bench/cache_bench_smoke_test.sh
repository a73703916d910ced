#!/usr/bin/env bash
# The cache benchmark runs end to end and prints its JSON rows.
set -euo pipefail
out=$("$1" --rounds=1 --pairs=2000 --threads=2 --rpc_pairs=20 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert [r["op"] for r in j["rows"]] == ["glibc malloc+free", "gpumem cached pair", "glibc malloc+free", "gpumem cached pair", "RPC pair (Allocate+Free)"]; assert all(r["ns_per_pair"] > 0 for r in j["rows"])' "$out"
