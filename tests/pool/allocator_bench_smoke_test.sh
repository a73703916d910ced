#!/bin/sh
# Runs allocator_bench at a tiny scale in both output modes.
set -eu
bench="$1"
"$bench" --ops_scale=0.002 --util_seeds=1 > table.out
cat table.out
for t in S L F; do
  grep -q "^$t .*OffsetAllocator" table.out || { echo "missing $t row"; exit 1; }
done
"$bench" --ops_scale=0.002 --util_seeds=1 --json > json.out
grep -q '"median_ns_per_pair"' json.out || { echo "bad json"; exit 1; }
grep -q '"util_at_first_failure"' json.out || { echo "bad json"; exit 1; }
grep -q '"util_at_first_failure_with_request"' json.out || { echo "bad json"; exit 1; }
grep -q '^S  *harness floor' table.out || { echo "missing harness floor row"; exit 1; }
echo PASS
