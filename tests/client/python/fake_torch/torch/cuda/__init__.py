"""torch.cuda of the stand-in (see torch/__init__.py)."""
import torch

from . import memory

_current = 0


class OutOfMemoryError(RuntimeError):
    pass


class Stream:
    """A pretend CUDA stream; cuda_stream is its cudaStream_t as an int."""
    _next = 0x5000

    def __init__(self):
        Stream._next += 0x10
        self.cuda_stream = Stream._next


def _index(device):
    if device is None or device == "cuda":
        return _current
    if isinstance(device, int):
        return device
    if isinstance(device, str) and device.startswith("cuda:"):
        return int(device[5:])
    raise RuntimeError("not a CUDA device: %r" % (device,))


def current_device():
    torch.calls.append(("cuda.current_device", ()))
    return _current


def set_device(d):
    global _current
    torch.calls.append(("cuda.set_device", (d,)))
    _current = d


def device_count():
    return memory.NATIVE_DEVICES


def synchronize(device=None):
    torch.calls.append(("cuda.synchronize", (device,)))


mem_get_info = memory.mem_get_info
memory_stats = memory.memory_stats
memory_allocated = memory.memory_allocated
max_memory_allocated = memory.max_memory_allocated
memory_reserved = memory.memory_reserved
max_memory_reserved = memory.max_memory_reserved
reset_peak_memory_stats = memory.reset_peak_memory_stats
empty_cache = memory.empty_cache
MemPool = memory.MemPool
use_mem_pool = memory.use_mem_pool
