#!/usr/bin/env bash
# The restart benchmark runs end to end: every block survives its restarts.
set -euo pipefail
out=$("$1" --blocks=200 --restarts=2 --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["blocks_intact"] == 200 and j["frees_ok"] == 200 and j["failed_calls"] == 0; assert j["start_to_serving_ms"]["max"] > 0' "$out"
