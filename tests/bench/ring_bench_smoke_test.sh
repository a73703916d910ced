#!/usr/bin/env bash
# The ring benchmark runs end to end and prints its JSON: the four rows in
# order, each with its samples and sane quantiles. Figures are not checked
# (this machine is shared).
set -euo pipefail
out=$("$1" --calls=300 --asleep_calls=30 --sleep_us=100 --json)
echo "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
rows = j["rows"]
assert [r["op"] for r in rows] == ["futex floor", "spin floor", "ring", "ring, asleep"], rows
assert [r["n"] for r in rows] == [300, 300, 300, 30], rows
for r in rows:
    assert 0 < r["p50_us"] <= r["p99_us"], r
    assert r["peer_cpu_us_per_call"] >= 0 and r["x_futex_p50"] > 0, r
assert j["ring_over_futex_p50"] > 0 and j["ring_asleep_over_futex_p50"] > 0, j
assert j["cores"] >= 1 and j["pinned"] is False and j["payload_bytes"] == 64 and j["sleep_us"] == 100, j
PY
