#!/usr/bin/env bash
# Runs torch_ctypes_test.py (/usr/bin/python3, ctypes) against a daemon.
set -euo pipefail
gpumemd=$1 lib=$2 script=$3
source tests/integration/lib.sh
start_daemon "$gpumemd" --sim_devices=2x2GiB
export GPUMEMD_SOCKET=$SOCK
/usr/bin/python3 "$script" "$lib" || fail "torch_ctypes_test.py failed"
stop_daemon
