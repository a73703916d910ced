"""torch.cuda.memory of the stand-in (see torch/__init__.py)."""
import contextlib
import ctypes
import threading

import torch

NATIVE_DEVICES = 2
NATIVE_TOTAL = 80 << 30


class _Native:
    """The pretend GPUs' own allocator: counts bytes, hands out fake addresses."""

    def __init__(self):
        self.used = [0] * NATIVE_DEVICES
        self.peak = [0] * NATIVE_DEVICES
        self.next = 0x700000000000
        # MemPools' figures, which the caching allocator counts as its own.
        self.pool_allocated = [0] * NATIVE_DEVICES
        self.pool_reserved = [0] * NATIVE_DEVICES
        self.pool_ooms = 0

    def take(self, nbytes, device):
        if self.used[device] + nbytes > NATIVE_TOTAL:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (native)")
        self.used[device] += nbytes
        self.peak[device] = max(self.peak[device], self.used[device])
        self.next += nbytes
        return self.next

    def release(self, ptr, nbytes, device):
        self.used[device] -= nbytes


_native = _Native()
_current = None       # a CUDAPluggableAllocator, once changed
_initialized = False  # some CUDA memory was allocated


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        torch.calls.append(("cuda.memory.CUDAPluggableAllocator",
                            (path_to_so_file, alloc_fn_name, free_fn_name)))
        lib = ctypes.CDLL(path_to_so_file)  # PyTorch dlopens it too
        self._alloc = getattr(lib, alloc_fn_name)
        self._alloc.restype = ctypes.c_void_p
        self._alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self._free = getattr(lib, free_fn_name)
        self._free.restype = None
        self._free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.path = path_to_so_file

    def allocator(self):
        """The C++ allocator object (_cuda_CUDAAllocator) a MemPool takes."""
        return _RawAllocator(self)

    def take(self, nbytes, device):
        # As CUDAPluggableAllocator::malloc: whatever the function returns,
        # NULL included, becomes the tensor's data pointer.
        return self._alloc(nbytes, device, None) or 0

    def release(self, ptr, nbytes, device):
        self._free(ptr, nbytes, device, None)


class _RawAllocator:
    """CUDAPluggableAllocator's raw_alloc/raw_delete, as the caching
    allocator calls them for a MemPool's segments: the current device and
    stream, NULL passed back as it came."""

    def __init__(self, pluggable):
        self.pluggable = pluggable

    def raw_alloc(self, size, device):
        return self.pluggable._alloc(size, device, None) or 0

    def raw_delete(self, ptr, size, device):
        self.pluggable._free(ptr, size, device, None)


_pools = []  # every MemPool made (empty_cache releases their cached segments)
_tls = threading.local()  # .pool: the calling thread's use_mem_pool


def _segment_size(nbytes):
    """PyTorch's caching allocator: requests of 1 MiB or less share 2 MiB
    segments, those under 10 MiB take 20 MiB ones, larger ones are rounded
    up to 2 MiB (round_size, get_allocation_size)."""
    if nbytes <= 1 << 20:
        return 2 << 20
    if nbytes < 10 << 20:
        return 20 << 20
    return (nbytes + (2 << 20) - 1) // (2 << 20) * (2 << 20)


class MemPool:
    """torch.cuda.MemPool(allocator): a private pool of the caching
    allocator whose segments come from `allocator` (raw_alloc). As
    allocPrimitive does, a NULL segment is cudaErrorMemoryAllocation: the
    allocator gives the pool's cached free segments back (raw_delete) and
    tries once more, then raises torch.cuda.OutOfMemoryError. A tensor's
    memory goes back to the pool's cache when the tensor dies; segments are
    returned by empty_cache. Segments are not split here (one tensor per
    segment), which changes counts, not what reaches the allocator."""

    def __init__(self, allocator=None, use_on_oom=False):
        torch.calls.append(("cuda.memory.MemPool", (allocator, use_on_oom)))
        self._allocator = allocator
        self.cached = []     # (ptr, segment bytes, device) free segments
        self.sizes = {}      # ptr -> (segment bytes, tensor bytes, device)
        _pools.append(self)

    def take(self, nbytes, device):
        seg = _segment_size(nbytes)
        for i, (ptr, size, dev) in enumerate(self.cached):
            if size == seg and dev == device:
                del self.cached[i]
                return self._hand(ptr, seg, nbytes, device)
        raw = self._allocator
        ptr = raw.raw_alloc(seg, device) if raw is not None else _native.take(seg, device)
        if not ptr:
            self.release_cached()
            ptr = raw.raw_alloc(seg, device)
        if not ptr:
            _native.pool_ooms += 1
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate %.2f MiB. GPU %d has a total capacity "
                "of %.2f GiB. Of the allocated memory %d bytes is allocated by PyTorch, with "
                "%d bytes allocated in private pools (e.g., CUDA Graphs)"
                % (nbytes / 2**20, device, NATIVE_TOTAL / 2**30, _native.used[device],
                   _native.pool_allocated[device]))
        _native.pool_reserved[device] += seg
        return self._hand(ptr, seg, nbytes, device)

    def _hand(self, ptr, seg, nbytes, device):
        self.sizes[ptr] = (seg, nbytes, device)
        _native.pool_allocated[device] += nbytes
        return ptr

    def release(self, ptr, nbytes, device):
        seg, n, dev = self.sizes.pop(ptr)
        _native.pool_allocated[dev] -= n
        self.cached.append((ptr, seg, dev))

    def release_cached(self):
        for ptr, seg, dev in self.cached:
            if self._allocator is not None:
                self._allocator.raw_delete(ptr, seg, dev)
            _native.pool_reserved[dev] -= seg
        self.cached = []


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    """The calling thread's allocations come from `pool` inside (PyTorch
    filters by thread: other threads allocate as before)."""
    torch.calls.append(("cuda.memory.use_mem_pool", (pool, device)))
    if _current is not None:
        raise RuntimeError("MemPool needs the native caching allocator "
                           "(a pluggable allocator is installed)")
    prev = getattr(_tls, "pool", None)
    _tls.pool = pool
    try:
        yield
    finally:
        _tls.pool = prev


def change_current_allocator(allocator):
    global _current
    torch.calls.append(("cuda.memory.change_current_allocator", (allocator,)))
    if _initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    _current = allocator


def _active():
    global _initialized
    _initialized = True
    if _current is not None:
        return _current
    pool = getattr(_tls, "pool", None)
    return pool if pool is not None else _native


def mem_get_info(device=None):
    """The whole pretend GPU, as cudaMemGetInfo sees it."""
    torch.calls.append(("cuda.memory.mem_get_info", (device,)))
    d = torch.cuda._index(device)
    return NATIVE_TOTAL - _native.used[d], NATIVE_TOTAL


def memory_stats(device=None):
    """The native allocator's figures; a pluggable allocator has none:
    PyTorch's getDeviceStats raises there."""
    torch.calls.append(("cuda.memory.memory_stats", (device,)))
    if _current is not None:
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats. "
                           "If you need it, please file an issue describing your use case.")
    d = torch.cuda._index(device)
    return {"allocated_bytes.all.current": _native.used[d] + _native.pool_allocated[d],
            "allocated_bytes.all.peak": _native.peak[d],
            "reserved_bytes.all.current": _native.used[d] + _native.pool_reserved[d],
            "reserved_bytes.all.peak": _native.peak[d],
            "num_ooms": _native.pool_ooms}


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    torch.calls.append(("cuda.memory.reset_peak_memory_stats", (device,)))
    if _current is not None:
        raise RuntimeError("CUDAPluggableAllocator does not yet support resetPeakStats. "
                           "If you need it, please file an issue describing your use case.")
    d = torch.cuda._index(device)
    _native.peak[d] = _native.used[d]


def empty_cache():
    """Gives the MemPools' cached segments back to their allocators; a
    pluggable allocator without a reset function does nothing."""
    torch.calls.append(("cuda.memory.empty_cache", ()))
    if _current is None:
        for pool in _pools:
            pool.release_cached()
