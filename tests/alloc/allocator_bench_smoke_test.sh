#!/bin/sh
# Runs allocator_bench at a tiny scale in both output modes and checks that
# every trace has its rows and columns (a short smoke version of the long
# churn C and the 2^k+-1 trace P included).
set -eu
bench="$1"
"$bench" --ops_scale=0.002 --util_seeds=1 --prefault_mib=16 > table.out
cat table.out
for t in S L F C P; do
  grep -q "^$t .*OffsetAllocator" table.out || { echo "missing $t row"; exit 1; }
  grep -q "^$t .*map best-fit" table.out || { echo "missing $t baseline row"; exit 1; }
done
grep -q '^S  *harness floor' table.out || { echo "missing harness floor row"; exit 1; }
grep -q '^single Allocate calls' table.out || { echo "missing legend line"; exit 1; }
grep -q '^environment: ' table.out || { echo "missing environment line"; exit 1; }
grep -q '^  F OffsetAllocator calls > 10 us' table.out || { echo "missing slow-call lines"; exit 1; }
"$bench" --ops_scale=0.002 --util_seeds=1 --noprefault --traces=F,C --json > json.out
for key in median_ns_per_pair util_at_first_failure \
    util_at_first_failure_with_request allocate_p999_ns allocate_max_ns \
    allocate_all_max_ns allocate_faulted_calls minor_faults '"prefault": false' \
    slow_over_10us rechecked_over_10us '"environment"'; do
  grep -q "$key" json.out || { echo "bad json: no $key"; cat json.out; exit 1; }
done
grep -q '"trace": "S"' json.out && { echo "--traces did not select"; exit 1; }
echo PASS
