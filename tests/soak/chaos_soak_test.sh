#!/usr/bin/env bash
# The chaos soak's short run: 100 s, two daemon instances (one kill -9 and
# restart under load), then the checks; chaos_soak exits non-zero on any
# violation. RSS growth is reported, not judged, at this length (see
# --rss_min_warmup); the long run judges it.
set -euo pipefail
exec "$TEST_SRCDIR/gpumemd/tests/soak/chaos_soak" --duration=100s --first_instance=55s \
  --instance=40s --warmup=15s --workers=4 --attackers=2 --kill_per_sec=1 \
  --reload_per_sec=0.2 --fill_per_sec=0.05
