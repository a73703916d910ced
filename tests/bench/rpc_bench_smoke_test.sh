#!/usr/bin/env bash
# The RPC benchmark runs end to end and prints its JSON rows.
set -euo pipefail
out=$("$1" --rounds=2 --per_round=20 --ledger_compare --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert [r["op"] for r in j["rows"]] == ["GetSession", "Allocate+Free", "Allocate+map+Free (Buffer)", "Allocate+Free (ledger off)"]; assert all(r["p50_us"] > 0 and r["p999_us"] >= r["p50_us"] for r in j["rows"]); assert j["ledger_on_over_off_p999"] > 0' "$out"
