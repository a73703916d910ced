#!/usr/bin/env bash
# A client holding more blocks than one Resume may carry (5,000: about 370
# KiB of them, over Resume's 256 KiB limit) keeps every one across a kill
# -9 of the daemon: the client library sends its Resume in pages of 1,000
# blocks, and the pages add up to one Resume.
set -euo pipefail
# Without the fake fd store: restart_bench's fake systemd reads its notify
# socket only between restarts, and 5,000 blocks make more slabs than its
# socket queues; the clients give the handles back instead (GIVE_SLAB).
out=$("$1" --blocks=5000 --restarts=1 --fd_store=false --json)
echo "$out"
/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["blocks_intact"] == 5000 and j["frees_ok"] == 5000 and j["failed_calls"] == 0, j' "$out"
