#!/usr/bin/env bash
# The gpumem Python package under Debian's /usr/bin/python3: installed with
# tools/install-python into a private prefix (the library inside the
# package, no GPUMEM_LIBRARY), then package_test.py against a 3-device sim
# daemon, and torch_hook_test.py (stand-in torch, vLLM-style sizing) and
# torch_pool_test.py (the MemPool route) against
# a 2x16 GiB one whose uid tenant has a 2 GiB quota.
set -euo pipefail
gpumemd=$1 ctl=$2 lib=$3 install=$4 dir=$5
source tests/integration/lib.sh
source tests/client/sanitizer_env.sh
sanitizer_env "$lib"
prefix=${TEST_TMPDIR:-$(mktemp -d)}/site
"$install" --prefix="$prefix" --lib="$lib" >/dev/null
[ -f "$prefix/gpumem/libgpumem.so.1" ] && [ -f "$prefix/gpumem/torch.py" ] || fail "install-python left no package in $prefix"
"$install" --prefix="$prefix" --lib="$lib" >/dev/null  # idempotent
unset GPUMEM_LIBRARY
export PYTHONDONTWRITEBYTECODE=1

start_daemon "$gpumemd" --sim_devices=3x1GiB --slab_size=64MiB
GPUMEMD_SOCKET=$SOCK PYTHONPATH=$prefix LD_PRELOAD=$SANITIZER_PRELOAD \
  /usr/bin/python3 "$dir/package_test.py" "$ctl" || fail "package_test.py failed"
stop_daemon

start_daemon "$gpumemd" --sim_devices=2x16GiB
GPUMEMD_SOCKET=$SOCK "$ctl" quota "uid-$(id -u)" --total=2GiB >/dev/null
GPUMEMD_SOCKET=$SOCK PYTHONPATH=$prefix:$dir/fake_torch:$dir LD_PRELOAD=$SANITIZER_PRELOAD \
  /usr/bin/python3 "$dir/torch_hook_test.py" "$ctl" || fail "torch_hook_test.py failed"
GPUMEMD_SOCKET=$SOCK PYTHONPATH=$prefix:$dir/fake_torch:$dir LD_PRELOAD=$SANITIZER_PRELOAD \
  /usr/bin/python3 "$dir/torch_pool_test.py" "$ctl" || fail "torch_pool_test.py failed"
stop_daemon
echo PASS
