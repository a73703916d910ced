"""The gpumem Python package (as installed by tools/install-python) against a
real daemon (sim backend, 3 devices of 1 GiB): allocation with placement,
blocks as memoryviews and numpy arrays, stats / session / tenants / ledger /
mem_get_info, python3 -m gpumem, and bad input: foreign pointers, double
frees, a closed client, bad placement, views outliving free() and close(),
no daemon, no library. Every case checks the daemon's figures, so nothing
is leaked.

argv: the gpumemctl path. GPUMEMD_SOCKET names the daemon.
"""
import gc
import json
import os
import subprocess
import sys

import gpumem

CTL = sys.argv[1]
SOCK = os.environ["GPUMEMD_SOCKET"]
MiB, GiB = 1 << 20, 1 << 30
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def expect(exc, fn, *args, contains="", **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        check(contains in str(e), "%s: message %r lacks %r" % (exc.__name__, str(e), contains))
        return e
    except Exception as e:  # noqa: BLE001 - reported
        check(False, "expected %s, got %r" % (exc.__name__, e))
        return None
    check(False, "expected %s from %s%r" % (exc.__name__, getattr(fn, "__name__", fn), args))
    return None


def daemon():
    out = subprocess.run([CTL, "stats", "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def daemon_used():
    return [int(d["used_bytes"]) for d in daemon()["devices"]]


def wait_used(want, what):
    import time
    for _ in range(200):
        if daemon_used() == want:
            return
        time.sleep(0.025)
    check(False, "%s: daemon used %s, want %s" % (what, daemon_used(), want))


# --- the library is the installed one ----------------------------------
check("GPUMEM_LIBRARY" not in os.environ, "the test runs without GPUMEM_LIBRARY")
check(gpumem.library_path() == os.path.join(os.path.dirname(gpumem.__file__), "libgpumem.so.1"),
      "library next to the package: %s" % gpumem.library_path())

c = gpumem.connect()
check(c.device_count() == 3, "3 devices")
check(c.visible_device_count() == 3, "3 devices visible: this process has no CUDA driver")

# --- allocation with placement -----------------------------------------
b = c.malloc(4096, gpus="2")
try:
    c.export_dmabuf(b)
    check(False, "host memory exported as a dma-buf")
except gpumem.FailedPrecondition as e:
    check("no dma-buf" in str(e), str(e))
check(b.device == 2 and b.size == 4096 and b.ptr != 0, "malloc on device 2: %r" % b)
b2 = c.malloc(4096, gpus=[0, 1], exclude=0)
check(b2.device == 1, "gpus [0,1] without 0: device %d" % b2.device)
b3 = c.malloc(40 * MiB, gpus="0", policy="pack")  # above the cache threshold: its own block
check(b3.device == 0, "large block on device 0")
big = c.malloc(600 * MiB, gpus="1", fallback=["2"])
big2 = c.malloc(600 * MiB, gpus="1", fallback=["2"])  # device 1 is full: the fallback
check(big.device == 1 and big2.device == 2, "fallback: %d %d" % (big.device, big2.device))
shards = c.malloc_sharded(3 * MiB, 3)
check(sorted(s.device for s in shards) == [0, 1, 2] and sum(s.size for s in shards) == 3 * MiB,
      "3 shards on 3 devices")
for s in shards:
    s.free()
two = c.malloc_sharded(2 * MiB, 2, gpus="1,2", fallback=["0"], policy="pack")
check(sorted(s.device for s in two) == [1, 2], "2 shards on devices 1 and 2")
for s in two:
    s.free()
expect(gpumem.InvalidArgument, c.malloc_sharded, 2 * MiB, 2, gpus="1", contains="2 distinct devices")
for blk in (big, big2, b3):
    blk.free()
e = expect(gpumem.ResourceExhausted, c.malloc, 900 * MiB, gpus="0", exclude="0")
check(isinstance(e, MemoryError), "ResourceExhausted is a MemoryError")
expect(gpumem.InvalidArgument, c.malloc, 4096, gpus="7", contains='"7"')
expect(gpumem.InvalidArgument, c.malloc, 4096, gpus="0 1")
expect(gpumem.InvalidArgument, c.malloc, 4096, gpus=[None])
expect(gpumem.InvalidArgument, c.malloc, 4096, policy="sideways")
expect(gpumem.InvalidArgument, c.malloc, 0)
expect(gpumem.InvalidArgument, c.malloc, 5 * GiB, contains="larger than any device")
expect(gpumem.InvalidArgument, c.malloc_sharded, MiB, 0)
expect(TypeError, c.malloc, "4096", contains="size")
expect(gpumem.InvalidArgument, c.malloc, -1, contains="size")

# --- views ---------------------------------------------------------------
v = b.view()
check(isinstance(v, memoryview) and len(v) == 4096 and not v.readonly and v.format == "B",
      "a writable byte view")
v[:5] = b"hello"
v[4095] = 7
check(bytes(b.view()[:5]) == b"hello" and b.view()[4095] == 7, "writes are visible")
try:
    import numpy
    a = b.numpy("uint32", (32, 32))
    a[:] = 3
    check(a.shape == (32, 32) and int(a.sum()) == 3 * 1024, "numpy view")
    check(v[0] == 3, "numpy writes are the block's bytes")
    del a
except ImportError:
    print("numpy not installed: numpy views not tested", file=sys.stderr)

# A view keeps the memory: free() marks the block, the last view frees it.
used0 = daemon_used()
big_view_block = c.malloc(64 * MiB, gpus="0")  # its own block: freeing it reaches the daemon
wait_used([used0[0] + 64 * MiB, used0[1], used0[2]], "64 MiB block")
bv = big_view_block.view()
tail = bv[-8:]
del bv
tail[:] = b"ABCDEFGH"
big_view_block.free()
check(big_view_block.freed and "views alive" in repr(big_view_block), repr(big_view_block))
check(daemon_used()[0] == used0[0] + 64 * MiB, "memory kept while a slice of a view lives")
check(bytes(tail) == b"ABCDEFGH", "the slice still reads its bytes")
expect(gpumem.DoubleFree, big_view_block.view, contains="freed")
expect(gpumem.DoubleFree, big_view_block.free)
del tail
gc.collect()
wait_used(used0, "the last view gone: the block is returned")

# --- bad pointers ----------------------------------------------------------
b2.free()
expect(gpumem.DoubleFree, b2.free, contains="freed already")
e = expect(gpumem.ForeignPointer, c.free, 12345, contains="not allocated by this client")
check(isinstance(e, ValueError), "ForeignPointer is a ValueError")
expect(gpumem.ForeignPointer, c.free, -1)
expect(gpumem.ForeignPointer, c.free, 1 << 70)
expect(TypeError, c.free, "0x1234")
other = gpumem.connect()
ob = other.malloc(4096)
expect(gpumem.ForeignPointer, c.free, ob, contains="another client")
expect(gpumem.ForeignPointer, c.free, ob.ptr, contains="not allocated by this client")
ob.free()
other.close()
# An interior pointer of a live block.
inner = c.malloc(8192)
expect(gpumem.DoubleFree, c.free, inner.ptr + 256)
c.free(inner.ptr)  # by address: fine
check(c.device_of(b) == 2, "device_of a block")
expect(gpumem.ForeignPointer, c.device_of, 4242)

# --- what the daemon says ------------------------------------------------
st = c.stats()
check(st["daemon"]["backend"] == "sim" and len(st["daemon"]["devices"]) == 3, "stats")
check(isinstance(st["daemon"]["devices"][0]["total_bytes"], int), "64-bit figures are ints")
check(st["leases"] >= 1 and st["in_use_bytes"] >= 4096, "the pool's figures: %r" % st)
se = c.session()
check(se["pid"] == os.getpid() and se["uid"] == os.getuid() and
      se["tenant_name"] == "uid-%d" % os.getuid() and se["tenant"] == os.getuid(),
      "session: %r" % se)
subprocess.run([CTL, "quota", "uid-%d" % os.getuid(), "--total=1GiB", "--device=2:256MiB"],
               check=True, capture_output=True)
ten = c.tenants()
mine = [t for t in ten if t["name"] == "uid-%d" % os.getuid()]
check(len(mine) == 1 and mine[0]["quota"]["total_bytes"] == GiB and
      mine[0]["current_bytes"] > 0, "tenants: %r" % ten)
events, token = c.ledger(limit=5, newest=True)
check(len(events) == 5 and all(e["kind"] in ("ALLOCATE", "FREE", "QUOTA_SET") for e in events)
      and events[0]["seq"] < events[-1]["seq"], "ledger: %r" % events)
page, token = c.ledger(limit=2)
check(len(page) == 2 and token, "a first page and a token")
more, _ = c.ledger(limit=2, page_token=token)
check(more and more[0]["seq"] > page[-1]["seq"], "the next page")
expect(gpumem.InvalidArgument, c._call, "SetQuota", contains="not one gpumem_call_json makes")
expect(gpumem.InvalidArgument, c._call, "GetLedger", {"limit": "many"}, contains="GetLedger")
# mem_get_info: device 2 is capped by its 256 MiB quota, device 0 by the 1 GiB total.
free2, total2 = c.mem_get_info(2)
check(total2 == 256 * MiB and free2 <= 256 * MiB, "device 2 budget %d/%d" % (free2, total2))
free0, total0 = c.mem_get_info(0)
check(total0 == GiB and 0 < free0 < GiB, "device 0 budget %d/%d" % (free0, total0))
expect(gpumem.InvalidArgument, c.mem_get_info, 3, contains="does not exist")
expect(gpumem.InvalidArgument, c.mem_get_info, -1)
subprocess.run([CTL, "quota", "uid-%d" % os.getuid()], check=True, capture_output=True)

# --- python3 -m gpumem ---------------------------------------------------
for cmd, want in (("stats", "backend: sim"), ("session", '"tenant_name"'),
                  ("tenants", "TENANT"), ("ledger", "ALLOCATE"), ("meminfo", "DEV")):
    r = subprocess.run([sys.executable, "-m", "gpumem", cmd], capture_output=True, text=True)
    check(r.returncode == 0 and want in r.stdout, "python3 -m gpumem %s: %r %r"
          % (cmd, r.stdout[:200], r.stderr))
r = subprocess.run([sys.executable, "-m", "gpumem", "stats", "--json"], capture_output=True,
                   text=True)
check(r.returncode == 0 and json.loads(r.stdout)["daemon"]["backend"] == "sim", "stats --json")
r = subprocess.run([sys.executable, "-m", "gpumem", "stats", "--socket", "/nonexistent.sock"],
                   capture_output=True, text=True)
check(r.returncode == 1 and "UNAVAILABLE" in r.stderr, "no daemon: %r" % r.stderr)
r = subprocess.run([sys.executable, "-m", "gpumem", "frobnicate"], capture_output=True, text=True)
check(r.returncode == 2, "usage error: %d" % r.returncode)

# --- garbage collection frees -----------------------------------------------
used = daemon_used()
tmp = c.malloc(80 * MiB, gpus="1")
wait_used([used[0], used[1] + 80 * MiB, used[2]], "80 MiB block")
del tmp
gc.collect()
wait_used(used, "a collected Block is freed")

# --- a closed client -----------------------------------------------------------
del v  # the first view: only the one below keeps memory past close()
gc.collect()
keep = c.malloc(32 * MiB, gpus="2")
kv = keep.view()
kv[:3] = b"xyz"
c.close()
check(c.closed, "closed")
for fn, args in ((c.malloc, (4096,)), (c.free, (keep.ptr,)), (c.stats, ()), (c.session, ()),
                 (c.tenants, ()), (c.ledger, ()), (c.device_count, ()), (c.trim, ()),
                 (c.mem_get_info, (0,)), (c.malloc_sharded, (MiB, 2)), (keep.view, ()),
                 (c.close, ())):
    expect(gpumem.Closed, fn, *args, contains="closed")
check(bytes(kv[:3]) == b"xyz", "a view outlives close() and still reads its bytes")
check(daemon_used()[2] >= 32 * MiB, "memory kept for the view")
del kv
gc.collect()
wait_used([0, 0, 0], "the last view gone: the closed client gave everything back")
expect(gpumem.Closed, keep.free)
del keep

# --- no daemon, no library ---------------------------------------------------
e = expect(gpumem.Unavailable, gpumem.connect, "/nonexistent/gpumemd.sock")
check(isinstance(e, ConnectionError), "Unavailable is a ConnectionError")
r = subprocess.run([sys.executable, "-c", "import gpumem; gpumem.connect()"],
                   env=dict(os.environ, GPUMEM_LIBRARY="/nonexistent/libgpumem.so.1"),
                   capture_output=True, text=True)
check(r.returncode == 1 and "ImportError" in r.stderr and "/nonexistent/libgpumem.so.1" in
      r.stderr and "tools/install-python" in r.stderr, "no library: %r" % r.stderr[-300:])

if failures:
    sys.exit(1)
print("gpumem package: ok")
