"""torch.cuda.memory of the stand-in (see torch/__init__.py)."""
import ctypes

import torch

NATIVE_DEVICES = 2
NATIVE_TOTAL = 80 << 30


class _Native:
    """The pretend GPUs' own allocator: counts bytes, hands out fake addresses."""

    def __init__(self):
        self.used = [0] * NATIVE_DEVICES
        self.peak = [0] * NATIVE_DEVICES
        self.next = 0x700000000000

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

    def take(self, nbytes, device):
        # As CUDAPluggableAllocator::malloc: whatever the function returns,
        # NULL included, becomes the tensor's data pointer.
        return self._alloc(nbytes, device, None) or 0

    def release(self, ptr, nbytes, device):
        self._free(ptr, nbytes, device, None)


def change_current_allocator(allocator):
    global _current
    torch.calls.append(("cuda.memory.change_current_allocator", (allocator,)))
    if _initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    _current = allocator


def _active():
    global _initialized
    _initialized = True
    return _current if _current is not None else _native


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
    return {"allocated_bytes.all.current": _native.used[d],
            "allocated_bytes.all.peak": _native.peak[d],
            "reserved_bytes.all.current": _native.used[d],
            "reserved_bytes.all.peak": _native.peak[d]}


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
    """Nothing to give back natively here; a pluggable allocator without a
    reset function does nothing either."""
    torch.calls.append(("cuda.memory.empty_cache", ()))
