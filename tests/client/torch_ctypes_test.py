"""PyTorch's pluggable allocator, called exactly as PyTorch calls it.

torch.cuda.memory.CUDAPluggableAllocator loads a shared library and calls
    void* alloc(ssize_t size, int device, cudaStream_t stream)
    void  free(void* ptr, ssize_t size, int device, cudaStream_t stream)
from whichever thread needs memory. PyTorch cannot be installed here, so this
test calls libgpumem.so's gpumem_torch_malloc/gpumem_torch_free through
ctypes with those signatures, from several threads, with a size mix shaped
like a training step (many small activations and gradients, some MiB-sized
weights, a few blocks above the cache threshold), frees some blocks on other
threads than the ones that allocated them, and checks every byte of every
block before freeing it. Then it checks that device ordinals map to the
daemon's devices (CUDA_VISIBLE_DEVICES=1,0 makes ordinal 0 the daemon's 1).

argv[1]: path of libgpumem.so. GPUMEMD_SOCKET names the daemon.
"""
import ctypes
import json
import os
import queue
import random
import sys
import threading

os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"
os.environ.setdefault("GPUMEM_LEASE_SIZE", "32MiB")
lib = ctypes.CDLL(sys.argv[1])
lib.gpumem_torch_malloc.restype = ctypes.c_void_p
lib.gpumem_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.gpumem_torch_free.restype = None
lib.gpumem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.gpumem_last_error.restype = ctypes.c_int
lib.gpumem_last_error_message.restype = ctypes.c_char_p
lib.gpumem_connect.restype = ctypes.c_void_p
lib.gpumem_connect.argtypes = [ctypes.c_char_p]
lib.gpumem_stats_json.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]
lib.gpumem_close.argtypes = [ctypes.c_void_p]

MiB = 1 << 20
# (size, weight): shaped like the allocation log of a small transformer step.
MIX = [(512, 30), (1024, 10), (4096, 12), (8192, 6), (65536, 8), (196608, 6),
       (786432, 6), (1 * MiB, 5), (3 * MiB, 4), (4 * MiB + 512, 3), (12 * MiB, 2),
       (20 * MiB, 1)]
SIZES = [s for s, w in MIX for _ in range(w)]

handoff = queue.Queue()
failures = []


def fill_and_check(ptr, size, value):
    ctypes.memset(ptr, value, size)


def verify(ptr, size, value):
    return ctypes.string_at(ptr, size) == bytes([value]) * size


def worker(tid, device, steps):
    rng = random.Random(tid)
    live = []
    try:
        for step in range(steps):
            if len(live) < 24 and rng.random() < 0.6:
                size = rng.choice(SIZES) + rng.randrange(0, 512)
                ptr = lib.gpumem_torch_malloc(size, device, None)
                if not ptr:
                    failures.append("thread %d: malloc(%d) failed: %s" %
                                    (tid, size, lib.gpumem_last_error_message()))
                    return
                value = (tid * 31 + step) & 0xFF
                fill_and_check(ptr, size, value)
                live.append((ptr, size, value))
            elif live:
                ptr, size, value = live.pop(rng.randrange(len(live)))
                if rng.random() < 0.2:
                    handoff.put((ptr, size, value, device))  # another thread frees it
                    continue
                if not verify(ptr, size, value):
                    failures.append("thread %d: block of %d bytes corrupted" % (tid, size))
                    return
                lib.gpumem_torch_free(ptr, size, device, None)
                if lib.gpumem_last_error() != 0:
                    failures.append("thread %d: free: %s" % (tid, lib.gpumem_last_error_message()))
                    return
            # Blocks other threads handed over.
            try:
                ptr, size, value, dev = handoff.get_nowait()
            except queue.Empty:
                continue
            if not verify(ptr, size, value):
                failures.append("thread %d: handed-over block corrupted" % tid)
                return
            lib.gpumem_torch_free(ptr, size, dev, None)
            if lib.gpumem_last_error() != 0:
                failures.append("thread %d: free: %s" % (tid, lib.gpumem_last_error_message()))
                return
        for ptr, size, value in live:
            if not verify(ptr, size, value):
                failures.append("thread %d: block corrupted at the end" % tid)
            lib.gpumem_torch_free(ptr, size, device, None)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        failures.append("thread %d: %r" % (tid, e))


def daemon_used():
    c = lib.gpumem_connect(None)
    assert c, lib.gpumem_last_error_message()
    out = ctypes.c_char_p()
    assert lib.gpumem_stats_json(c, ctypes.byref(out)) == 0, lib.gpumem_last_error_message()
    j = json.loads(out.value)
    lib.gpumem_close(c)
    return {d["index"]: int(d.get("used_bytes", 0)) for d in j["daemon"]["devices"]}


# Ordinal 0 is the daemon's device 1 under CUDA_VISIBLE_DEVICES=1,0.
before = daemon_used()
p = lib.gpumem_torch_malloc(4096, 0, None)
assert p, lib.gpumem_last_error_message()
after = daemon_used()
assert after[1] > before[1] and after[0] == before[0], (before, after)
lib.gpumem_torch_free(p, 4096, 0, None)
assert lib.gpumem_last_error() == 0

# A size of 0 is PyTorch's empty tensor: NULL, and no error.
assert lib.gpumem_torch_malloc(0, 0, None) is None and lib.gpumem_last_error() == 0
# An ordinal that does not exist is refused with a message.
assert lib.gpumem_torch_malloc(4096, 5, None) is None
assert b"device 5" in lib.gpumem_last_error_message(), lib.gpumem_last_error_message()

threads = [threading.Thread(target=worker, args=(t, t % 2, 600)) for t in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
while not handoff.empty():
    ptr, size, value, dev = handoff.get()
    if not verify(ptr, size, value):
        failures.append("leftover block corrupted")
    lib.gpumem_torch_free(ptr, size, dev, None)
if failures:
    print("\n".join(failures))
    sys.exit(1)
print("torch ctypes: ok")
