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

The client is the library's process-wide one (configured from the
environment, like the allocator: GPUMEMD_SOCKET, GPUMEM_PLACEMENT, ...), and
device ordinals are this process's, mapped to the daemon's devices by UUID
under CUDA_VISIBLE_DEVICES as the allocator maps them.
"""
import ctypes
import threading

import gpumem
from gpumem import _lib

_lock = threading.Lock()
_enabled = None  # (torch module, the allocator object)


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
        _enabled = (torch, alloc)
        return alloc


def enabled():
    return _enabled is not None


def _ordinal(device):
    if device is None:
        torch = _enabled[0] if _enabled is not None else None
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
