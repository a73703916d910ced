#!/bin/bash
# The load benchmark runs end to end, briefly, and prints its JSON: every row
# did pairs without errors, the soak and the scale section are there, and the
# scale section's blocks were all placed and all reclaimed. Figures are not
# checked (this machine is shared).
set -euo pipefail
out=$("$1" --clients=1,2 --seconds=0.3 --soak_seconds=0.5 --soak_clients=2 \
      --scale_blocks=2000 --scale_devices=4 --json)
echo "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
rows = j["rows"]
keys = {(r["section"], r["target"], r["transport"], r["clients"]) for r in rows}
for n in (1, 2):
    for target in ("floor", "daemon"):
        for via in ("stream", "unary"):
            assert ("load", target, via, n) in keys, (target, via, n)
for target in ("floor", "floor_fd", "daemon"):
    for via in ("stream", "unary"):
        assert ("anatomy", target, via, 1) in keys, (target, via)
assert ("anatomy", "floor_async", "unary", 1) in keys
assert ("soak", "daemon", "stream", 2) in keys
for r in rows:
    assert r["errors"] == 0 and r["pairs"] > 0 and r["p50_us"] > 0, r
    assert r["p50_us"] <= r["p99_us"] <= r["p999_us"], r
    if r["target"] == "daemon" and r["section"] != "soak":
        assert r["x_floor_pairs_per_s"] > 0 and r["x_floor_p50"] > 0, r
s = j["scale"]
assert s["devices"] == 4 and s["live_blocks"] == 2000 and s["errors"] == 0, s
assert s["get_stats_p99_ms"] > 0 and s["rss_full_bytes"] > 0, s
assert s["reclaim_seconds"] < 120, s
PY
# The ledger comparison: both daemons' rows each round, the ratios, and the
# replay of the ledger after a short full-rate run equals its usage table.
out=$("$1" --ledger_compare --clients=1 --seconds=0.3 --ledger_rounds=2 \
      --replay_seconds=1 --soak_clients=2 --json)
echo "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
rows = [r for r in j["rows"] if r["section"] == "ledger"]
assert sorted(r["target"] for r in rows) == ["daemon", "daemon", "no_ledger", "no_ledger"], rows
for r in j["rows"]:
    assert r["errors"] == 0 and r["pairs"] > 0 and r["server_cpu_us_per_pair"] > 0, r
assert len(j["ledger_ratios"]) == 2, j["ledger_ratios"]
for x in j["ledger_ratios"]:
    assert x["pairs_per_s"] > 0 and x["p999"] > 0 and x["cpu_per_pair"] > 0, x
# Pooled over both rounds; the ledger daemon's writer did work.
assert len(j["ledger_pooled"]) == 1, j["ledger_pooled"]
p = j["ledger_pooled"][0]
assert p["rounds"] == 2 and p["pairs_per_s"] > 0 and p["p999"] > 0 and p["cpu_per_pair"] > 0, p
assert p["on_writer_us_per_pair"] > 0, p
assert j["replay"]["equal"] and j["replay"]["events"] > 0, j["replay"]
PY
