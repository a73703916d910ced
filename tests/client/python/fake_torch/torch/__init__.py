"""A stand-in for PyTorch (which cannot be installed here) with the parts
gpumem.torch and vLLM-style sizing code touch, recording every call in
`torch.calls` as (name, args).

Like PyTorch: CUDAPluggableAllocator(path, alloc, free) dlopens `path` and
looks both symbols up (a missing one is an error); change_current_allocator
refuses once CUDA memory was allocated ("already initialized"); a CUDA
tensor's memory comes from the current allocator, called as PyTorch calls
it: alloc(size, device, stream) and free(ptr, size, device, stream); a NULL
answer is not checked (CUDAPluggableAllocator::malloc takes what it gets):
the tensor's data pointer is 0. The native allocator is a pretend 80 GiB GPU
per device (out of memory there is torch.cuda.OutOfMemoryError), which is
also what the native mem_get_info reports: the whole GPU, whatever the
tenant may use. memory_stats and the functions read from it answer for the
native allocator and raise under a pluggable one, as PyTorch's
getDeviceStats does; empty_cache does nothing there. torch.cuda.MemPool and
use_mem_pool model the other route: PyTorch's caching allocator carves
tensors from segments a MemPool's allocator serves (raw_alloc), and a NULL
segment is torch.OutOfMemoryError (memory.py says how).
"""
calls = []

from . import cuda  # noqa: E402

OutOfMemoryError = cuda.OutOfMemoryError


class Tensor:
    def __init__(self, nbytes, device, ptr, owner):
        self.nbytes = nbytes
        self.device = device
        self._ptr = ptr
        self._owner = owner

    def data_ptr(self):
        return self._ptr

    def untyped_storage(self):
        return _Storage(self._ptr)

    def record_stream(self, stream):
        """As PyTorch under a pluggable allocator: checks the stream and
        records nothing (CUDAPluggableAllocator has no record_stream from
        Python)."""
        calls.append(("Tensor.record_stream", (self._ptr, stream)))
        if not isinstance(stream, cuda.Stream):
            raise TypeError("record_stream(): argument 'stream' must be Stream")

    def __del__(self):
        if self._owner is not None:
            self._owner.release(self._ptr, self.nbytes, self.device)
            self._owner = None


class _Storage:
    def __init__(self, ptr):
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr


def empty(nbytes, device="cuda"):
    calls.append(("empty", (nbytes, device)))
    index = cuda._index(device)
    owner = cuda.memory._active()
    ptr = owner.take(nbytes, index)
    return Tensor(nbytes, index, ptr, owner)
