#!/usr/bin/env bash
# The top benchmark runs end to end (small) and prints its JSON rows.
set -euo pipefail
out=$("$1" --devices=4 --blocks=2000 --sessions=2 --refreshes=5 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert [r["op"] for r in j["rows"]] == ["refresh (GetStats + render)", "GetStats (daemon + transport)", "render 200x60"]; assert all(r["p50_ms"] > 0 for r in j["rows"]) and j["blocks"] == 2000' "$out"
