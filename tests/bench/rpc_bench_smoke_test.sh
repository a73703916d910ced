#!/usr/bin/env bash
# The RPC benchmark runs end to end and prints its JSON rows.
set -euo pipefail
out=$("$1" --rounds=2 --per_round=20 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert [r["op"] for r in j["rows"]] == ["GetSession", "Allocate+Free", "Allocate+map+Free (Buffer)"]; assert all(r["p50_us"] > 0 for r in j["rows"])' "$out"
