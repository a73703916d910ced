"""gpumem.torch: PyTorch's CUDA memory from gpumemd, sized to the tenant.

    import gpumem.torch
    gpumem.torch.enable()        # before PyTorch allocates any CUDA memory
    x = torch.empty(1 << 20, device="cuda")     # served by gpumemd
    free, total = torch.cuda.mem_get_info()     # the tenant's budget

enable() does three things:
  * installs libgpumem.so.1 (the very file this package loads, see
    gpumem.library_path()) as PyTorch's pluggable allocator
    (torch.cuda.memory.CUDAPluggableAllocator with gpumem_torch_malloc /
    gpumem_torch_free), so every CUDA tensor is memory of the caller's
    tenant, served by the library's caching pool;
  * replaces torch.cuda.mem_get_info (and torch.cuda.memory.mem_get_info)
    with mem_get_info() below, so code that sizes itself from it (vLLM's KV
    cache, "total * utilization - used") sees what the tenant may take: total
    is the device capped by the tenant's quotas, free what is left under
    them and on the device (client/lib/tenant_budget.h has the rule). Code that
    did `from torch.cuda import mem_get_info` before enable() keeps the old
    function: call enable() first;
  * makes Tensor.record_stream (which PyTorch drops under a pluggable
    allocator) reach the library: a tensor recorded on another stream is
    reused only after all the device's queued work, that stream's included;
  * replaces torch.cuda's memory_stats, memory_allocated,
    max_memory_allocated, memory_reserved, max_memory_reserved,
    reset_peak_memory_stats and empty_cache (PyTorch's raise or do nothing
    under a pluggable allocator) with the functions below, which answer
    from the library: what PyTorch allocated through it, what the process
    holds from gpumemd, and the refusals (num_ooms).

A refusal (the tenant's quota, a full device) is a NULL answer, and
PyTorch's pluggable allocator does not check it: the tensor gets data
pointer 0 and its first kernel faults. Size the work from mem_get_info()
so that it fits; memory_stats()["num_ooms"] counts the refusals.

Where a refusal must be an exception, use the pool route instead of
enable() (the two exclude each other):

    pool = gpumem.torch.mem_pool()
    with gpumem.torch.use_mem_pool(pool):
        x = torch.empty(1 << 30, device="cuda")   # from gpumemd
    # a refusal inside raised torch.OutOfMemoryError, gpumemd's reason last

mem_pool() is a torch.cuda.MemPool whose segments gpumemd serves: PyTorch's
own caching allocator carves tensors from them, so its stream-ordered
reuse, record_stream, CUDA graph pools and memory_stats() stay PyTorch's,
and it turns a NULL segment into torch.OutOfMemoryError (after giving its
cached segments back and trying once more), as it does for cudaMalloc.
use_mem_pool() routes the calling thread's allocations there (PyTorch's
use_mem_pool: other threads, such as autograd's, allocate natively) and
appends gpumemd's reason to that error as it leaves the block;
last_refusal() gives the reason to code that catches the error inside.
mem_pool() also installs the tenant-budget mem_get_info(), and makes
torch.cuda.empty_cache() give the library's idle memory back to gpumemd
after PyTorch's own.

The client is the library's process-wide one (configured from the
environment, like the allocator: GPUMEMD_SOCKET, GPUMEM_PLACEMENT, ...), and
device ordinals are this process's, mapped to the daemon's devices by UUID
under CUDA_VISIBLE_DEVICES as the allocator maps them.
"""
import contextlib
import ctypes
import threading

import gpumem
from gpumem import _lib

_lock = threading.Lock()
_enabled = None  # (torch module, the allocator object)
_pooled = None   # (torch module, the allocator object) of the pool route


def enable(torch=None):
    """Installs the allocator and the budget-aware mem_get_info; returns the
    CUDAPluggableAllocator. Calling it again returns the same one. Raises
    RuntimeError (PyTorch's words kept) when PyTorch already allocated CUDA
    memory, and changes nothing then."""
    global _enabled
    if torch is None:
        import torch  # noqa: WPS433 - PyTorch is the caller's
    with _lock:
        if _enabled is not None and _enabled[0] is torch:
            return _enabled[1]
        if _pooled is not None and _pooled[0] is torch:
            raise RuntimeError(
                "gpumem.torch.enable() after gpumem.torch.mem_pool(): the pool route "
                "keeps PyTorch's own allocator; use one route per process")
        path = _lib.path()
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            path, "gpumem_torch_malloc", "gpumem_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError(
                "gpumem.torch.enable() must run before PyTorch allocates CUDA memory "
                "(PyTorch said: %s)" % e) from e
        for name, fn in _REPLACED.items():
            setattr(torch.cuda, name, fn)
            setattr(torch.cuda.memory, name, fn)
        torch.Tensor.record_stream = _record_stream_of(torch.Tensor.record_stream)
        _enabled = (torch, alloc)
        return alloc


def enabled():
    return _enabled is not None


def _record_stream_of(native):
    """Tensor.record_stream under enable(): PyTorch's (its checks; under a
    pluggable allocator it records nothing), then the library's
    gpumem_torch_record_stream on the tensor's block, so the block's free
    waits for the device's work, the side stream's included. Memory the
    library did not hand out (another process's tensor) is left alone."""
    def record_stream(tensor, stream):
        native(tensor, stream)
        ptr = tensor.untyped_storage().data_ptr()
        if not ptr:
            return
        lib = _lib.load()
        if lib.gpumem_torch_record_stream(ptr, getattr(stream, "cuda_stream", None)):
            err = gpumem._last_error(lib)
            if not isinstance(err, gpumem.ForeignPointer):
                raise err
    record_stream.__doc__ = native.__doc__
    return record_stream


def mem_pool(device=None, torch=None):
    """A new torch.cuda.MemPool whose segments gpumemd serves (through the
    same gpumem_torch_malloc/free as enable()). `device` is accepted for
    symmetry with use_mem_pool (a pool serves whichever device allocates).
    Raises RuntimeError after enable(), or where this PyTorch has no
    MemPool (before 2.5)."""
    del device
    global _pooled
    if torch is None:
        import torch  # noqa: WPS433 - PyTorch is the caller's
    with _lock:
        if _enabled is not None and _enabled[0] is torch:
            raise RuntimeError(
                "gpumem.torch.mem_pool() after gpumem.torch.enable(): every tensor "
                "already comes from gpumemd through the pluggable allocator; use one "
                "route per process")
        pool_type = getattr(torch.cuda, "MemPool", None)
        if pool_type is None:
            raise RuntimeError(
                "gpumem.torch.mem_pool() needs torch.cuda.MemPool (PyTorch 2.5 or later); "
                "this PyTorch is %s" % getattr(torch, "__version__", "unknown"))
        if _pooled is None or _pooled[0] is not torch:
            alloc = torch.cuda.memory.CUDAPluggableAllocator(
                _lib.path(), "gpumem_torch_malloc", "gpumem_torch_free")
            torch.cuda.mem_get_info = mem_get_info
            torch.cuda.memory.mem_get_info = mem_get_info
            native_empty_cache = torch.cuda.memory.empty_cache

            def pooled_empty_cache():
                """PyTorch's empty_cache (its pools' idle segments go back
                to the library), then the library's idle memory to gpumemd."""
                native_empty_cache()
                empty_cache()
            torch.cuda.empty_cache = pooled_empty_cache
            torch.cuda.memory.empty_cache = pooled_empty_cache
            _pooled = (torch, alloc)
        return pool_type(_pooled[1].allocator())


def _refusals(ordinal):
    try:
        return _figures(ordinal).refusals
    except gpumem.Error:
        return None


@contextlib.contextmanager
def use_mem_pool(pool=None, device=None):
    """PyTorch's use_mem_pool over a gpumemd pool (a new one when None):
    inside, the calling thread's CUDA tensors come from gpumemd, and a
    refusal raises torch.OutOfMemoryError; one that leaves the block
    carries gpumemd's reason at the end of its message. Yields the pool."""
    if pool is None:
        pool = mem_pool()
    torch = _pooled[0]
    ordinal = _ordinal(device)
    before = _refusals(ordinal)
    with torch.cuda.use_mem_pool(pool, device):
        try:
            yield pool
        except torch.cuda.OutOfMemoryError as e:
            reason = last_refusal()
            after = _refusals(ordinal)
            if before is None or after is None or after == before or not reason:
                raise
            raise type(e)("%s\ngpumemd: %s" % (e, reason)) from e


def last_refusal():
    """Why the calling thread's last PyTorch allocation from gpumemd was
    refused (gpumemd's words, e.g. the tenant's quota), or "" if none was."""
    msg = _lib.load().gpumem_torch_last_refusal()
    return msg.decode("utf-8", "replace") if msg else ""




def _ordinal(device):
    if device is None:
        route = _enabled if _enabled is not None else _pooled
        torch = route[0] if route is not None else None
        return torch.cuda.current_device() if torch is not None else 0
    if isinstance(device, bool):
        raise gpumem.InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                     "device %r is not a CUDA device" % (device,))
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            raise gpumem.InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                         "device %r is not a CUDA device" % (device,))
        return int(index) if index else _ordinal(None)
    kind = getattr(device, "type", None)
    if kind == "cuda":
        index = getattr(device, "index", None)
        return int(index) if index is not None else _ordinal(None)
    raise gpumem.InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                 "device %r is not a CUDA device" % (device,))


def mem_get_info(device=None):
    """(free, total) bytes for this process's CUDA ordinal `device` (None:
    the current device), as the caller's tenant may use it."""
    ordinal = _ordinal(device)
    if ordinal < 0:
        raise gpumem.InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                     "device ordinal %d is negative" % ordinal)
    lib = _lib.load()
    free = ctypes.c_size_t()
    total = ctypes.c_size_t()
    if lib.gpumem_torch_mem_get_info(ordinal, ctypes.byref(free), ctypes.byref(total)):
        raise gpumem._last_error(lib)
    return free.value, total.value


class _TorchStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
        "allocations", "frees", "refusals", "graph_held_bytes")]


def _figures(device):
    ordinal = _ordinal(device)
    if ordinal < 0:
        raise gpumem.InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                     "device ordinal %d is negative" % ordinal)
    lib = _lib.load()
    st = _TorchStats()
    if lib.gpumem_torch_memory_stats(ordinal, ctypes.byref(st)):
        raise gpumem._last_error(lib)
    return st


def memory_stats(device=None):
    """torch.cuda.memory_stats()'s keys that the library can answer truly,
    for this process's ordinal `device` (None: the current device): bytes
    are "allocated" (in tensors; "active" is the same), "reserved" (held
    from gpumemd); counts are allocations, frees and refusals (num_ooms)."""
    st = _figures(device)
    out = {}
    for kind in ("allocated_bytes", "active_bytes"):
        out[kind + ".all.current"] = st.allocated_bytes
        out[kind + ".all.peak"] = st.allocated_bytes_peak
    out["reserved_bytes.all.current"] = st.reserved_bytes
    out["reserved_bytes.all.peak"] = st.reserved_bytes_peak
    out["allocation.all.allocated"] = st.allocations
    out["allocation.all.freed"] = st.frees
    out["allocation.all.current"] = st.allocations - st.frees
    out["num_ooms"] = st.refusals
    out["num_alloc_retries"] = 0
    return dict(sorted(out.items()))


def memory_allocated(device=None):
    return _figures(device).allocated_bytes


def max_memory_allocated(device=None):
    return _figures(device).allocated_bytes_peak


def memory_reserved(device=None):
    return _figures(device).reserved_bytes


def max_memory_reserved(device=None):
    return _figures(device).reserved_bytes_peak


def reset_peak_memory_stats(device=None):
    lib = _lib.load()
    if lib.gpumem_torch_reset_peak_memory_stats(_ordinal(device)):
        raise gpumem._last_error(lib)


def empty_cache():
    """Gives what this process holds unused back to gpumemd."""
    lib = _lib.load()
    if lib.gpumem_torch_empty_cache():
        raise gpumem._last_error(lib)


_REPLACED = {
    "mem_get_info": mem_get_info,
    "memory_stats": memory_stats,
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "empty_cache": empty_cache,
}
