#!/usr/bin/env bash
# Without an NVIDIA driver, --backend=cuda must exit non-zero with one clear
# line. On a machine that has libcuda.so.1 this test checks nothing and says
# so (the GPU checks run on the device machine, see the README).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
GPUMEMD=$1
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "libcuda.so.1 is present: skipping the no-driver check"
  exit 0
fi
dir=$(mktemp -d /tmp/gpumemd-cuda-XXXXXX)
"$GPUMEMD" --backend=cuda --socket="$dir/s.sock" --ledger="$dir/ledger.db" >"$dir/out" 2>"$dir/err"
rc=$?
cat "$dir/err"
[ "$rc" != 0 ] || fail "gpumemd --backend=cuda exited 0 without a driver"
[ "$(wc -l <"$dir/err")" = 1 ] || fail "expected exactly one line on stderr"
grep -q "no NVIDIA driver" "$dir/err" || fail "the line does not say there is no driver"
[ ! -e "$dir/s.sock" ] || fail "a socket was created"
rm -rf "$dir"
echo PASS
