#!/usr/bin/python3
"""python_pool_bench: the gpumem Python package's allocate+free pair through
the caching pool, next to the C ABI's pair (gpumem_malloc + gpumem_free
called through ctypes, the least a Python caller can pay), in one run.

    bazel run -c opt //tests/bench:python_pool_bench [-- --json]

Starts its own gpumemd (sim backend) on a private socket. Both series run
the same size mix (128 B .. 64 KiB, all served from leases) in interleaved
rounds; a series' figure is its median round, in CPU time of this thread
(time.thread_time: waiting for a core on a loaded machine is left out). The
target (issue 25) is the package's pair within 3x of the C ABI's.

argv: gpumemd path, libgpumem.so path, then options.
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [512, 1024, 4096, 256, 16384, 2048, 65536, 8192,
         768, 32768, 3072, 128, 6144, 24576, 1536, 12288]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gpumemd")
    p.add_argument("lib")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--pairs", type=int, default=100000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    # The package from the source tree (runfiles or checkout), over this library.
    for root in (os.path.join(here, "..", ".."), os.getcwd(),
                 os.path.join(os.environ.get("RUNFILES_DIR", "/nonexistent"), "gpumemd")):
        if os.path.exists(os.path.join(root, "client", "python", "gpumem", "__init__.py")):
            sys.path.insert(0, os.path.join(root, "client", "python"))
            break
    os.environ["GPUMEM_LIBRARY"] = os.path.abspath(a.lib)
    work = tempfile.mkdtemp(prefix="/tmp/gpumemd-pybench-")
    sock = os.path.join(work, "gpumemd.sock")
    log = open(os.path.join(work, "daemon.log"), "w")
    daemon = subprocess.Popen([a.gpumemd, "--socket=" + sock, "--ledger=" + work + "/l.db",
                               "--sim_devices=2x4GiB"], stderr=log, stdout=log)
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.025)
        else:
            sys.exit("python_pool_bench: the daemon did not start")
        rows = run(a, sock)
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    c_abi = rows["C ABI pair (ctypes)"]
    pkg = rows["gpumem package pair"]
    ratio = pkg / c_abi
    if a.json:
        print(json.dumps({"rows": [{"op": k, "ns_per_pair": v} for k, v in rows.items()],
                          "ratio": ratio}))
        return
    print("%-28s %12s" % ("op (same sizes, 1 thread)", "ns/pair (cpu)"))
    for k, v in rows.items():
        print("%-28s %12.0f" % (k, v))
    print("package pair / C ABI pair: %.2fx (target <= 3x: %s)"
          % (ratio, "met" if ratio <= 3 else "NOT met"))


def run(a, sock):
    import gpumem
    from gpumem import _lib
    lib = _lib.load()
    client = gpumem.connect(sock)
    h = client._h
    n = a.pairs
    sizes = (SIZES * (n // len(SIZES) + 1))[:n]

    def c_abi():
        m, f = lib.gpumem_malloc, lib.gpumem_free
        out = ctypes.c_void_p()
        ref = ctypes.byref(out)
        t = time.thread_time()
        for s in sizes:
            if m(h, s, None, ref):
                raise SystemExit("gpumem_malloc: %s" % lib.gpumem_last_error_message())
            if f(h, out.value):
                raise SystemExit("gpumem_free: %s" % lib.gpumem_last_error_message())
        return (time.thread_time() - t) / n * 1e9

    def package():
        malloc = client.malloc
        t = time.thread_time()
        for s in sizes:
            malloc(s).free()
        return (time.thread_time() - t) / n * 1e9

    series = {"C ABI pair (ctypes)": c_abi, "gpumem package pair": package}
    for fn in series.values():  # warm: leases taken, caches filled
        fn()
    times = {k: [] for k in series}
    for _ in range(a.rounds):
        for k, fn in series.items():
            times[k].append(fn())
    client.close()
    return {k: statistics.median(v) for k, v in times.items()}


if __name__ == "__main__":
    main()
