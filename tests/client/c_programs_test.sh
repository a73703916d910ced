#!/usr/bin/env bash
# Builds C programs the way users do (gcc, gpumem.h, -lgpumem against
# libgpumem.so.1) and runs them against a daemon on the sim backend:
#  - c_program.c: the C ABI from C99 with -Wall -Wextra -Werror -pedantic;
#  - client/examples/omp_shards.c: the OpenMP offload example, gcc -fopenmp,
#    run with OMP_TARGET_OFFLOAD=DISABLED; it checks its own sum. Then on a
#    cuda daemon over the fake driver, whose device pointers fault on the
#    host like a GPU's: with no offload device (gcc here has no nvptx
#    offloading) the example must say so and stop, never run its target
#    regions on the host over device memory.
set -euo pipefail
gpumemd=$1 lib=$2 header=$3 c_program=$4 omp_example=$5 fake_cuda=$6
source tests/integration/lib.sh
source tests/client/sanitizer_env.sh
sanitizer_env "$lib"
build=${TEST_TMPDIR:-$(mktemp -d)}/build
mkdir -p "$build"
cp "$lib" "$build/libgpumem.so.1"           # the soname the loader looks for
ln -sf libgpumem.so.1 "$build/libgpumem.so"  # the name -lgpumem looks for
inc=$(dirname "$header")
gcc $SANITIZER_CFLAGS -std=c99 -Wall -Wextra -Werror -pedantic -I"$inc" "$c_program" -o "$build/c_program" \
  -L"$build" -lgpumem -Wl,-rpath,"$build" || fail "c_program.c did not build"
# Host-only OpenMP (-foffload=disable: with gcc's nvptx offload compiler
# installed, its default would also build for the GPU).
gcc $SANITIZER_CFLAGS -std=c11 -Wall -Werror -fopenmp -foffload=disable -I"$inc" "$omp_example" -o "$build/omp_shards" \
  -L"$build" -lgpumem -Wl,-rpath,"$build" || fail "omp_shards.c did not build"
readelf -d "$build/c_program" | grep -q 'NEEDED.*libgpumem.so.1' || fail "not linked to libgpumem.so.1"

start_daemon "$gpumemd" --sim_devices=4x1GiB
export GPUMEMD_SOCKET=$SOCK GPUMEM_LEASE_SIZE=4MiB
"$build/c_program" || fail "c_program failed"
out=$(OMP_TARGET_OFFLOAD=DISABLED "$build/omp_shards" 1000003) || fail "omp_shards failed: $out"
echo "$out"
case "$out" in
  *"1000003 doubles in 4 shards on 4 devices"*"sum ok"*) ;;
  *) fail "omp_shards said: $out" ;;
esac
stop_daemon

export LD_LIBRARY_PATH=$(cd "$(dirname "$fake_cuda")" && pwd) FAKE_CUDA_DEVICES=2x256MiB
start_daemon "$gpumemd" --backend=cuda --slab_size=16MiB
export GPUMEMD_SOCKET=$SOCK
for offload in DEFAULT MANDATORY; do
  rc=0
  out=$(OMP_TARGET_OFFLOAD=$offload "$build/omp_shards" 100000 2>&1) || rc=$?
  echo "OMP_TARGET_OFFLOAD=$offload: exit $rc: $out"
  [ "$rc" = 3 ] || fail "omp_shards on device memory without an offload device: exit $rc (want 3): $out"
  case "$out" in
    *"no OpenMP offload device"*) ;;
    *) fail "omp_shards did not say why it stopped: $out" ;;
  esac
done
stop_daemon
