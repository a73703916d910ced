#!/usr/bin/env bash
# Runs torch_ctypes_test.py (/usr/bin/python3, ctypes) against a daemon.
set -euo pipefail
gpumemd=$1 lib=$2 script=$3
source tests/integration/lib.sh
source tests/client/sanitizer_env.sh
sanitizer_env "$lib"
start_daemon "$gpumemd" --sim_devices=2x2GiB
export GPUMEMD_SOCKET=$SOCK
LD_PRELOAD=$SANITIZER_PRELOAD /usr/bin/python3 "$script" "$lib" || fail "torch_ctypes_test.py failed"
stop_daemon
