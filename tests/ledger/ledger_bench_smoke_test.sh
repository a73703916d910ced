#!/usr/bin/env bash
# The ledger benchmark runs end to end and prints its JSON (figures not checked).
set -euo pipefail
out=$("$1" --events=5000 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["events"] == 5000 and j["events_per_s"] > 0 and j["bytes_per_event"] > 0' "$out"
