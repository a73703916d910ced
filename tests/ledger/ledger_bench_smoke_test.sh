#!/usr/bin/env bash
# The ledger benchmark runs end to end and prints its JSON (figures not checked).
set -euo pipefail
out=$("$1" --events=5000 --rate=20000 --json)
echo "$out"
/usr/bin/python3 -c '
import json,sys
j=json.loads(sys.argv[1])
assert [r["mode"] for r in j["rows"]] == ["paced", "flat_out"], j
for r in j["rows"]:
    assert r["events"] == 5000 and r["events_per_s"] > 0 and r["bytes_per_event"] > 0, r
    assert r["cpu_us_per_event"] > 0 and r["commits"] > 0, r
' "$out"
