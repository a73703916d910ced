#!/usr/bin/env bash
# The chaos soak's short runs, then the checks; chaos_soak exits non-zero on
# any violation. RSS growth is reported, not judged, at these lengths (see
# --rss_min_warmup); the long run judges it.
#   chaos_soak_test.sh          100 s, two daemon instances (one kill -9 and
#                               restart under load) that allocations survive
#   chaos_soak_test.sh close    50 s, the same with --state=none: the restart
#                               closes what was live
set -euo pipefail
soak="$TEST_SRCDIR/gpumemd/tests/soak/chaos_soak"
if [[ "${1:-survive}" == close ]]; then
  exec "$soak" --restart_check=close --duration=50s --first_instance=26s --instance=22s \
    --warmup=6s --workers=4 --attackers=2 --kill_per_sec=1 --reload_per_sec=0.2 \
    --fill_per_sec=0.05
fi
exec "$soak" --duration=100s --first_instance=55s \
  --instance=40s --warmup=15s --workers=4 --attackers=2 --kill_per_sec=1 \
  --reload_per_sec=0.2 --fill_per_sec=0.05
