"""torch.cuda.memory of the stand-in (see torch/__init__.py)."""
import ctypes

import torch

NATIVE_DEVICES = 2
NATIVE_TOTAL = 80 << 30


class _Native:
    """The pretend GPUs' own allocator: counts bytes, hands out fake addresses."""

    def __init__(self):
        self.used = [0] * NATIVE_DEVICES
        self.next = 0x700000000000

    def take(self, nbytes, device):
        if self.used[device] + nbytes > NATIVE_TOTAL:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (native)")
        self.used[device] += nbytes
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
        ptr = self._alloc(nbytes, device, None)
        if not ptr and nbytes > 0:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory: the pluggable allocator returned NULL for %d bytes" % nbytes)
        return ptr

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
